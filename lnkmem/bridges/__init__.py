"""Places things live: a local folder, a files bridge, a storage bridge.

Every source the engine reads (Home, conversations, skills, notes) and every
place it writes (notes, the index copy) is a :class:`~lnkmem.bridges.place.Place`;
session code never knows which kind it has.
"""

import sys

# httpx imports its own command-line client (``httpx._main``) wherever click, rich and
# pygments are installed (beside the test tools, say): ~60 ms of CPU at the start of every
# process that talks to a bridge or a model, for a client the engine never runs. Marked
# absent before any module here imports httpx, so httpx takes its fallback (docs/BENCHMARKS.md
# "Process starts"); a process that imported it already keeps what it has.
sys.modules.setdefault("httpx._main", None)
