"""The words index: passages, analysis, BM25 and its LMDB store."""
