"""Bytes of what the index stores: posting lists, passages' text, the snapshot's refs."""
