"""An index is wiped and made anew only when its files are damaged: never because this
process cannot open it now (open already in this process, out of descriptors), which
says nothing of what it holds. Each case: the index answers as before afterwards."""

import os
import subprocess
import sys
import random
import textwrap

import pytest

from lnkmem.index.rank.search import bm25
from lnkmem.index.commit import Batch
from lnkmem.index.store import IndexInUse, Store
from tests.helpers import random_file

WORDS = [f"w{i}" for i in range(30)] + ["pangolin"]


def _index_forty_files(path: str) -> int:
    rng = random.Random(5)
    st = Store.open(path)
    try:
        st.commit(Batch(files=[random_file(rng, f"home/f{j}.md", "v1", WORDS, None, (3, 9)) for j in range(40)]))
        return st.live_count()
    finally:
        st.close()


def _answers(path: str) -> tuple[int, int]:
    st = Store.open(path)
    try:
        assert st.rebuilt_because is None, st.rebuilt_because
        return st.live_count(), len(bm25(st, "pangolin", 100))
    finally:
        st.close()


def test_an_index_open_in_this_process_is_refused_a_second_time_never_wiped(tmp_path):
    path = str(tmp_path / "index")
    live = _index_forty_files(path)
    before = _answers(path)
    assert before[0] == live and before[1] > 0
    st = Store.open(path)
    try:
        with pytest.raises(IndexInUse, match="already open in this process"):
            Store.open(path)
        with pytest.raises(IndexInUse):
            Store.open(os.path.join(str(tmp_path), ".", "index"))  # the same folder by another name
        assert len(bm25(st, "pangolin", 100)) == before[1]  # the first keeps answering
        assert st.damaged is None
    finally:
        st.close()
    assert _answers(path) == before  # and the index is as it was


def test_an_index_that_cannot_be_opened_for_want_of_descriptors_is_kept(tmp_path):
    """A process out of file descriptors (many agents in one serve-many, say) gets an
    error for that open; the index on disk stays whole for the next one."""
    path = str(tmp_path / "index")
    _index_forty_files(path)
    before = _answers(path)
    child = textwrap.dedent("""
        import os, resource, sys
        from lnkmem.index.store import Store
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        held = []
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        os.close(held.pop())  # one left: not enough for data.mdb, lock.mdb and the checks
        try:
            Store.open(sys.argv[1])
        except Exception as e:  # (lmdb's "Too many open files", or the OSError of a check)
            print("refused", type(e).__name__, e)
        else:
            print("opened")
    """)
    r = subprocess.run([sys.executable, "-c", child, path], capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("refused"), (r.stdout, r.stderr[-2000:])
    assert _answers(path) == before


def test_a_fifo_in_place_of_data_mdb_is_damage_never_a_hang(tmp_path):
    """Opening the header check's file never waits on a FIFO: it is no data.mdb, so the
    index is made anew (in a child, so that a hang fails the test instead of holding it)."""
    path = tmp_path / "index"
    _index_forty_files(str(path))
    os.unlink(path / "data.mdb")
    os.mkfifo(path / "data.mdb")
    child = "import sys\nfrom lnkmem.index.store import Store\n" \
            "st = Store.open(sys.argv[1])\nprint(st.opened_as, st.rebuilt_because)\nst.close()\n"
    try:
        r = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True, text=True, timeout=60,
                           cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    except subprocess.TimeoutExpired:
        pytest.fail("opening an index whose data.mdb is a FIFO hung")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[0] == "new" and "not a file" in r.stdout, r.stdout
    assert (path / "data.mdb").is_file()


def test_a_folder_in_place_of_data_mdb_is_damage_and_made_anew(tmp_path):
    path = tmp_path / "index"
    _index_forty_files(str(path))
    os.unlink(path / "data.mdb")
    (path / "data.mdb").mkdir()
    (path / "data.mdb" / "x").write_text("not an index")
    st = Store.open(str(path))
    try:
        assert st.opened_as == "new" and st.rebuilt_because, st.rebuilt_because
        assert st.live_count() == 0
    finally:
        st.close()
    assert (path / "data.mdb").is_file()
