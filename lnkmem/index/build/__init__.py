"""Keeping the index in step with its sources: the plan, the build, a file counted, the worker process, readahead."""
