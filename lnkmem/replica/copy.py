"""The index copy, as the rest of the engine uses it (§7.2, §7.3; docs/ARCHITECTURE.md
"The copy"): one name for each thing, from the modules that make it.

- :mod:`lnkmem.replica.manifest`: the copy's files and manifest -- names, formats, bounds;
- :mod:`lnkmem.replica.state`: the cache's state relative to the copy (version, named and
  doomed files, the copy's segments as the cache knows them);
- :mod:`lnkmem.replica.export`: what a write-back sends, one file at a time, and the state
  recorded once its manifest has landed;
- :mod:`lnkmem.replica.load`: verify and load, every file checked before anything is kept.
"""

from __future__ import annotations

from lnkmem.replica.export import (FILES_A_PAGE, MAX_COPY_SEGMENTS, PAGE_GROUP_BYTES, Export, export,
                                   written)
from lnkmem.replica.checks import FetchAhead, blob_size, reading_order, valid_ref
from lnkmem.replica.load import CHECK_POSTINGS, LOAD_STEP, Verified, damaged, load, load_copy, verify
from lnkmem.replica.manifest import (FORMAT, MANIFEST, MAX_BLOB, MAX_MANIFEST, OLD_FORMAT, PART_BYTES, CopyDamaged,
                                     Manifest, blob_name, decode_manifest, encode_manifest, is_copy_file, page_of,
                                     part_bytes, variant)
from lnkmem.replica.state import (CopyState, copy_state, dirty, forget_doomed, note_orphans, note_sent,
                                  ripe_orphans)

__all__ = [
    "CHECK_POSTINGS", "FILES_A_PAGE", "FORMAT", "LOAD_STEP", "MANIFEST", "MAX_BLOB", "MAX_COPY_SEGMENTS",
    "MAX_MANIFEST", "OLD_FORMAT", "PAGE_GROUP_BYTES", "PART_BYTES", "CopyDamaged", "CopyState", "Export",
    "Manifest", "FetchAhead", "Verified", "blob_name", "blob_size", "copy_state", "damaged", "decode_manifest",
    "dirty", "encode_manifest", "export", "forget_doomed", "is_copy_file", "load", "load_copy", "note_sent",
    "note_orphans", "page_of", "part_bytes", "reading_order", "ripe_orphans", "valid_ref", "verify", "variant",
    "written",
]
