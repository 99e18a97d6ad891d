"""sbx-agent over real HTTP on loopback (docs/protocol.md).

No FUSE: these tests talk to the agent directly with the standard library
(http.client), so they run wherever the agent builds.
"""

import base64
import hashlib
import http.client
import json
import os
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from testenv.agent import Agent  # noqa: E402
from exec_util import wait_for  # noqa: E402

pytestmark = pytest.mark.nofuse

AGENT_ID_PREFIX = "sbx-agent/"


# -- helpers -------------------------------------------------------------------

def q(path):
    return urllib.parse.quote(path, safe="")


class Client:
    """A tiny protocol client over http.client."""

    def __init__(self, agent):
        self.agent = agent
        self.token = agent.token

    def conn(self, timeout=30):
        return http.client.HTTPConnection("127.0.0.1", self.agent.port,
                                          timeout=timeout)

    def raw(self, method, route, body=None, headers=None, token=True,
            timeout=30):
        h = dict(headers or {})
        if token is True:
            h["X-Sbx-Token"] = self.token
        elif token:
            h["X-Sbx-Token"] = token
        c = self.conn(timeout)
        try:
            c.request(method, route, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()

    def json(self, method, route, body=None, expect=200, **kw):
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        st, hdrs, data = self.raw(method, route, body, **kw)
        assert hdrs.get("x-sbx-agent", "").startswith(AGENT_ID_PREFIX)
        assert hdrs.get("content-type") in ("application/json",
                                            "application/octet-stream")
        doc = json.loads(data) if hdrs.get("content-type") == \
            "application/json" else data
        assert st == expect, (st, doc)
        return doc

    def error(self, method, route, body=None, expect=None, **kw):
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        st, hdrs, data = self.raw(method, route, body, **kw)
        assert st >= 400, (st, data)
        if expect is not None:
            assert st == expect, (st, data)
        assert hdrs["content-type"] == "application/json"
        assert hdrs["x-sbx-agent"].startswith(AGENT_ID_PREFIX)
        return st, json.loads(data)["error"]

    def batch(self, ops, **kw):
        return self.json("POST", "/v1/fs/batch", {"ops": ops, **kw})[
            "results"]

    def stream(self, route, method="GET", body=None, timeout=30):
        """Open a frames response; returns (conn, response)."""
        c = self.conn(timeout)
        h = {"X-Sbx-Token": self.token}
        c.request(method, route, body=body, headers=h)
        r = c.getresponse()
        assert r.status == 200, (r.status, r.read())
        assert r.getheader("Content-Type") == "application/octet-stream"
        return c, r


def read_frame(r):
    """One frame from response `r`: (header dict, payload bytes) or None."""
    n = r.read(4)
    if len(n) < 4:
        return None
    (hlen,) = struct.unpack(">I", n)
    hdr = json.loads(r.read(hlen))
    data = b""
    if "len" in hdr:
        data = r.read(hdr["len"])
        assert len(data) == hdr["len"]
    return hdr, data


def frames(r):
    while True:
        f = read_frame(r)
        if f is None:
            return
        yield f
        if f[0].get("end"):
            return


def st_mode(st):
    return st[1]


def st_size(st):
    return st[6]


# -- fixtures -------------------------------------------------------------------

@pytest.fixture(scope="module")
def agent_bin(build_dir):
    # SBX_TEST_AGENT: run another binary or a wrapper (valgrind, the
    # bundle's launcher) in place of the built agent.
    if os.environ.get("SBX_TEST_AGENT"):
        return Path(os.environ["SBX_TEST_AGENT"])
    p = build_dir / "agent" / "sbx-agent"
    if not p.exists():
        pytest.fail(f"{p} not built")
    return p


def make_agent(agent_bin, tmp_path, env_extra=None):
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    env = dict(os.environ)
    env.update(env_extra or {})
    return Agent(agent_bin, root, tmp_path / "agent", env=env).start()


@pytest.fixture(params=["openat2", "userspace"])
def agent(request, agent_bin, tmp_path):
    extra = {"SBX_AGENT_NO_OPENAT2": "1"} if request.param == "userspace" \
        else {}
    a = make_agent(agent_bin, tmp_path, extra)
    yield a
    a.stop()
    out = a.output()
    assert "AddressSanitizer" not in out and "LeakSanitizer" not in out, out


@pytest.fixture
def one_agent(agent_bin, tmp_path):
    """Only the default (openat2) resolver: tests not about paths."""
    a = make_agent(agent_bin, tmp_path)
    yield a
    a.stop()
    out = a.output()
    assert "AddressSanitizer" not in out and "LeakSanitizer" not in out, out


@pytest.fixture
def cl(agent):
    return Client(agent)


@pytest.fixture
def c1(one_agent):
    return Client(one_agent)


# -- command line, health, auth -------------------------------------------------

def test_cli_version_and_help(agent_bin):
    r = subprocess.run([str(agent_bin), "--version"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "sbx-agent" in r.stdout
    r = subprocess.run([str(agent_bin), "help"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "serve" in r.stdout
    r = subprocess.run([str(agent_bin), "serve"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "required" in r.stderr
    r = subprocess.run([str(agent_bin), "bogus"], capture_output=True,
                       text=True)
    assert r.returncode == 2


def test_bad_root_and_token(agent_bin, tmp_path):
    tok = tmp_path / "tok"
    tok.write_text("\n")
    tok.chmod(0o600)
    r = subprocess.run([str(agent_bin), "serve", "--root",
                        str(tmp_path / "missing"), "--listen",
                        "127.0.0.1:0", "--token-file", str(tok)],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and "missing" in r.stderr
    r = subprocess.run([str(agent_bin), "serve", "--root", str(tmp_path),
                        "--listen", "127.0.0.1:0", "--token-file", str(tok)],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and "empty" in r.stderr


def test_health_without_token(c1):
    doc = c1.json("GET", "/v1/health", token=False)
    assert doc["ok"] is True and doc["protocol"] == 1


def test_auth_required(c1):
    for tok in (None, "wrong", c1.token + "x", c1.token[:-1]):
        st, err = c1.error("GET", "/v1/info", token=tok, expect=401)
        assert err["errno"] == "EACCES"
    st, err = c1.error("GET", "/v1/fs/stat?path=", token="nope",
                       expect=401)


def test_info(c1, one_agent):
    doc = c1.json("GET", "/v1/info")
    assert doc["protocol"] == 1
    assert doc["root"] == str(Path(one_agent.root).resolve())
    assert len(doc["boot_id"]) == 32
    for cap in ("fs", "bulk", "batch", "exec", "pty", "watch"):
        assert cap in doc["capabilities"]
    assert isinstance(doc["watch_seq"], int)
    assert doc["limits"]["max_batch"] == 256
    # a new boot id per start
    one_agent.restart()
    assert c1.json("GET", "/v1/info")["boot_id"] != doc["boot_id"]


def test_prefix_routing(c1):
    doc = c1.json("GET", "/some/prefix/v1/info")
    assert doc["protocol"] == 1
    # the Kubernetes pod proxy path carries a /v1/ of its own
    doc = c1.json("GET", "/api/v1/namespaces/ns/pods/p:8080/proxy/v1/info")
    assert doc["protocol"] == 1
    c1.json("GET", "/x/v1/health", token=False)


def test_unknown_route_and_method(c1):
    st, err = c1.error("GET", "/v1/nope", expect=404)
    assert err["errno"] == "ENOENT"
    st, err = c1.error("GET", "/v2/info", expect=404)
    st, err = c1.error("DELETE", "/v1/info", expect=405)
    st, err = c1.error("GET", "/v1/exec/abc/nothing", expect=404)


def raw_exchange(port, head, body=b"", timeout=10):
    """Send `head` (and what of `body` the server takes), read the answer:
    (status, headers dict, body bytes)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(head)
        try:
            s.sendall(body)
        except OSError:
            pass  # refused early: the answer is already on its way
        r = http.client.HTTPResponse(s)
        r.begin()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        s.close()


def test_oversized_body_413(c1):
    """Refused from the Content-Length alone, before any body is read."""
    (Path(c1.agent.root) / "f").write_bytes(b"")
    for route, limit in (("POST /v1/fs/batch", 1024 * 1024),
                         ("PUT /v1/fs/write?path=f", 16 * 1024 * 1024)):
        head = (f"{route} HTTP/1.1\r\nHost: x\r\n"
                f"X-Sbx-Token: {c1.token}\r\n"
                f"Content-Length: {limit + 1}\r\n\r\n").encode()
        st, hdrs, body = raw_exchange(c1.agent.port, head)
        assert st == 413, (st, body)
        assert hdrs["x-sbx-agent"].startswith(AGENT_ID_PREFIX)
        assert json.loads(body)["error"]["errno"] == "EFBIG"
    # at the limit it is fine
    c1.json("PUT", "/v1/fs/write?path=f", body=b"x" * (16 * 1024 * 1024))
    # without a token, the 401 comes first
    head = (f"PUT /v1/fs/write?path=f HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {32 * 1024 * 1024}\r\n\r\n").encode()
    st, hdrs, body = raw_exchange(c1.agent.port, head)
    assert st == 401


def test_chunked_oversized_body(c1):
    """A chunked body (no Content-Length) over the limit is cut off."""
    c = c1.conn()
    try:
        c.putrequest("POST", "/v1/fs/batch")
        c.putheader("X-Sbx-Token", c1.token)
        c.putheader("Transfer-Encoding", "chunked")
        c.endheaders()
        chunk = b"x" * 65536
        try:
            for _ in range(20):
                c.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            c.send(b"0\r\n\r\n")
            r = c.getresponse()
            assert r.status >= 400
        except (ConnectionError, http.client.HTTPException, OSError):
            pass  # refused by closing: also fine
    finally:
        c.close()
    c1.json("GET", "/v1/health", token=False)  # still serving


def test_huge_header_refused(c1):
    # over the protocol's 16 KiB: the agent's own 413
    st, hdrs, body = c1.raw("GET", "/v1/info",
                            headers={"X-Junk": "a" * 17000})
    assert st == 413 and hdrs["x-sbx-agent"].startswith(AGENT_ID_PREFIX)
    assert json.loads(body)["error"]["errno"] == "E2BIG"
    # far beyond: libmicrohttpd refuses before the agent sees it
    head = (b"GET /v1/info HTTP/1.1\r\nHost: x\r\nX-Junk: " +
            b"a" * (64 * 1024) + b"\r\n\r\n")
    st, _, _ = raw_exchange(c1.agent.port, head)
    assert st in (413, 431)
    # 12 KiB of headers is within the limit
    st, _, _ = c1.raw("GET", "/v1/info", headers={"X-Junk": "a" * 12000})
    assert st == 200
    c1.json("GET", "/v1/health", token=False)


# -- files ------------------------------------------------------------------------

def test_stat_list_read(cl, agent):
    root = Path(agent.root)
    (root / "d").mkdir()
    (root / "d" / "f.txt").write_bytes(b"hello world")
    (root / "d" / "with space+plus").write_text("x")
    os.symlink("f.txt", root / "d" / "ln")

    st = cl.json("GET", "/v1/fs/stat?path=d/f.txt")["st"]
    real = os.lstat(root / "d" / "f.txt")
    assert st[0] == str(real.st_ino) and st[14] == str(real.st_dev)
    assert st_size(st) == 11 and stat.S_ISREG(st_mode(st))
    assert st[10] == int(real.st_mtime) and st[11] == real.st_mtime_ns % 10**9
    # stat does not follow the last symlink
    st = cl.json("GET", "/v1/fs/stat?path=d/ln")["st"]
    assert stat.S_ISLNK(st_mode(st))
    # root forms
    for p in ("", ".", "/", "//./"):
        st = cl.json("GET", f"/v1/fs/stat?path={q(p)}")["st"]
        assert stat.S_ISDIR(st_mode(st))
    st, err = cl.error("GET", "/v1/fs/stat?path=nope", expect=404)
    assert err["errno"] == "ENOENT"

    listing = cl.json("GET", "/v1/fs/list?path=d")
    ents = listing["entries"]
    # the directory listed: its own attributes come with its entries
    assert listing["st"][0] == str(os.lstat(root / "d").st_ino)
    assert stat.S_ISDIR(st_mode(listing["st"]))
    names = {e["name"]: e["st"] for e in ents}
    assert set(names) == {"f.txt", "ln", "with space+plus"}
    assert stat.S_ISLNK(st_mode(names["ln"]))
    assert cl.json("GET", "/v1/fs/list")["entries"][0]["name"] == "d"
    st, err = cl.error("GET", "/v1/fs/list?path=d/f.txt")
    assert err["errno"] == "ENOTDIR"

    st, hdrs, data = cl.raw("GET", "/v1/fs/read?path=d/f.txt&offset=6"
                                   "&length=3")
    assert st == 200 and data == b"wor"
    assert hdrs["content-type"] == "application/octet-stream"
    assert hdrs["x-sbx-size"] == "11"
    assert hdrs["x-sbx-ino"] == str(real.st_ino)
    s, ns = hdrs["x-sbx-mtime"].split(".")
    assert int(s) == int(real.st_mtime) and int(ns) == \
        real.st_mtime_ns % 10**9
    _, _, data = cl.raw("GET", "/v1/fs/read?path=d/f.txt")
    assert data == b"hello world"
    _, _, data = cl.raw("GET", "/v1/fs/read?path=d/f.txt&offset=100")
    assert data == b""
    # reading through a symlink inside the root is fine
    _, _, data = cl.raw("GET", "/v1/fs/read?path=d/ln")
    assert data == b"hello world"
    _, _, data = cl.raw("GET", f"/v1/fs/read?path={q('d/with space+plus')}")
    assert data == b"x"
    st, err = cl.error("GET", "/v1/fs/read?path=d")
    assert err["errno"] == "EISDIR"
    st, err = cl.error("GET", "/v1/fs/read?path=d/f.txt&offset=-1",
                       expect=400)
    assert err["errno"] == "EINVAL"


def test_list_while_entries_go(cl, agent):
    """A listing taken while entries of the directory are removed skips
    them and succeeds (an entry removed after readdir() saw it, when no
    entry came after it, failed the whole listing with ENOENT: readdir()
    leaves errno alone at the end; random tester, seed 811804466)."""
    root = Path(agent.root)
    d = root / "churn"
    d.mkdir()
    stop = threading.Event()

    def churn():
        i = 0
        while not stop.is_set():
            p = d / f"f{i % 4}"
            p.write_bytes(b"x")
            p.unlink()
            i += 1

    t = threading.Thread(target=churn)
    t.start()
    failed = []
    try:
        for _ in range(400):
            st, _, data = cl.raw("GET", "/v1/fs/list?path=churn")
            if st != 200:
                failed.append(json.loads(data)["error"]["errno"])
    finally:
        stop.set()
        t.join()
    assert failed == []


def test_write(cl, agent):
    root = Path(agent.root)
    (root / "w").write_bytes(b"0123456789")
    doc = cl.json("PUT", "/v1/fs/write?path=w&offset=2", body=b"ab")
    assert doc["written"] == 2 and st_size(doc["st"]) == 10
    assert (root / "w").read_bytes() == b"01ab456789"
    doc = cl.json("PUT", "/v1/fs/write?path=w&append=1", body=b"XY")
    assert (root / "w").read_bytes() == b"01ab456789XY"
    doc = cl.json("PUT", "/v1/fs/write?path=w&offset=1&truncate=1",
                  body=b"Z")
    assert (root / "w").read_bytes() == b"0Z" and st_size(doc["st"]) == 2
    doc = cl.json("PUT", "/v1/fs/write?path=w&offset=0&truncate=1", body=b"")
    assert (root / "w").read_bytes() == b""
    big = os.urandom(3 * 1024 * 1024)
    cl.json("PUT", "/v1/fs/write?path=w&offset=0", body=big)
    assert (root / "w").read_bytes() == big
    _, _, data = cl.raw("GET", "/v1/fs/read?path=w&length=99999999")
    assert data == big
    st, err = cl.error("PUT", "/v1/fs/write?path=missing", body=b"x")
    assert err["errno"] == "ENOENT"


def test_write_for_an_inode(cl, agent):
    """A write that names the inode it is for lands only in that file:
    once another file was moved onto the path, it answers ESTALE and
    writes nothing (the client's buffered bytes were for the old file)."""
    root = Path(agent.root)
    (root / "t").write_bytes(b"tttt")
    ino = (root / "t").stat().st_ino
    doc = cl.json("PUT", f"/v1/fs/write?path=t&offset=0&ino={ino}",
                  body=b"ab")
    assert doc["written"] == 2 and (root / "t").read_bytes() == b"abtt"
    (root / "s").write_bytes(b"SSSS")
    os.rename(root / "s", root / "t")
    st, err = cl.error("PUT", f"/v1/fs/write?path=t&offset=0&ino={ino}",
                       body=b"XX")
    assert err["errno"] == "ESTALE", err
    assert "another file" in err["message"]
    st, err = cl.error("PUT", f"/v1/fs/write?path=t&append=1&ino={ino}",
                       body=b"XX")
    assert err["errno"] == "ESTALE", err
    res = cl.batch([{"op": "write", "path": "t", "offset": 0,
                     "data": "WFg=", "ino": str(ino)},
                    {"op": "write", "path": "t", "offset": 4,
                     "data": "WFg=",
                     "ino": str((root / "t").stat().st_ino)}])
    assert res[0]["error"]["errno"] == "ESTALE"
    assert res[1]["ok"] is True
    assert (root / "t").read_bytes() == b"SSSSXX"
    # Without an inode number any file at the path is written (older
    # clients); a malformed one is refused.
    cl.json("PUT", "/v1/fs/write?path=t&offset=0", body=b"Z")
    assert (root / "t").read_bytes() == b"ZSSSXX"
    for bad in ("-1", "x", "18446744073709551616"):
        st, err = cl.error("PUT", f"/v1/fs/write?path=t&ino={bad}",
                           body=b"Q")
        assert st == 400 and err["errno"] == "EINVAL", (bad, err)
    assert (root / "t").read_bytes() == b"ZSSSXX"
    # A setattr for an inode: the same rule (a chmod or truncate meant
    # for the file moved away must not reach the one moved onto it).
    mode = (root / "t").stat().st_mode & 0o7777
    res = cl.batch([{"op": "setattr", "path": "t", "mode": 0o600,
                     "size": 1, "ino": str(ino)},
                    {"op": "setattr", "path": "t", "mode": 0o640,
                     "ino": str((root / "t").stat().st_ino)}])
    assert res[0]["error"]["errno"] == "ESTALE", res
    assert "another file" in res[0]["error"]["message"]
    assert res[1]["ok"] is True
    assert (root / "t").read_bytes() == b"ZSSSXX"
    assert (root / "t").stat().st_mode & 0o7777 == 0o640 != mode


def test_readlink_statfs(cl, agent):
    root = Path(agent.root)
    os.symlink("/etc/passwd", root / "abs")
    assert cl.json("GET", "/v1/fs/readlink?path=abs")["target"] == \
        "/etc/passwd"
    st, err = cl.error("GET", "/v1/fs/readlink?path=")
    doc = cl.json("GET", "/v1/fs/statfs")
    sv = os.statvfs(root)
    assert doc["bsize"] == sv.f_bsize and doc["namemax"] == sv.f_namemax
    for k in ("frsize", "blocks", "bfree", "bavail", "files", "ffree"):
        assert isinstance(doc[k], int)


def test_batch_ops(cl, agent):
    root = Path(agent.root)
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    res = cl.batch([
        {"op": "mkdir", "path": "d", "mode": 0o750},
        {"op": "create", "path": "d/f", "mode": 0o600, "excl": True},
        {"op": "create", "path": "d/f", "mode": 0o600, "excl": True},
        {"op": "write", "path": "d/f", "offset": 0, "data": b64(b"hello")},
        {"op": "write", "path": "d/f", "data": b64(b"!"), "append": True},
        {"op": "read", "path": "d/f", "offset": 1, "length": 3},
        {"op": "symlink", "path": "d/ln", "target": "f"},
        {"op": "readlink", "path": "d/ln"},
        {"op": "link", "path": "d/f", "newpath": "d/hard"},
        {"op": "stat", "path": "d/hard"},
        {"op": "list", "path": "d"},
        {"op": "mknod", "path": "d/fifo", "mode": stat.S_IFIFO | 0o644,
         "rdev": 0},
        {"op": "setattr", "path": "d/f", "mode": 0o640, "size": 3,
         "mtime": [1000000000, 5], "atime": "now"},
        {"op": "fsync", "path": "d/f", "datasync": True},
        {"op": "fallocate", "path": "d/f", "mode": 0, "offset": 0,
         "length": 4096},
        {"op": "statfs"},
        {"op": "rename", "path": "d/hard", "newpath": "d/hard2"},
        {"op": "rename", "path": "d/hard2", "newpath": "d/f",
         "flags": "noreplace"},
        {"op": "rename", "path": "d/ln", "newpath": "d/hard2",
         "flags": "exchange"},
        {"op": "unlink", "path": "d/fifo"},
        {"op": "mkdir", "path": "d/sub"},
        {"op": "rmdir", "path": "d/sub"},
        {"op": "rmdir", "path": "d"},
        {"op": "bogus", "path": "x"},
        {"op": "mkdir"},
        {"op": "setattr", "path": "d/f", "mode": "rw"},
        {"op": "write", "path": "d/f", "data": "!!notbase64"},
    ])
    ok = [r.get("ok") for r in res]
    errs = [r.get("error", {}).get("errno") for r in res]
    assert ok[0] and stat.S_IMODE(st_mode(res[0]["st"])) & 0o750 == 0o750
    assert ok[1] and errs[2] == "EEXIST"
    assert res[3]["written"] == 5 and res[4]["written"] == 1
    assert base64.b64decode(res[5]["data"]) == b"ell"
    assert st_size(res[5]["st"]) == 6
    assert ok[6] and stat.S_ISLNK(st_mode(res[6]["st"]))
    assert res[7]["target"] == "f"
    assert ok[8] and res[9]["st"][2] == 2  # nlink
    assert {e["name"] for e in res[10]["entries"]} == {"f", "ln", "hard"}
    assert stat.S_ISDIR(st_mode(res[10]["st"]))
    assert ok[11] and stat.S_ISFIFO(st_mode(res[11]["st"]))
    st12 = res[12]["st"]
    assert stat.S_IMODE(st_mode(st12)) == 0o640 and st_size(st12) == 3
    assert st12[10] == 1000000000 and st12[11] == 5
    assert ok[13] and ok[14]
    assert res[15]["bsize"] > 0 and "namemax" in res[15]
    assert ok[16] and errs[17] == "EEXIST" and ok[18]
    assert ok[19] and ok[20] and ok[21]
    assert errs[22] == "ENOTEMPTY"
    assert errs[23] == "EINVAL" and "unknown" in res[23]["error"]["message"]
    assert errs[24] == "EINVAL" and "path" in res[24]["error"]["message"]
    assert errs[25] == "EINVAL" and "mode" in res[25]["error"]["message"]
    assert errs[26] == "EINVAL"
    assert os.path.islink(root / "d" / "hard2")  # exchanged
    assert (root / "d" / "ln").read_bytes()[:3] == b"hel"
    # stop_on_error
    res = cl.batch([{"op": "stat", "path": "nope"},
                    {"op": "mkdir", "path": "never"}], stop_on_error=True)
    assert res[0]["error"]["errno"] == "ENOENT"
    assert res[1]["error"]["errno"] == "ECANCELED"
    assert not (root / "never").exists()
    # malformed batches
    cl.error("POST", "/v1/fs/batch", body=b"not json", expect=400)
    cl.error("POST", "/v1/fs/batch", body={"ops": 3}, expect=400)
    cl.error("POST", "/v1/fs/batch", body=[1], expect=400)
    cl.error("POST", "/v1/fs/batch",
             body={"ops": [{"op": "statfs"}] * 257}, expect=413)
    assert len(cl.batch([{"op": "statfs"}] * 256)) == 256


def test_batch_xattr(cl, agent):
    root = Path(agent.root)
    (root / "x").write_text("x")
    try:
        os.setxattr(root / "x", "user.probe", b"1")
    except OSError:
        pytest.skip("no user xattrs on this file system")
    v = base64.b64encode(b"\x00\xffvalue").decode()
    res = cl.batch([
        {"op": "setxattr", "path": "x", "name": "user.a", "value": v,
         "flags": "create"},
        {"op": "setxattr", "path": "x", "name": "user.a", "value": v,
         "flags": "create"},
        {"op": "getxattr", "path": "x", "name": "user.a"},
        {"op": "listxattr", "path": "x"},
        {"op": "removexattr", "path": "x", "name": "user.a"},
        {"op": "getxattr", "path": "x", "name": "user.a"},
    ])
    assert res[0]["ok"] and res[1]["error"]["errno"] == "EEXIST"
    assert base64.b64decode(res[2]["value"]) == b"\x00\xffvalue"
    assert "user.a" in res[3]["names"]
    assert res[4]["ok"] and res[5]["error"]["errno"] == "ENODATA"


# -- confinement ----------------------------------------------------------------------

ESCAPES = ["../x", "a/../../x", "abs/passwd", "etc/passwd", "up/x",
           "a/up2/passwd", ".."]


def setup_escapes(root):
    (root / "a").mkdir()
    os.symlink("/etc", root / "abs")
    os.symlink("../" * 20 + "etc", root / "etc")
    os.symlink("..", root / "up")
    os.symlink("../../../../../../../../../../etc", root / "a" / "up2")
    os.symlink("../a", root / "a" / "inside")  # stays inside


def test_path_escapes_refused(cl, agent):
    root = Path(agent.root)
    setup_escapes(root)
    for p in ESCAPES:
        st, err = cl.error("GET", f"/v1/fs/read?path={q(p)}")
        assert err["errno"] in ("EXDEV", "ENOENT"), (p, err)
        st, err = cl.error("GET", f"/v1/fs/list?path={q(p)}")
        assert err["errno"] in ("EXDEV", "ENOENT"), (p, err)
    for p in ("../x", "a/../../x", "abs/passwd", "etc/passwd"):
        st, err = cl.error("GET", f"/v1/fs/read?path={q(p)}")
        assert err["errno"] == "EXDEV", (p, err)
    # the parent of the last component is confined too
    res = cl.batch([{"op": "create", "path": "abs/evil"},
                    {"op": "mkdir", "path": "up/evil"},
                    {"op": "stat", "path": "../etc"},
                    {"op": "stat", "path": ".."},
                    {"op": "rename", "path": "a", "newpath": "../evil"},
                    {"op": "link", "path": "a", "newpath": "abs/evil"},
                    {"op": "write", "path": "etc/passwd", "data": "eA=="},
                    {"op": "setattr", "path": "abs", "mode": 0o777},
                    {"op": "symlink", "path": "../evil", "target": "/"}])
    for r in res:
        assert r["error"]["errno"] in ("EXDEV", "EOPNOTSUPP"), res
    # a leading '/' means the root, not the host's /
    st, err = cl.error("GET", "/v1/fs/read?path=/etc/passwd")
    assert err["errno"] in ("ENOENT", "EXDEV")
    # inside the root, .. and relative links work
    cl.json("GET", "/v1/fs/stat?path=a/../a/inside/../a")
    assert cl.json("GET", "/v1/fs/list?path=a/inside")["entries"]
    # bulk and exec cwd are confined as well
    cl.error("GET", "/v1/fs/bulk?path=abs")
    cl.error("POST", "/v1/exec", {"argv": ["true"], "cwd": "up"})
    assert not Path("/evil").exists()


# -- bulk -------------------------------------------------------------------------------

def test_bulk(c1, one_agent):
    root = Path(one_agent.root)
    files = {}
    for d in ("", "a", "a/b", "a/b/c", "z"):
        (root / d).mkdir(parents=True, exist_ok=True)
        for i in range(3):
            data = os.urandom(100 * (i + 1))
            p = f"{d}/f{i}" if d else f"f{i}"
            (root / p).write_bytes(data)
            files[p] = data
    (root / "big").write_bytes(b"x" * 200000)
    os.symlink("/etc", root / "a" / "ln")
    c, r = c1.stream("/v1/fs/bulk?path=")
    dirs, got, end = [], {}, None
    for hdr, data in frames(r):
        if "dir" in hdr:
            dirs.append(hdr["dir"])
            assert stat.S_ISDIR(st_mode(hdr["st"]))
        elif "file" in hdr:
            assert st_size(hdr["st"]) == len(data)
            got[hdr["file"]] = data
        elif hdr.get("end"):
            end = hdr
    c.close()
    assert end and isinstance(end["watch_seq"], int)
    assert sorted(dirs) == ["", "a", "a/b", "a/b/c", "z"]
    depth = [d.count("/") + bool(d) for d in dirs]
    assert depth == sorted(depth)  # breadth first
    assert got == files  # big (> 64 KiB) is not sent, nothing via the link
    # limits: depth, max_file, max_total
    c, r = c1.stream("/v1/fs/bulk?path=a&depth=1&max_file=150")
    fr = list(frames(r))
    c.close()
    assert [h["dir"] for h, _ in fr if "dir" in h] == ["a"]
    assert [h["file"] for h, _ in fr if "file" in h] == ["a/f0"]
    c, r = c1.stream("/v1/fs/bulk?path=&max_total=350")
    fr = list(frames(r))
    c.close()
    assert sum(len(d) for h, d in fr if "file" in h) <= 350
    c1.error("GET", "/v1/fs/bulk?path=nope", expect=404)


def test_bulk_files(c1, one_agent):
    """POST /v1/fs/bulk: the content of listed files, in the order asked;
    what is missing, not a regular file, a symlink, too large or past
    max_total is left out; then the end frame with the watch sequence."""
    root = Path(one_agent.root)
    (root / "d").mkdir()
    (root / "d" / "a").write_bytes(b"a" * 100)
    (root / "d" / "b").write_bytes(b"b" * 200)
    (root / "c").write_bytes(b"c" * 300)
    (root / "big").write_bytes(b"x" * 5000)
    os.symlink("c", root / "d" / "ln")
    seq = c1.json("GET", "/v1/info")["watch_seq"]
    assert "bulk_files" in c1.json("GET", "/v1/info")["capabilities"]
    body = json.dumps({"files": ["c", "d/b", "nope", "d", "d/ln", "big",
                                 "d/a"], "max_file": 4096})
    c, r = c1.stream("/v1/fs/bulk", method="POST", body=body)
    fr = list(frames(r))
    c.close()
    got = [(h["file"], d) for h, d in fr if "file" in h]
    assert got == [("c", b"c" * 300), ("d/b", b"b" * 200),
                   ("d/a", b"a" * 100)]
    for h, d in fr:
        if "file" in h:
            assert st_size(h["st"]) == len(d)
    assert fr[-1][0]["end"] is True and fr[-1][0]["watch_seq"] >= seq
    # max_total: files are sent while the total stays within it
    body = json.dumps({"files": ["c", "d/b", "d/a"], "max_total": 450})
    c, r = c1.stream("/v1/fs/bulk", method="POST", body=body)
    got = [h["file"] for h, _ in frames(r) if "file" in h]
    c.close()
    assert got == ["c", "d/a"]
    # confined like every path; a body that is not a list of paths: EINVAL
    body = json.dumps({"files": ["../../etc/passwd"]})
    c, r = c1.stream("/v1/fs/bulk", method="POST", body=body)
    assert [h for h, _ in frames(r) if "file" in h] == []
    c.close()
    c1.error("POST", "/v1/fs/bulk", {"files": "c"}, expect=400)
    c1.error("POST", "/v1/fs/bulk", {"files": [1]}, expect=400)


def test_bulk_big_directory_splits_frames(c1, one_agent):
    root = Path(one_agent.root)
    (root / "many").mkdir()
    for i in range(3000):
        (root / "many" / f"file-with-a-long-name-{i:05d}").write_bytes(b"")
    c, r = c1.stream("/v1/fs/bulk?path=many&max_file=0")
    names = []
    for hdr, _ in frames(r):
        if "dir" in hdr:
            names += [e["name"] for e in hdr["entries"]]
    c.close()
    assert len(names) == 3000 and len(set(names)) == 3000


# -- watch --------------------------------------------------------------------------------

def watch_until(r, pred, timeout=10):
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        f = read_frame(r)
        assert f is not None, seen
        seen.append(f[0])
        if pred(seen):
            return seen
    raise AssertionError(f"timeout; saw {seen}")


def wait_watched(r, root, rel):
    """Wait until the agent watches directory `rel` (made after the stream
    `r` started): its own entry event comes before the directory is
    watched, and a scan then reports the entries made meanwhile but not
    their attribute changes, so wait for an attr event from inside it
    (a thread changes a probe's mode until one comes).  Returns the
    events seen, the last one that attr event."""
    probe = Path(root) / rel / ".probe"
    probe.write_text("")
    path = f"{rel}/.probe"
    done = threading.Event()

    def toggle():
        mode = 0o600
        while not done.wait(0.02):
            os.chmod(probe, mode)
            mode ^= 0o044
    t = threading.Thread(target=toggle, daemon=True)
    t.start()
    try:
        return watch_until(r, lambda s: s[-1].get("kind") == "attr" and
                           s[-1].get("path") == path)
    finally:
        done.set()
        t.join()


def test_watch(c1, one_agent):
    root = Path(one_agent.root)
    c, r = c1.stream("/v1/watch")
    hello = read_frame(r)[0]
    assert hello["kind"] == "hello" and len(hello["boot_id"]) == 32
    # Once "d" is watched, everything that happens in it is reported.
    (root / "d").mkdir()
    start = wait_watched(r, root, "d")[-1]["seq"]
    (root / "d" / "new").write_text("x")
    (root / "d" / "sub").mkdir()
    (root / "d" / "sub" / "deep").write_text("y")
    os.chmod(root / "d" / "new", 0o600)
    seen = watch_until(r, lambda s: any(
        e.get("path") == "d/sub/deep" for e in s) and any(
        e.get("kind") == "attr" and e.get("path") == "d/new" for e in s))
    seqs = [e["seq"] for e in seen if "seq" in e]
    assert seqs == list(range(start + 1, start + 1 + len(seqs)))
    kinds = {(e["kind"], e.get("path")) for e in seen}
    assert ("entry", "d/new") in kinds and ("entry", "d/sub") in kinds
    c.close()
    # since= replays from the ring
    c, r = c1.stream(f"/v1/watch?since={start}")
    read_frame(r)
    replay = watch_until(r, lambda s: len(s) >= len(seen))
    assert [e["seq"] for e in replay][:3] == seqs[:3]
    c.close()
    # a since from the future (another boot) or another boot id: overflow
    for qs in (f"since={start + 10**9}", f"since={start}&boot_id=other"):
        c, r = c1.stream(f"/v1/watch?{qs}")
        read_frame(r)
        assert read_frame(r)[0]["kind"] == "overflow"
        c.close()


@pytest.mark.slow
def test_watch_heartbeat_and_rename(c1, one_agent):
    root = Path(one_agent.root)
    c, r = c1.stream("/v1/watch", timeout=20)
    read_frame(r)
    (root / "old").mkdir()
    wait_watched(r, root, "old")
    os.rename(root / "old", root / "new")
    (root / "new" / "inner").write_text("z")
    watch_until(r, lambda s: any(e.get("path") == "new/inner" for e in s))
    t0 = time.monotonic()
    watch_until(r, lambda s: s[-1]["kind"] == "heartbeat", timeout=8)
    assert time.monotonic() - t0 < 7
    c.close()


# -- exec ---------------------------------------------------------------------------------

def run(cl, argv, tty=False, stdin=None, **kw):
    """Start with attach; returns (stdout, stderr, exit dict, end frame)."""
    body = {"argv": argv, "attach": True, "tty": tty, **kw}
    if stdin is not None:
        doc = cl.json("POST", "/v1/exec", {k: v for k, v in body.items()
                                           if k != "attach"})
        cl.json("POST", f"/v1/exec/{doc['id']}/stdin?eof=1", body=stdin)
        c, r = cl.stream(f"/v1/exec/{doc['id']}/output")
    else:
        c, r = cl.stream("/v1/exec", method="POST", body=json.dumps(body))
        first = read_frame(r)[0]
        assert set(first) == {"id", "pid"}
    out, err, ex = b"", b"", None
    last_seq = 0
    for hdr, data in frames(r):
        if "seq" in hdr:
            assert hdr["seq"] > last_seq
            last_seq = hdr["seq"]
            if hdr["stream"] == "stdout":
                out += data
            else:
                err += data
        elif "exit" in hdr:
            ex = hdr
    c.close()
    return out, err, ex


def test_exec_argv_exact(c1):
    args = ["a b", "'q'", '"dq"', "*", "$HOME", "", "back\\slash", "ü"]
    out, err, ex = run(c1, ["printf", "%s\\n"] + args,
                       cwd="/")
    assert out.decode().split("\n")[:-1] == args
    assert ex["exit"] == {"code": 0, "signal": 0}


def test_exec_exit_codes_and_streams(c1, one_agent):
    out, err, ex = run(c1, ["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert out == b"out\n" and err == b"err\n"
    assert ex["exit"]["code"] == 7 and ex["exit"]["signal"] == 0
    out, err, ex = run(c1, ["sh", "-c", "kill -TERM $$"])
    assert ex["exit"] == {"code": 128 + 15, "signal": 15}
    st, e = c1.error("POST", "/v1/exec", {"argv": ["no-such-cmd-xyz"]},
                     expect=404)
    assert e["errno"] == "ENOENT"
    c1.error("POST", "/v1/exec", {"argv": []}, expect=400)
    c1.error("POST", "/v1/exec", {"argv": "ls"}, expect=400)
    c1.error("POST", "/v1/exec", {"argv": ["ls"], "cwd": "missing"},
             expect=404)
    # cwd, env: the complete environment
    (Path(one_agent.root) / "sub").mkdir()
    out, _, _ = run(c1, ["sh", "-c", "pwd; echo $FOO; echo ${HOME-unset}"],
                    cwd="sub", env=["FOO=bar baz", "PATH=/usr/bin:/bin"])
    lines = out.decode().splitlines()
    assert Path(lines[0]).resolve() == (Path(one_agent.root) / "sub").resolve()
    assert lines[1:] == ["bar baz", "unset"]


def test_exec_stdin_eof(c1):
    out, err, ex = run(c1, ["sh", "-c", "cat; echo done"], stdin=b"abc\n")
    assert out == b"abc\ndone\n" and ex["exit"]["code"] == 0


def test_exec_stdin_incremental_and_status(c1):
    doc = c1.json("POST", "/v1/exec", {"argv": ["cat"]})
    pid_id = doc["id"]
    st = c1.json("GET", f"/v1/exec/{pid_id}")
    assert st["running"] is True and st["pid"] == doc["pid"]
    c1.json("POST", f"/v1/exec/{pid_id}/stdin", body=b"one ")
    c1.json("POST", f"/v1/exec/{pid_id}/stdin?eof=1", body=b"two")
    c, r = c1.stream(f"/v1/exec/{pid_id}/output")
    fr = list(frames(r))
    c.close()
    assert b"".join(d for h, d in fr if "seq" in h) == b"one two"
    st = c1.json("GET", f"/v1/exec/{pid_id}")
    assert st["running"] is False and st["exit"]["code"] == 0
    st, e = c1.error("POST", f"/v1/exec/{pid_id}/stdin", body=b"x")
    assert e["errno"] == "EPIPE"
    c1.json("DELETE", f"/v1/exec/{pid_id}")
    c1.error("GET", f"/v1/exec/{pid_id}", expect=404)


def test_exec_signal_and_delete(c1):
    doc = c1.json("POST", "/v1/exec", {"argv": ["sleep", "60"]})
    c1.json("POST", f"/v1/exec/{doc['id']}/signal", {"signal": "SIGINT"})
    c, r = c1.stream(f"/v1/exec/{doc['id']}/output")
    ex = [h for h, _ in frames(r) if "exit" in h][0]
    c.close()
    assert ex["exit"] == {"code": 130, "signal": 2}
    c1.error("POST", f"/v1/exec/{doc['id']}/signal", {"signal": "SIGINT"})
    c1.error("POST", f"/v1/exec/{doc['id']}/signal", {"signal": "NOPE"},
             expect=400)
    # signals reach the whole group; DELETE kills it
    doc = c1.json("POST", "/v1/exec",
                  {"argv": ["sh", "-c", "sleep 60 & sleep 60; wait"]})
    # own process group (and session), once the child has called setsid()
    assert wait_for(lambda: os.getpgid(doc["pid"]) == doc["pid"],
                    timeout=5)
    pgid = doc["pid"]
    c1.json("DELETE", f"/v1/exec/{doc['id']}")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = subprocess.run(["pgrep", "-g", str(pgid)],
                               capture_output=True).stdout
        if not alive:
            break
        time.sleep(0.05)
    assert not alive


def test_exec_tty_resize(c1):
    doc = c1.json("POST", "/v1/exec", {
        "argv": ["sh", "-c", "stty size; read x; stty size; tty >/dev/null "
                 "&& echo isatty"],
        "tty": True, "rows": 24, "cols": 80})
    c, r = c1.stream(f"/v1/exec/{doc['id']}/output")
    buf = b""
    while b"24 80" not in buf:
        h, d = read_frame(r)
        buf += d
    c1.json("POST", f"/v1/exec/{doc['id']}/resize", {"rows": 50, "cols": 132})
    c1.json("POST", f"/v1/exec/{doc['id']}/stdin", body=b"go\n")
    for h, d in frames(r):
        buf += d
    c.close()
    assert b"50 132" in buf and b"isatty" in buf
    # resize without a tty
    doc = c1.json("POST", "/v1/exec", {"argv": ["sleep", "5"]})
    st, e = c1.error("POST", f"/v1/exec/{doc['id']}/resize",
                     {"rows": 1, "cols": 1})
    assert e["errno"] == "ENOTTY"
    c1.json("DELETE", f"/v1/exec/{doc['id']}")


def test_exec_reattach_loses_nothing(c1):
    """Drop the output connection mid-stream, re-attach with since=."""
    cmd = ["sh", "-c", "seq 1 2500000; echo tail >&2"]
    expect = subprocess.run(cmd, capture_output=True).stdout
    doc = c1.json("POST", "/v1/exec", {"argv": cmd})
    c, r = c1.stream(f"/v1/exec/{doc['id']}/output")
    got, last = b"", 0
    while len(got) < 200000:
        h, d = read_frame(r)
        assert h["seq"] == last + 1
        last = h["seq"]
        got += d
    # drop it hard, with unread data in flight
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    # Output the agent has but we never read: what since= must replay.
    assert wait_for(lambda: c1.json("GET", f"/v1/exec/{doc['id']}")
                    ["output_seq"] > last + 8, timeout=10)
    c, r = c1.stream(f"/v1/exec/{doc['id']}/output?since={last}")
    err, ex = b"", None
    for h, d in frames(r):
        assert "lost" not in h
        if "seq" in h:
            assert h["seq"] == last + 1
            last = h["seq"]
            if h["stream"] == "stdout":
                got += d
            else:
                err += d
        elif "exit" in h:
            ex = h
    c.close()
    assert hashlib.sha256(got).hexdigest() == \
        hashlib.sha256(expect).hexdigest()
    assert err == b"tail\n" and ex["exit"]["code"] == 0


def test_exec_backpressure_blocks_writer(c1):
    """Unread output beyond the buffer blocks the process, not lost."""
    doc = c1.json("POST", "/v1/exec", {
        "argv": ["sh", "-c", "head -c 6000000 /dev/zero; echo done >&2"]})

    looks = []

    def stalled():
        # Blocked on a full pipe: the output stops growing (three
        # looks in a row), while the process still runs.
        looks.append(c1.json("GET", f"/v1/exec/{doc['id']}"))
        last3 = looks[-3:]
        return (len(last3) == 3 and last3[0]["output_seq"] > 0 and
                len({x["output_seq"] for x in last3}) == 1 and
                all(x["running"] for x in last3))
    assert wait_for(stalled, timeout=15, step=0.2)
    st = c1.json("GET", f"/v1/exec/{doc['id']}")
    assert st["running"] is True  # blocked on a full pipe
    c, r = c1.stream(f"/v1/exec/{doc['id']}/output")
    n, err = 0, b""
    for h, d in frames(r):
        if h.get("stream") == "stdout":
            n += len(d)
        elif h.get("stream") == "stderr":
            err += d
    c.close()
    assert n == 6000000 and err == b"done\n"


def test_exec_watch_seq_at_exit(c1, one_agent):
    doc = c1.json("POST", "/v1/exec", {
        "argv": ["sh", "-c", "echo data > made-by-cmd; mkdir dir-by-cmd"]})
    c, r = c1.stream(f"/v1/exec/{doc['id']}/output")
    ex = [h for h, _ in frames(r) if "exit" in h][0]
    c.close()
    w = ex["watch_seq"]
    # every change the command made has a sequence number <= w
    c, r = c1.stream("/v1/watch?since=0")
    read_frame(r)
    seen = watch_until(r, lambda s: any(e.get("path") == "dir-by-cmd"
                                        for e in s))
    c.close()
    for e in seen:
        if e.get("path") in ("made-by-cmd", "dir-by-cmd"):
            assert e["seq"] <= w, (e, w)


def test_exec_many_quick(c1):
    t0 = time.monotonic()
    for i in range(20):
        out, _, ex = run(c1, ["true"])
        assert ex["exit"]["code"] == 0
    # each exec of `true` is quick (not the 200 ms quiet period)
    assert (time.monotonic() - t0) / 20 < 0.15


# -- unix socket ------------------------------------------------------------------------------

def test_unix_socket(agent_bin, tmp_path):
    root = tmp_path / "r"
    root.mkdir()
    tok = tmp_path / "tok"
    tok.write_text("t0k\n")
    tok.chmod(0o600)
    sock = tmp_path / "a.sock"
    p = subprocess.Popen([str(agent_bin), "serve", "--root", str(root),
                          "--listen", f"unix:{sock}", "--token-file",
                          str(tok)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        line = p.stdout.readline().decode()
        assert line.startswith("listening on unix:")
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(sock))
        s.sendall(b"GET /v1/info HTTP/1.1\r\nHost: x\r\nX-Sbx-Token: t0k\r\n"
                  b"Connection: close\r\n\r\n")
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
        s.close()
        assert data.startswith(b"HTTP/1.1 200")
        assert b'"protocol":1' in data
    finally:
        p.terminate()
        p.wait(10)
    assert not sock.exists()


# -- the bundle in an empty root ------------------------------------------------------------

def test_bundle_in_empty_root(agent_bin, tmp_path):
    """contrib/agent/bundle.sh output runs in a root holding nothing but
    the bundle, /proc, /dev and the served directory (bubblewrap)."""
    import shutil
    bwrap = shutil.which("bwrap")
    if not bwrap:
        pytest.skip("bubblewrap not installed")
    if subprocess.run([bwrap, "--ro-bind", "/", "/", "true"],
                      capture_output=True).returncode != 0:
        pytest.skip("bubblewrap cannot create namespaces here")
    script = Path(__file__).resolve().parents[2] / "contrib" / "agent" / \
        "bundle.sh"
    bundle = tmp_path / "bundle"
    r = subprocess.run([str(script), str(agent_bin), str(bundle),
                        str(tmp_path / "bundle.tar.gz")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (bundle / "lib" / "ld.so").exists()
    assert (tmp_path / "bundle.tar.gz").stat().st_size > 0
    data = tmp_path / "data"
    data.mkdir()
    (data / "hello").write_text("hi")
    tok = tmp_path / "tok"
    tok.write_text("bundle-token\n")
    tok.chmod(0o600)
    port = __import__("testenv.agent", fromlist=["free_port"]).free_port()
    argv = [bwrap, "--unshare-pid", "--die-with-parent",
            "--bind", str(bundle), "/agent", "--proc", "/proc",
            "--dev", "/dev", "--bind", str(data), "/data",
            "--ro-bind", str(tok), "/token",
            "/agent/lib/ld.so", "--library-path", "/agent/lib",
            "/agent/bin/sbx-agent", "serve", "--root", "/data",
            "--listen", f"127.0.0.1:{port}", "--token-file", "/token"]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        line = p.stdout.readline().decode()
        assert line.startswith("listening on"), p.stderr.read()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/v1/health")
        r = c.getresponse()
        assert r.status == 200 and json.loads(r.read())["ok"] is True
        c.request("GET", "/v1/info",
                  headers={"X-Sbx-Token": "bundle-token"})
        r = c.getresponse()
        info = json.loads(r.read())
        assert r.status == 200 and info["root"] == "/data"
        c.request("GET", "/v1/fs/read?path=hello",
                  headers={"X-Sbx-Token": "bundle-token"})
        r = c.getresponse()
        assert r.read() == b"hi"
        c.close()
    finally:
        p.terminate()
        p.wait(10)


def test_tls(agent_bin, tmp_path):
    import shutil
    import ssl
    if not shutil.which("openssl"):
        pytest.skip("openssl not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048",
                        "-nodes", "-keyout", str(key), "-out", str(cert),
                        "-days", "1", "-subj", "/CN=localhost"],
                       capture_output=True)
    assert r.returncode == 0, r.stderr
    (tmp_path / "root").mkdir()
    tok = tmp_path / "tok"
    tok.write_text("tls-token\n")
    tok.chmod(0o600)
    p = subprocess.Popen([str(agent_bin), "serve", "--root",
                          str(tmp_path / "root"), "--listen", "127.0.0.1:0",
                          "--token-file", str(tok), "--tls-cert", str(cert),
                          "--tls-key", str(key)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = p.stdout.readline().decode().strip()
        port = int(line.rsplit(":", 1)[1])
        ctx = ssl.create_default_context(cafile=str(cert))
        ctx.check_hostname = False
        c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx,
                                        timeout=10)
        c.request("GET", "/v1/info", headers={"X-Sbx-Token": "tls-token"})
        r = c.getresponse()
        assert r.status == 200 and json.loads(r.read())["protocol"] == 1
        c.close()
    finally:
        p.terminate()
        p.wait(10)
    # a certificate without its key is refused at start
    r = subprocess.run([str(agent_bin), "serve", "--root",
                        str(tmp_path / "root"), "--listen", "127.0.0.1:0",
                        "--token-file", str(tok), "--tls-cert", str(cert)],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and "together" in r.stderr


# -- archive (GET/PUT /v1/archive) -----------------------------------------------

import io  # noqa: E402
import shutil  # noqa: E402
import tarfile  # noqa: E402

LONG_DIR = "/".join(["d%03d-" % i + "x" * 40 for i in range(4)])  # > 100
LONG_FILE = "f" * 200  # one component of 200 bytes (> 100, pax path)


def make_tree(top):
    """Files, directories, symlinks, hard links, a 20 MB file, long names,
    odd modes and sub-second mtimes."""
    top.mkdir(parents=True, exist_ok=True)
    (top / "dir" / "sub").mkdir(parents=True)
    (top / "dir" / "a.txt").write_bytes(b"alpha\n")
    (top / "dir" / "sub" / "b.bin").write_bytes(bytes(range(256)) * 3)
    (top / "empty").write_bytes(b"")
    (top / "exec.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    os.chmod(top / "exec.sh", 0o750)
    os.chmod(top / "dir" / "a.txt", 0o604)
    os.chmod(top / "dir" / "sub", 0o705)
    os.symlink("a.txt", top / "dir" / "rel-link")
    os.symlink("/etc/hostname", top / "abs-link")
    os.symlink("dir/sub", top / "dir-link")
    os.link(top / "dir" / "a.txt", top / "hard1")
    os.link(top / "dir" / "a.txt", top / "dir" / "sub" / "hard2")
    with open(top / "big", "wb") as f:
        block = hashlib.sha256(b"seed").digest() * 2048  # 64 KiB
        for _ in range(320):  # 20 MiB
            f.write(block)
    (top / LONG_DIR).mkdir(parents=True)
    (top / LONG_DIR / LONG_FILE).write_bytes(b"deep and long\n")
    os.symlink(LONG_DIR + "/" + LONG_FILE, top / "long-link")
    # deterministic sub-second mtimes, deepest first (dirs last)
    t = 1_600_000_000_123_456_789
    for dirpath, dirnames, filenames in sorted(os.walk(top), reverse=True):
        for n in filenames + dirnames:
            p = os.path.join(dirpath, n)
            t += 1_000_000_007
            os.utime(p, ns=(t, t), follow_symlinks=False)


def tree(top):
    """{relpath: attributes} of everything under `top` (not following)."""
    out = {}
    inodes = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, top)
            st = os.lstat(p)
            rec = {"fmt": stat.S_IFMT(st.st_mode)}
            if stat.S_ISLNK(st.st_mode):
                rec["target"] = os.readlink(p)
            else:
                rec["mode"] = stat.S_IMODE(st.st_mode)
                rec["mtime"] = st.st_mtime_ns
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    rec["sha"] = hashlib.sha256(f.read()).hexdigest()
                rec["nlink"] = st.st_nlink
                inodes.setdefault(st.st_ino, []).append(rel)
            out[rel] = rec
    groups = sorted(sorted(v) for v in inodes.values() if len(v) > 1)
    return out, groups


def get_archive(cl, path, dest):
    c = cl.conn(timeout=60)
    try:
        c.request("GET", f"/v1/archive?path={q(path)}",
                  headers={"X-Sbx-Token": cl.token})
        r = c.getresponse()
        assert r.status == 200, (r.status, r.read())
        assert r.getheader("Content-Type") == "application/octet-stream"
        assert r.getheader("X-Sbx-Agent", "").startswith(AGENT_ID_PREFIX)
        with open(dest, "wb") as f:
            shutil.copyfileobj(r, f)
    finally:
        c.close()


def gnu_tar(*args, cwd=None):
    r = subprocess.run(["tar", *map(str, args)], capture_output=True,
                       cwd=cwd)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_archive_get_reproduces_tree(cl, agent, tmp_path):
    root = Path(agent.root)
    make_tree(root / "t")
    (root / "outside-t").write_text("not in the archive")
    ar = tmp_path / "get.tar"
    get_archive(cl, "t", ar)
    assert ar.stat().st_size % 512 == 0
    listing = gnu_tar("-tf", ar).decode().splitlines()
    assert "hard1" in listing and "outside-t" not in listing
    # hard links: the second and later names are link entries
    verbose = gnu_tar("-tvf", ar).decode()
    assert "hard1 link to dir/a.txt" in verbose
    assert "dir/sub/hard2 link to dir/a.txt" in verbose
    assert "abs-link -> /etc/hostname" in verbose
    out = tmp_path / "x"
    out.mkdir()
    gnu_tar("-xpf", ar, "-C", out)
    want, want_groups = tree(root / "t")
    got, got_groups = tree(out)
    assert got == want
    assert got_groups == want_groups
    # depth-first in sorted order, directories before their contents
    names = [n.rstrip("/") for n in listing]
    assert names.index("dir") < names.index("dir/a.txt") < \
        names.index("dir/sub") < names.index("dir/sub/b.bin") < \
        names.index("empty")
    # the whole root by default
    get_archive(cl, "", tmp_path / "all.tar")
    assert "outside-t" in gnu_tar("-tf", tmp_path / "all.tar").decode()


def test_archive_get_errors(cl, agent):
    root = Path(agent.root)
    (root / "file").write_text("x")
    os.symlink("/etc", root / "abs")
    cl.error("GET", "/v1/archive?path=missing", expect=404)
    st, err = cl.error("GET", "/v1/archive?path=abs")
    assert err["errno"] == "EXDEV"
    st, err = cl.error("GET", "/v1/archive?path=..")
    assert err["errno"] == "EXDEV"
    st, err = cl.error("GET", "/v1/archive?path=file")
    assert err["errno"] == "ENOTDIR"
    cl.error("GET", "/v1/archive", token=False, expect=401)
    cl.error("PUT", "/v1/archive?path=d", body=b"\0" * 1024, token=False,
             expect=401)
    assert not (root / "d").exists()


def test_archive_put_gnu_tar(cl, agent, tmp_path):
    src = tmp_path / "src"
    make_tree(src)
    want, want_groups = tree(src)
    for fmt in ("pax", "gnu"):
        data = gnu_tar(f"--format={fmt}", "-C", src, "-cf", "-", ".")
        doc = cl.json("PUT", f"/v1/archive?path={q('restored/' + fmt)}",
                      body=data)
        assert doc["entries"] == len(want) + 1  # and "./"
        assert doc["bytes"] == sum(
            os.lstat(src / n).st_size for n, r in want.items()
            if r["fmt"] == stat.S_IFREG and r["nlink"] == 1) + \
            len(b"alpha\n")
        got, got_groups = tree(Path(agent.root) / "restored" / fmt)
        if fmt == "gnu":  # GNU format has whole-second times
            for r in list(want.values()) + list(got.values()):
                r.pop("mtime", None)
        assert got == want
        assert got_groups == want_groups
    # our own archive round-trips through PUT too
    get_archive(cl, "restored/pax", tmp_path / "again.tar")
    cl.json("PUT", "/v1/archive?path=again",
            body=(tmp_path / "again.tar").read_bytes())
    got, _ = tree(Path(agent.root) / "again")
    want2, _ = tree(src)
    assert got == want2


def test_archive_put_streams_in_pieces(c1, one_agent, tmp_path):
    """A chunked upload in small pieces, as a pipe would send it."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(os.urandom(300_000))
    data = gnu_tar("--format=pax", "-C", src, "-cf", "-", ".")
    c = c1.conn()
    try:
        c.putrequest("PUT", "/v1/archive?path=p")
        c.putheader("X-Sbx-Token", c1.token)
        c.putheader("Transfer-Encoding", "chunked")
        c.endheaders()
        for i in range(0, len(data), 1000):
            piece = data[i:i + 1000]
            c.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        c.send(b"0\r\n\r\n")
        r = c.getresponse()
        assert r.status == 200, r.read()
        assert json.loads(r.read())["entries"] == 2
    finally:
        c.close()
    assert (Path(one_agent.root) / "p" / "f").read_bytes() == \
        (src / "f").read_bytes()


def test_archive_put_replace(cl, agent, tmp_path):
    root = Path(agent.root)
    src = tmp_path / "src"
    (src / "keep" / "deep").mkdir(parents=True)
    (src / "keep" / "deep" / "f").write_text("new")
    (src / "top").write_text("top")
    data = gnu_tar("-C", src, "-cf", "-", "keep", "top")
    dst = root / "w"
    (dst / "keep" / "deep").mkdir(parents=True)
    (dst / "keep" / "deep" / "f").write_text("old")
    (dst / "keep" / "extra").write_text("extra")
    (dst / "gone" / "sub").mkdir(parents=True)
    (dst / "gone" / "sub" / "x").write_text("x")
    os.symlink("/etc", dst / "extra-link")
    (root / "sibling").write_text("outside REL")
    # without replace the extras stay
    cl.json("PUT", "/v1/archive?path=w", body=data)
    assert (dst / "keep" / "extra").exists() and (dst / "gone").exists()
    assert (dst / "keep" / "deep" / "f").read_text() == "new"
    # with replace they go, and nothing outside REL is touched
    doc = cl.json("PUT", "/v1/archive?path=w&replace=1", body=data)
    assert doc["entries"] == 4
    assert sorted(tree(dst)[0]) == ["keep", "keep/deep", "keep/deep/f",
                                    "top"]
    assert (root / "sibling").read_text() == "outside REL"
    # a bad archive with replace=1 removes nothing
    (dst / "later").write_text("later")
    cl.error("PUT", "/v1/archive?path=w&replace=1", body=data[:700],
             expect=400)
    assert (dst / "later").exists()
    cl.error("PUT", "/v1/archive?path=w&replace=2", body=data, expect=400)


def tar_bytes(*members):
    """An archive of (TarInfo, data or None) built with Python's tarfile
    (which writes whatever names it is given)."""
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=tarfile.PAX_FORMAT) as t:
        for ti, data in members:
            if data is not None:
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
            else:
                t.addfile(ti)
    return b.getvalue()


def ti(name, type=tarfile.REGTYPE, linkname=""):
    t = tarfile.TarInfo(name)
    t.type = type
    t.linkname = linkname
    t.mode = 0o644
    return t


def test_archive_tar_slip_refused(cl, agent, tmp_path):
    root = Path(agent.root)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("precious")
    before = sorted(os.listdir(outside))
    evil = b"owned\n"
    cases = {
        "absolute": tar_bytes((ti(str(outside / "abs-evil")), evil)),
        "dotdot": tar_bytes((ti("../escape-evil"), evil)),
        "dotdot-inner": tar_bytes((ti("a/../../escape-evil"), evil)),
        "dotdot-rel": tar_bytes((ti("ok"), b"ok"),
                                (ti("../root/x/escape"), evil)),
        "symlink-write-through": tar_bytes(
            (ti("x", tarfile.SYMTYPE, str(outside)), None),
            (ti("x/victim"), evil)),
        "symlink-relative": tar_bytes(
            (ti("up", tarfile.SYMTYPE, "../../outside"), None),
            (ti("up/new-evil"), evil)),
        "symlink-dir-then-mkdir": tar_bytes(
            (ti("y", tarfile.SYMTYPE, str(outside)), None),
            (ti("y/sub", tarfile.DIRTYPE), None)),
        "hardlink-passwd": tar_bytes(
            (ti("pw", tarfile.LNKTYPE, "/etc/passwd"), None)),
        "hardlink-relative": tar_bytes(
            (ti("pw", tarfile.LNKTYPE, "../../../../../../etc/passwd"),
             None)),
        "hardlink-not-in-archive": tar_bytes(
            (ti("pw", tarfile.LNKTYPE, "sibling"), None)),
        "hardlink-via-symlink": tar_bytes(
            (ti("e", tarfile.SYMTYPE, "/etc"), None),
            (ti("pw", tarfile.LNKTYPE, "e/passwd"), None)),
    }
    (root / "sibling").write_text("sibling")
    for name, data in cases.items():
        st, err = cl.error("PUT", f"/v1/archive?path={q('in/' + name)}",
                           body=data, expect=400)
        assert "archive entry" in err["message"], (name, err)
        assert err["errno"] in ("EXDEV", "EINVAL"), (name, err)
    assert sorted(os.listdir(outside)) == before
    assert (outside / "victim").read_text() == "precious"
    assert not (root.parent / "escape-evil").exists()
    assert not (tmp_path / "escape-evil").exists()
    assert (root / "sibling").read_text() == "sibling"
    with open("/etc/passwd") as f:
        assert "owned" not in f.read()
    # a symlink to an outside place may exist in a tree; only writing
    # through it is refused (the first entry was extracted)
    assert os.readlink(root / "in" / "symlink-write-through" / "x") == \
        str(outside)
    # a path that escapes REL but stays in the root is refused as well
    (root / "other").mkdir()
    data = tar_bytes((ti("l", tarfile.SYMTYPE, "../other"), None),
                     (ti("l/f"), evil))
    st, err = cl.error("PUT", "/v1/archive?path=inner", body=data,
                       expect=400)
    assert err["errno"] == "EXDEV"
    assert not (root / "other" / "f").exists()
    # inside REL, symlinked directories and hard links work
    data = tar_bytes((ti("real", tarfile.DIRTYPE), None),
                     (ti("alias", tarfile.SYMTYPE, "real"), None),
                     (ti("alias/f"), b"via alias"),
                     (ti("h", tarfile.LNKTYPE, "alias/f"), None))
    cl.json("PUT", "/v1/archive?path=fine", body=data)
    assert (root / "fine" / "real" / "f").read_bytes() == b"via alias"
    assert os.stat(root / "fine" / "h").st_ino == \
        os.stat(root / "fine" / "real" / "f").st_ino


def test_archive_put_bad_archives(cl, agent, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"x" * 5000)
    data = gnu_tar("--format=pax", "-C", src, "-cf", "-", ".")
    # truncated in the data
    st, err = cl.error("PUT", "/v1/archive?path=t1", body=data[:3000],
                       expect=400)
    assert err["errno"] == "EINVAL"
    assert "truncated" in err["message"] and "offset 3000" in \
        err["message"], err
    # no end marker
    body = data.rstrip(b"\0")
    body += b"\0" * (-len(body) % 512)
    st, err = cl.error("PUT", "/v1/archive?path=t2", body=body, expect=400)
    assert f"offset {len(body)}" in err["message"], err
    assert (Path(agent.root) / "t2" / "f").read_bytes() == b"x" * 5000
    # a corrupt header: checksum mismatch, with its offset
    bad = bytearray(data)
    bad[512 * 3 + 5] ^= 0x20  # the header of ./f after ./ and pax
    st, err = cl.error("PUT", "/v1/archive?path=t3", body=bytes(bad),
                       expect=400)
    assert "offset" in err["message"], err
    # empty body and garbage
    st, err = cl.error("PUT", "/v1/archive?path=t4", body=b"", expect=400)
    assert "offset 0" in err["message"]
    st, err = cl.error("PUT", "/v1/archive?path=t5", body=b"hello" * 200,
                       expect=400)
    assert "offset 0" in err["message"]
    cl.json("GET", "/v1/health", token=False)


# -- --token-env -----------------------------------------------------------------

class EnvTokenAgent(Agent):
    def argv(self):
        return [self.binary, "serve", "--root", str(self.root),
                "--listen", f"{self.host}:{self.port}",
                "--token-env", "SBX_TEST_AGENT_TOKEN"]


def test_token_env(agent_bin, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    env = dict(os.environ)
    env["SBX_TEST_AGENT_TOKEN"] = "env-token-123 \n"
    a = EnvTokenAgent(agent_bin, root, tmp_path / "agent", env=env,
                      token="env-token-123").start()
    try:
        c = Client(a)
        assert c.json("GET", "/v1/info")["protocol"] == 1
        c.error("GET", "/v1/info", token="env-token-123 ", expect=401)
        # the variable is not inherited by commands the agent runs
        out, err, ex = run(c, ["sh", "-c",
                               "echo ${SBX_TEST_AGENT_TOKEN-unset}"])
        assert out == b"unset\n", out
        with open(f"/proc/{a.pid()}/environ", "rb") as f:
            assert b"env-token-123" not in f.read()
    finally:
        a.stop()
    out = a.output()
    assert "AddressSanitizer" not in out and "LeakSanitizer" not in out, out
    base = [str(agent_bin), "serve", "--root", str(root), "--listen",
            "127.0.0.1:0"]
    for value in (None, "", "  \n"):
        env = dict(os.environ)
        env.pop("SBX_TEST_AGENT_TOKEN", None)
        if value is not None:
            env["SBX_TEST_AGENT_TOKEN"] = value
        r = subprocess.run(base + ["--token-env", "SBX_TEST_AGENT_TOKEN"],
                           capture_output=True, text=True, timeout=10,
                           env=env)
        assert r.returncode == 1, r
        assert "SBX_TEST_AGENT_TOKEN" in r.stderr
        assert ("not set" if value is None else "empty") in r.stderr
    tok = tmp_path / "tok"
    tok.write_text("t\n")
    r = subprocess.run(base + ["--token-env", "X", "--token-file", str(tok)],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "not both" in r.stderr
    r = subprocess.run(base, capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "--token-env" in r.stderr


# -- token files, connections, NUL in paths (issue "Security and multi-user") --

def test_token_file_open_to_others_refused(agent_bin, tmp_path):
    """A token file that others may read is refused, as ssh refuses a key:
    the message names the file and says chmod 600."""
    root = tmp_path / "root"
    root.mkdir()
    tok = tmp_path / "tok"
    tok.write_text("s3cret-agent-token\n")
    base = [str(agent_bin), "serve", "--root", str(root), "--listen",
            "127.0.0.1:0", "--token-file", str(tok)]
    for mode in (0o644, 0o640, 0o604, 0o620):
        tok.chmod(mode)
        r = subprocess.run(base, capture_output=True, text=True, timeout=10)
        assert r.returncode == 1, (oct(mode), r)
        assert "chmod 600" in r.stderr and str(tok) in r.stderr, r
        assert "s3cret" not in r.stdout + r.stderr
    # 0600 and 0400 are fine; so is a pipe (bash's <(...)), whose mode is
    # the owner's only.
    for mode in (0o600, 0o400):
        tok.chmod(mode)
        p = subprocess.Popen(base, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            line = p.stdout.readline()
            assert line.startswith("listening on "), \
                (line, p.stderr.read() if p.poll() is not None else "")
        finally:
            p.terminate()
            p.wait(10)
            p.stdout.close()
            p.stderr.close()


def test_nul_in_url_refused(cl, agent):
    """%00 in a path used to cut it: d/f%00x read d/f."""
    root = Path(agent.root)
    (root / "d").mkdir()
    (root / "d" / "f").write_text("hello")
    for route in ("/v1/fs/read?path=d/f%00x", "/v1/fs/stat?path=d/f%00x",
                  "/v1/fs/list?path=d%00x", "/v1/fs/readlink?path=d/f%00",
                  "/v1/fs/bulk?path=d%00", "/v1/archive?path=d%00x",
                  "/v1/fs/read?path=d/f&offset=0%001",
                  "/v1/fs/st%00at?path=d/f"):
        st, err = cl.error("GET", route, expect=400)
        assert err["errno"] == "EINVAL" and "NUL" in err["message"], \
            (route, err)
    st, err = cl.error("PUT", "/v1/fs/write?path=d/f%00x&offset=0",
                       body=b"XXXX", expect=400)
    assert (root / "d" / "f").read_text() == "hello"
    # the same connection goes on normally after a refused request
    c = cl.conn()
    for route, want in (("/v1/fs/read?path=d/f%00x", 400),
                        ("/v1/fs/read?path=d/f", 200),
                        ("/v1/fs/read?path=d/f%00", 400),
                        ("/v1/fs/read?path=d%2Ff", 200)):
        c.request("GET", route, headers={"X-Sbx-Token": cl.token})
        r = c.getresponse()
        body = r.read()
        assert r.status == want, (route, r.status, body)
        if want == 200:
            assert body == b"hello"
    c.close()


def test_nul_in_json_refused(cl, agent):
    """"a\\u0000b" used to create "a"."""
    root = Path(agent.root)
    for ops in ([{"op": "create", "path": "a\u0000b"}],
                [{"op": "mkdir", "path": "m\u0000"}],
                [{"op": "symlink", "path": "l", "target": "t\u0000u"}],
                [{"op": "rename", "path": "x", "newpath": "y\u0000z"}]):
        st, err = cl.error("POST", "/v1/fs/batch", {"ops": ops},
                           expect=400)
        assert err["errno"] == "EINVAL", (ops, err)
    assert sorted(os.listdir(root)) == []
    st, err = cl.error("POST", "/v1/exec",
                       {"argv": ["touch", "e\u0000f"]}, expect=400)
    st, err = cl.error("POST", "/v1/exec",
                       {"argv": ["true"], "cwd": ".\u0000/x"}, expect=400)
    assert sorted(os.listdir(root)) == []
    # An escaped backslash followed by "u0000" is text, not a NUL.
    res = cl.batch([{"op": "create", "path": "back\\u0000"}])
    assert res[0].get("ok"), res
    assert os.listdir(root) == ["back\\u0000"]


def test_unlink_trailing_slash(cl, agent):
    """unlink "x/" removed the symlink x; POSIX says ENOTDIR."""
    root = Path(agent.root)
    (root / "d").mkdir()
    (root / "f").write_text("f")
    os.symlink("d", root / "x")
    os.symlink("f", root / "y")
    res = cl.batch([{"op": "unlink", "path": "x/"},
                    {"op": "unlink", "path": "y/"},
                    {"op": "unlink", "path": "f/"},
                    {"op": "unlink", "path": "d/"},
                    {"op": "unlink", "path": "nope/"},
                    {"op": "unlink", "path": "d/f//"}])
    errs = [r.get("error", {}).get("errno") for r in res]
    assert errs == ["ENOTDIR", "ENOTDIR", "ENOTDIR", "EISDIR", "ENOENT",
                    "ENOENT"], res
    assert os.path.islink(root / "x") and os.path.islink(root / "y")
    assert (root / "f").read_text() == "f"
    # without the slash: the link itself goes, its target stays
    res = cl.batch([{"op": "unlink", "path": "x"},
                    {"op": "unlink", "path": "y"}])
    assert all(r.get("ok") for r in res), res
    assert sorted(os.listdir(root)) == ["d", "f"]


@pytest.mark.slow
def test_unauthenticated_connections_cut(c1, one_agent):
    """Connections without the token are cut after a short header timeout
    and capped per address; a connection that showed the token keeps the
    long idle timeout (docs/protocol.md, "Connections")."""
    idle = []
    for _ in range(100):
        idle.append(socket.create_connection(one_agent.address, timeout=5))
    # a health check (no token) does not make a connection trusted
    h = c1.conn()
    h.request("GET", "/v1/health")
    assert h.getresponse().read()
    t = c1.conn()
    t.request("GET", "/v1/info", headers={"X-Sbx-Token": c1.token})
    assert json.loads(t.getresponse().read())["protocol"] == 1

    def open_count(socks):
        n = 0
        for s in socks:
            s.setblocking(False)
            try:
                n += s.recv(1) != b""
            except BlockingIOError:
                n += 1
            except OSError:
                pass
        return n

    # Beyond the per-address cap, connections are cut at once ...
    assert wait_for(lambda: open_count(idle) <= 64, timeout=5)
    # ... and the rest, untrusted, within their 10 s idle timeout.
    untrusted = idle + ([h.sock] if h.sock else [])
    assert wait_for(lambda: open_count(untrusted) == 0, timeout=20,
                    step=0.2)
    with pytest.raises((http.client.HTTPException, OSError)):
        h.request("GET", "/v1/health")
        h.getresponse().read()
    t.request("GET", "/v1/info", headers={"X-Sbx-Token": c1.token})
    assert json.loads(t.getresponse().read())["protocol"] == 1
    for s in idle:
        s.close()
    h.close()
    t.close()
