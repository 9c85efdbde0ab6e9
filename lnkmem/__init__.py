"""lnkmem: a memory engine for Link agents.

The package is laid out by concern:

- ``lnkmem.cli``       the ``lnk-lnkmem`` program and its subcommands
- ``lnkmem.wire``      the whole wire contract as msgspec Structs
- ``lnkmem.spec``      ``$LNK_MEMORY_SPEC`` validation
- ``lnkmem.mcp``       JSON-RPC / MCP over lines (stdio or a socket)
- ``lnkmem.tools``     the four tools: schemas and behaviour
- ``lnkmem.engine``    one agent's memory: places, index, notes, indexing loop
- ``lnkmem.index``     passages, words, BM25, the LMDB store
- ``lnkmem.bridges``   places things live: a local folder, files/storage bridges
"""

__version__ = "0.1.0"
