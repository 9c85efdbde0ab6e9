"""The copy of an index kept behind the storage bridge: attach, re-check and write-back (above the index, below a memory)."""
