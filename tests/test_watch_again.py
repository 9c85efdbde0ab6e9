"""Issue 46: watching survives. The Home folder (or the chats or skills folder) deleted and
made again while serving was never watched again: new files were never indexed (checked
for 100 s) though `read` served them; only a restart found them. Now a watched folder that
goes away or is replaced is watched again once it is there, and what changed meanwhile is
looked at. Both watchers: watchfiles, and inotify (a Home holding a name not UTF-8)."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.helpers import Home, Server, refs, until


def hits(s, q: str) -> list:
    return refs(s.call("search", {"query": q}))


@pytest.mark.parametrize("watcher", ["watchfiles", "inotify"])
@pytest.mark.parametrize("which", ["home", "chats", "replaced"])
def test_a_watched_folder_removed_and_made_again_is_watched_again(tmp_path, which, watcher):
    home = Home(tmp_path)
    home.write("a.md", "The pangolin eats ants.\n")
    home.write("chats/t1.md", "user: where does the pangolin sleep\n")
    if watcher == "inotify":
        with open(os.fsencode(home.folder) + b"/odd\xff.md", "wb") as f:
            f.write(b"The odd name.\n")
    with Server.start(home, env={"LNKMEM_LOG": "info"}) as s:
        s.initialize()
        assert until(lambda: "home/a.md" in hits(s, "pangolin"), timeout=30)
        folder = home.agent / "chats" if which == "chats" else home.folder
        if which == "replaced":  # moved away, another folder put in its place
            os.rename(folder, tmp_path / "old-home")
        else:
            shutil.rmtree(folder)
        # the engine saw it go (its watch of it ended) before it is made again
        assert until(lambda: b"a watched folder was removed or replaced" in s.stderr, timeout=30), s.stderr[-2000:]
        folder.mkdir()
        rel = "chats/t2.md" if which == "chats" else "b.md"
        home.write(rel, "The aardvark digs at night.\n" if which != "chats" else "user: the aardvark digs at night\n")
        ref = rel if which == "chats" else "home/" + rel
        assert until(lambda: ref in hits(s, "aardvark"), timeout=20), s.stderr[-2000:]
        # and it stays watched: another file, later
        home.write(rel.replace("2", "3").replace("b.md", "c.md"), "The okapi hides in the forest.\n")
        assert until(lambda: len(hits(s, "okapi")) == 1, timeout=20)
        assert s.close() == 0
