"""The fakes of Link's side work over their real sockets (see fakes/)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import httpx
import pytest

from fakes import auth
from fakes.embedding_server import SYNONYMS, cosine
from fakes.harness import REPO, FakeServer, fake_env
from fakes.lnk_documents import make_docx, make_pdf

KEY = "0123456789abcdef" * 4
OTHER_KEY = "fedcba9876543210" * 4


def client(server: FakeServer) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=server.socket_path), base_url="http://fake", timeout=5)


def proved(purpose: str, agent: str = "a1", owner: str = "o1", key: str = KEY) -> dict[str, str]:
    return {"Authorization": auth.header(key, purpose, owner, agent)}


def write_json(path: Path, obj: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


@pytest.fixture
def short_tmp():
    # Unix socket paths must stay under ~100 bytes; pytest's tmp paths may not.
    with tempfile.TemporaryDirectory(prefix="fk") as d:
        yield Path(d)


# ---------------------------------------------------------------- embedding


@pytest.fixture
def embedder(short_tmp):
    bindings = short_tmp / "bindings.json"
    write_json(bindings, {"a1": {"owner": "o1", "key": KEY}})
    with FakeServer.start("fakes.embedding_server", "--unix", short_tmp / "e.sock", "--bindings", bindings,
                          "--log", short_tmp / "e.log") as server:
        server.bindings = bindings
        server.log_path = short_tmp / "e.log"
        yield server


def embed(c: httpx.Client, texts: list[str], headers: dict[str, str]) -> list[list[float]]:
    r = c.post("/v1/embeddings", json={"model": "fake-mini", "input": texts}, headers=headers)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "fake-mini" and [d["index"] for d in body["data"]] == list(range(len(texts)))
    return [d["embedding"] for d in body["data"]]


def test_embeddings_are_deterministic_and_close_for_synonyms(embedder):
    h = proved("embedding")
    with client(embedder) as c:
        a, b, far = embed(c, ["buying a car", "automobile purchase", "weather forecast for tomorrow"], h)
        assert embed(c, ["buying a car"], h)[0] == a
        assert len(a) == 64 and abs(cosine(a, a) - 1) < 1e-9
        assert cosine(a, b) > 0.9 > 0.3 > cosine(a, far)
        words = SYNONYMS["doctor"]
        x, y = embed(c, [words[0], words[1]], h)
        assert cosine(x, y) > 0.99
        assert c.post("/v1/embeddings", json={"model": "other", "input": ["x"]}, headers=h).status_code == 404
        assert c.post("/v1/embeddings", json={"model": "fake-mini", "input": ["x"] * 65}, headers=h).status_code == 400
        assert c.post("/v1/embeddings", content=b"{not json", headers=h).status_code == 400


def test_embedding_binding_is_checked(embedder):
    body = {"model": "fake-mini", "input": ["x"]}
    with client(embedder) as c:
        assert c.post("/v1/embeddings", json=body).status_code == 401
        for bad in ("Link-Binding a1:" + "A" * 64, "Link-Binding -a1:" + "a" * 64, "Bearer x"):
            assert c.post("/v1/embeddings", json=body, headers={"Authorization": bad}).status_code == 401
        assert c.post("/v1/embeddings", json=body, headers=proved("files")).status_code == 401
        assert c.post("/v1/embeddings", json=body, headers=proved("embedding")).status_code == 200
        write_json(embedder.bindings, {"a1": {"owner": "o1", "key": OTHER_KEY}})  # re-read each request
        assert c.post("/v1/embeddings", json=body, headers=proved("embedding")).status_code == 401
    text = embedder.log_path.read_text()
    assert [json.loads(line)["status"] for line in text.splitlines()][-2:] == [200, 401]
    assert KEY not in text and OTHER_KEY not in text and "Link-Binding" not in text


def test_fault_storm_then_ok(embedder):
    h = proved("embedding")
    body = {"model": "fake-mini", "input": ["x"]}
    embedder.fault("503", count=2, retry_after=3)
    with client(embedder) as c:
        first = c.post("/v1/embeddings", json=body, headers=h)
        assert first.status_code == 503 and first.headers["retry-after"] == "3"
        assert c.post("/v1/embeddings", json=body, headers=h).status_code == 503
        assert c.post("/v1/embeddings", json=body, headers=h).status_code == 200
    embedder.fault("down")  # also closes open connections such as c's, at once
    with client(embedder) as c:
        with pytest.raises(httpx.RemoteProtocolError):  # read, then closed without an answer
            c.post("/v1/embeddings", json=body, headers=h)
        embedder.fault("ok")  # /_fault still answers while down
        assert c.post("/v1/embeddings", json=body, headers=h).status_code == 200
    assert [e.get("fault") for e in embedder.log()] == ["503", "503", None, "down", None]


# ---------------------------------------------------------------- bridges


@pytest.fixture
def bridge_setup(short_tmp):
    config = short_tmp / "config.json"
    write_json(config, {
        "bindings": {"a1": {"owner": "o1", "key": KEY}, "a2": {"owner": "o1", "key": OTHER_KEY}},
        "teams": {"t1": {"folder": "teamfiles/t1", "names": {"a1": "crew", "a2": "o9/crew"},
                         "grants": {"a1": "all", "a2": "part"}}},
    })
    return short_tmp, config


@pytest.fixture
def files_bridge(bridge_setup):
    d, config = bridge_setup
    home = d / "files" / "homes" / "a1"
    (home / "docs").mkdir(parents=True)
    (home / "docs" / "plan.md").write_text("the plan")
    (d / "files" / "teamfiles" / "t1" / "memory").mkdir(parents=True)
    (d / "files" / "teamfiles" / "t1" / "memory" / "team.md").write_text("team notes")
    with FakeServer.start("fakes.files_bridge", "--unix", d / "f.sock", "--root", d / "files",
                          "--config", config) as server:
        yield server


@pytest.fixture
def storage_bridge(bridge_setup):
    d, config = bridge_setup
    chats = d / "store" / "stores" / "a1" / "conversations"
    chats.mkdir(parents=True)
    (chats / "t1.jsonl").write_text('{"role": "user", "text": "hi"}\n')
    with FakeServer.start("fakes.storage_bridge", "--unix", d / "s.sock", "--root", d / "store",
                          "--config", config) as server:
        yield server


def test_files_bridge_bind_list_read(files_bridge):
    with client(files_bridge) as c:
        r = c.post("/v1/bind", headers=proved("files"))
        assert r.status_code == 200 and r.json() == {"owner": "o1", "agent": "a1"}
        assert c.post("/v1/bind", headers=proved("storage")).status_code == 401
        assert c.post("/v1/bind", headers=proved("files", key=OTHER_KEY)).status_code == 401
        files_bridge.fault("403", count=1, path="/v1/bind")  # a bridge refusing the key outright
        assert c.post("/v1/bind", headers=proved("files")).status_code == 403
        assert c.get("/v1/list", params={"path": ""}).status_code == 401

        h = proved("files")
        entries = c.get("/v1/list", params={"path": "docs"}, headers=h).json()["entries"]
        assert [(e["path"], e["size"]) for e in entries] == [("docs/plan.md", 8)]
        r = c.get("/v1/read", params={"path": "docs/plan.md"}, headers=h)
        assert r.content == b"the plan" and r.headers["etag"] == f'"{entries[0]["version"]}"'
        again = c.get("/v1/read", params={"path": "docs/plan.md"}, headers={**h, "If-None-Match": r.headers["etag"]})
        assert again.status_code == 304
        assert c.get("/v1/read", params={"path": "docs/none.md"}, headers=h).status_code == 404
        assert c.get("/v1/read", params={"path": "../a2/x"}, headers=h).status_code == 400
        assert c.get("/v1/read", params={"path": "/etc/passwd"}, headers=h).status_code == 400

        team = c.get("/v1/list", params={"path": "memory", "folder": "crew"}, headers=h).json()["entries"]
        assert [e["path"] for e in team] == ["memory/team.md"]
        part = proved("files", agent="a2", key=OTHER_KEY)  # granted part: may still read the folder
        assert c.get("/v1/read", params={"path": "memory/team.md", "folder": "o9/crew"}, headers=part).status_code == 200
        assert c.get("/v1/list", params={"path": "", "folder": "crew"}, headers=part).status_code == 403


def test_files_bridge_conditional_writes(files_bridge):
    h = proved("files")
    p = {"path": "memory/lnkmem/copy.bin"}
    with client(files_bridge) as c:
        created = c.put("/v1/write", params=p, content=b"v1", headers={**h, "If-None-Match": "*"})
        assert created.status_code == 200
        etag = created.headers["etag"]
        assert c.put("/v1/write", params=p, content=b"v1b", headers={**h, "If-None-Match": "*"}).status_code == 412
        assert c.put("/v1/write", params=p, content=b"v2", headers={**h, "If-Match": '"stale"'}).status_code == 412
        r = c.put("/v1/write", params=p, content=b"v2", headers={**h, "If-Match": etag})
        assert r.status_code == 200 and r.headers["etag"] != etag
        assert c.get("/v1/read", params=p, headers=h).content == b"v2"
        assert c.put("/v1/write", params={"path": "docs/plan.md"}, content=b"x", headers=h).status_code == 403
        assert c.put("/v1/write", params={**p, "folder": "crew"}, content=b"x", headers=h).status_code == 403
        assert c.delete("/v1/write", params=p, headers={**h, "If-Match": etag}).status_code == 412
        assert c.delete("/v1/write", params=p, headers={**h, "If-Match": r.headers["etag"]}).status_code == 204
        files_bridge.fault("412", count=1)  # a race: the next conditional write loses
        assert c.put("/v1/write", params=p, content=b"v3", headers={**h, "If-None-Match": "*"}).status_code == 412
        assert c.put("/v1/write", params=p, content=b"v3", headers={**h, "If-None-Match": "*"}).status_code == 200
    log = files_bridge.log()
    assert log[0]["if_none_match"] == "*" and log[0]["etag"] == etag and log[0]["size"] == 2
    assert all("authorization" not in json.dumps(e).lower() for e in log)


def test_storage_bridge(storage_bridge):
    h = proved("storage")
    with client(storage_bridge) as c:
        assert c.post("/v1/bind", headers=h).json() == {"owner": "o1", "agent": "a1"}
        assert c.post("/v1/bind", headers=proved("files")).status_code == 401
        entries = c.get("/v1/c/conversations", params={"prefix": ""}, headers=h).json()["entries"]
        assert [e["name"] for e in entries] == ["t1.jsonl"]
        r = c.get("/v1/c/conversations/t1.jsonl", headers=h)
        assert r.status_code == 200 and c.get("/v1/c/conversations/t1.jsonl",
                                              headers={**h, "If-None-Match": r.headers["etag"]}).status_code == 304
        assert c.put("/v1/c/conversations/t1.jsonl", content=b"x", headers=h).status_code == 403
        assert c.put("/v1/c/memory/other.md", content=b"x", headers=h).status_code == 403
        assert c.put("/v1/c/memory/notes.md", content=b"- a\n", headers=h).status_code == 200
        new = c.put("/v1/c/memory/lnkmem/v/meta.json", content=b"{}", headers={**h, "If-None-Match": "*"})
        assert new.status_code == 200
        assert c.put("/v1/c/memory/lnkmem/v/meta.json", content=b"{ }",
                     headers={**h, "If-Match": '"nope"'}).status_code == 412
        listed = c.get("/v1/c/memory", params={"prefix": "lnkmem/"}, headers=h).json()["entries"]
        assert [(e["name"], f'"{e["version"]}"') for e in listed] == [("lnkmem/v/meta.json", new.headers["etag"])]

        team = "/v1/teams/t1/c/memory/lnkmem/copy"
        assert c.put(team, content=b"t", headers={**h, "If-None-Match": "*"}).status_code == 200
        assert c.get(team, headers=h).content == b"t"
        part = proved("storage", agent="a2", key=OTHER_KEY)
        assert c.get(team, headers=part).status_code == 403
        assert c.get("/v1/teams/t9/c/memory", headers=h).status_code == 403


def _raw_get(server: FakeServer, target: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """GET ``target`` exactly as given (no client between to encode or strip it): (status, body)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(server.socket_path)
        s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: fake\r\nConnection: close\r\n"
                  + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items()) + b"\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def test_bridges_decode_a_request_target_once_as_a_server_does(bridge_setup, storage_bridge, files_bridge):
    """§8 names travel percent-encoded: each bridge decodes the path and the query exactly
    once (``%25`` is a ``%``, never decoded again; ``+`` is itself in a path and a space in
    a query), and refuses (400) a target no client may send: a raw ``#``, space or non-ASCII
    byte, a ``%`` not followed by two hex digits, an escape that is not UTF-8."""
    d, _ = bridge_setup
    chats = d / "store" / "stores" / "a1" / "conversations"
    for name, text in {"c%3.jsonl": "three", "c%253.jsonl": "two-five-three", "c#1 \u00e9+.jsonl": "hash"}.items():
        (chats / name).write_text(text)
    docs = d / "files" / "homes" / "a1" / "docs"
    (docs / "c%3 +#?.md").write_text("files three")
    (docs / "c%253.md").write_text("files two-five-three")
    h = proved("storage")

    def get(target: bytes):
        return _raw_get(storage_bridge, target, h)

    assert get(b"/v1/c/conversations/c%25253.jsonl") == (200, b"two-five-three")
    assert get(b"/v1/c/conversations/c%253.jsonl") == (200, b"three")  # decoded once: the name c%3.jsonl
    assert get(b"/v1/c/conversations/c%231%20%C3%A9%2B.jsonl") == (200, b"hash")
    assert get(b"/v1/c/conversations/c%231%20%C3%A9+.jsonl") == (200, b"hash")  # "+" in a path is itself
    for prefix in (b"c%231%20%C3%A9%2B", b"c%231+%C3%A9%2B"):  # in a query "+" is a space
        status, body = get(b"/v1/c/conversations?prefix=" + prefix)
        assert status == 200 and [e["name"] for e in json.loads(body)["entries"]] == ["c#1 \u00e9+.jsonl"]
    status, body = get(b"/v1/c/conversations?prefix=c%2525")
    assert status == 200 and [e["name"] for e in json.loads(body)["entries"]] == ["c%253.jsonl"]
    for bad in (b"/v1/c/conversations/c%3.jsonl", b"/v1/c/conversations/c#1.jsonl", b"/v1/c/conversations/c%zz",
                "/v1/c/conversations/caf\u00e9.jsonl".encode(), b"/v1/c/conversations/c%FF.jsonl",
                b"/v1/c/conversations?prefix=%zz", b"/v1/c/conversations?prefix=%FF", b"/v1/c/conversations?prefix=a#b"):
        assert get(bad)[0] == 400, bad
    fh = proved("files")
    assert _raw_get(files_bridge, b"/v1/read?path=docs%2Fc%253%20%2B%23%3F.md", fh) == (200, b"files three")
    assert _raw_get(files_bridge, b"/v1/read?path=docs/c%25253.md", fh) == (200, b"files two-five-three")
    assert _raw_get(files_bridge, b"/v1/read?path=docs/c%253+%2B%23%3F.md", fh) == (200, b"files three")
    assert _raw_get(files_bridge, b"/v1/read?path=docs/c%3 +#?.md", fh)[0] == 400
    assert _raw_get(files_bridge, b"/v1/read?path=docs/c%3.md", fh)[0] == 400
    status, body = _raw_get(files_bridge, b"/v1/list?path=docs", fh)
    assert sorted(e["path"] for e in json.loads(body)["entries"]) == ["docs/c%253.md", "docs/c%3 +#?.md", "docs/plan.md"]


