"""The few error types the engine raises on purpose.

Each carries a message meant for whoever gave the bad input: one line,
naming what was wrong, never a secret.
"""


class UsageError(Exception):
    """Bad arguments or a bad environment: the CLI prints it and exits 2."""


class ToolError(Exception):
    """A tool call that cannot be done: answered ``isError: true``."""


class DamagedIndex(Exception):
    """The index on disk cannot be trusted; it is rebuilt from the sources."""
