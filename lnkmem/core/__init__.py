"""The bottom layer: errors, knobs, helper processes, the allocator, asyncio helpers and the wire contract's types. Imports nothing of lnkmem."""
