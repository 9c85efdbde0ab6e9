"""Merging segments: the run of one merge, the policy that picks them, the reading of their postings."""
