"""The environment the engine sets for its own processes, and the one it hands to others'.

numpy's OpenBLAS starts a thread for each core when it loads, and each of those threads
spins on its core before it sleeps (~70 ms of CPU at every start of a process that
imports numpy, docs/BENCHMARKS.md "Process starts"). The engine calls no BLAS routine
(``index/rank/vectors.py`` takes its dot products in the calling thread), so those
threads only cost. The program sets :data:`OWN` before numpy loads, where the person who
started it has not set the name themselves; its own Python children get it too
(``index/child.child_env``). A program of someone else's that the engine runs (a store
driver, ``bridges/store_driver.driver_env``) gets the environment the engine was started
with: :func:`for_others` leaves out what :func:`set_for_self` added.
"""

from __future__ import annotations

import os
from typing import Mapping

OWN: Mapping[str, str] = {"OPENBLAS_NUM_THREADS": "1"}
_added: set[str] = set()  # the names set_for_self added (not the starter's own)


def set_for_self() -> None:
    """:data:`OWN` into this process's environment, each name its starter left unset;
    before numpy is imported (OpenBLAS reads it when it loads)."""
    for name, value in OWN.items():
        if name not in os.environ:
            os.environ[name] = value
            _added.add(name)


def for_others(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``environ`` as it was before :func:`set_for_self`: for programs that are not ours."""
    return {k: v for k, v in environ.items() if k not in _added}
