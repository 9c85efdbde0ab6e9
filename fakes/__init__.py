"""Stand-ins for Link's side of the lnkmem wire contract (PROTOCOL.md).

Servers, each run as ``python -m fakes.<name> ...`` and printing one line
``{"ready": true, "listen": "..."}`` once it listens:

- ``fakes.embedding_server``: the embedding endpoint (PROTOCOL.md §6);
- ``fakes.files_bridge``: the files bridge (§8.1, §8.2);
- ``fakes.storage_bridge``: the storage bridge (§8.1, §8.3).

Tools:

- ``fakes.connect``: ``lnk agent memory connect``'s part: first line, then pipe;
- ``fakes.lnk_documents`` and ``fakes/bin/lnk-documents``: the document converter;
- ``fakes.harness``: start a fake from a test and talk to it (stdlib only).

Shared pieces: ``fakes.http`` (HTTP/1.1 server core, request log, faults),
``fakes.auth`` (Link-Binding proofs), ``fakes.store`` (versioned file trees),
``fakes.bridge`` (what both bridges share: config, authentication, CLI).

Everything here uses the standard library only.
"""
