"""Ranking: BM25 over the postings, vectors (exact and approximate), their fusion."""