# ---------------------------------------------------------------- connect


def test_connect_pipes_after_ok(short_tmp):
    path = str(short_tmp / "engine.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(2)
    first_lines = []

    def engine() -> None:  # answers the first line, then echoes lines upper-cased
        for _ in range(2):
            conn, _ = listener.accept()
            with conn, conn.makefile("rwb") as f:
                first = json.loads(f.readline())
                first_lines.append(first)
                if first.get("agent") != "a1":
                    f.write(b'{"error": "unknown agent"}\n')
                    f.flush()
                    continue
                f.write(b'{"ok": true}\n')
                f.flush()
                for line in f:
                    f.write(line.upper())
                    f.flush()

    threading.Thread(target=engine, daemon=True).start()
    run = [sys.executable, "-m", "fakes.connect", path]
    ok = subprocess.run(run + ["--hello", "a1"], input=b"ping\npong\n", capture_output=True, timeout=5,
                        cwd=REPO, env=fake_env())
    assert ok.returncode == 0 and ok.stdout == b"PING\nPONG\n"
    refused = subprocess.run(run + ["--line", '{"agent": "zz"}'], input=b"", capture_output=True, timeout=5,
                             cwd=REPO, env=fake_env())
    assert refused.returncode == 1 and b"unknown agent" in refused.stderr
    assert first_lines == [{"agent": "a1"}, {"agent": "zz"}]
    listener.close()


# ---------------------------------------------------------------- lnk-documents


def test_lnk_documents(tmp_path):
    (tmp_path / "page.html").write_text("<html><head><style>p{}</style></head><body><h1>Title</h1>"
                                        "<p>Caf&eacute; <b>menu</b></p><script>x()</script></body></html>")
    (tmp_path / "memo.docx").write_bytes(make_docx("First paragraph\nSecond & last"))
    (tmp_path / "report.pdf").write_bytes(make_pdf("Quarterly (draft) report\nRevenue grew"))
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4 truncated")
    (tmp_path / "notes.xyz").write_text("x")
    env = {**os.environ, "PATH": f"{REPO / 'fakes' / 'bin'}{os.pathsep}{os.environ['PATH']}"}

    def text(name: str) -> subprocess.CompletedProcess:
        return subprocess.run(["lnk-documents", "text", str(tmp_path / name)], capture_output=True, env=env, timeout=5)

    assert text("page.html").stdout.decode() == "Title\n\nCafé menu\n"
    assert text("memo.docx").stdout.decode() == "First paragraph\nSecond & last\n"
    assert text("report.pdf").stdout.decode() == "Quarterly (draft) report\nRevenue grew\n"
    for bad in ("broken.pdf", "notes.xyz"):
        result = text(bad)
        assert result.returncode == 1 and result.stdout == b"" and result.stderr
