"""lnkmem: a memory engine for Link agents.

The package is laid out in layers; each imports only the ones before it in
this list (kept by import-linter: ``make lint``):

- ``lnkmem.core``      errors, knobs, helper processes, the allocator, asyncio helpers, the wire contract's types
- ``lnkmem.bridges``   places things live: a local folder, files/storage bridges, ignore rules
- ``lnkmem.index``     passages, words, BM25, the LMDB store, the copy's format
- ``lnkmem.replica``   the copy behind the storage bridge: attach, re-check, write-back
- ``lnkmem.memory``    one agent's memory: folders, indexing loop, notes, changes, embeddings
- ``lnkmem.protocol``  JSON-RPC / MCP for one session and the four tools
- ``lnkmem.serve``     transports: stdio, serve-many, Bound and team bindings
- ``lnkmem.cli``       the ``lnk-lnkmem`` program and its subcommands
"""

__version__ = "0.1.0"
