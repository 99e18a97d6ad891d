"""`sbx serve`: the session REST API (docs/api.md) and the opencode launcher
(contrib/opencode/sbx-opencode).

Every test runs a real `sbx serve` (on its default unix socket, or on
127.0.0.1 port 0 with a token, read from its "listening on" line) against
the local provider and real FUSE mounts.
"""

import base64
import http.client
import json
import os
import signal
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from exec_util import wait_for

SRC = Path(__file__).resolve().parents[2]


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a unix socket (as `curl --unix-socket`)."""

    def __init__(self, path, timeout=120):
        super().__init__("localhost", timeout=timeout)
        self.path = str(path)

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class Server:
    """A running `sbx serve`.  On TCP without --token-file the server
    generates a token and prints "token-file PATH" after its "listening on"
    line; self.token is then that file's token."""

    def __init__(self, env, *extra, run_as=None):
        self.env = env
        self.argv = [str(env.bin("sbx")), "serve", *map(str, extra)]
        self.p = subprocess.Popen(self.argv, env=env.env,
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        if not line.startswith("listening on "):
            self.p.kill()
            raise AssertionError(f"serve did not start: {line!r} "
                                 f"{self.p.stderr.read()}")
        self.address = line.split()[-1]
        self.unix = None
        self.token = None
        self.token_file = None
        if self.address.startswith("unix:"):
            self.unix = Path(self.address[5:])
            self.host, self.port = None, None
        else:
            host, port = self.address.rsplit(":", 1)
            self.host, self.port = host, int(port)
            if "--token-file" not in self.argv:
                line = self._readline(10)
                if not line.startswith("token-file "):
                    self.p.kill()
                    raise AssertionError(f"no token-file line: {line!r}")
                self.token_file = Path(line.split(" ", 1)[1].strip())
                self.token = self.token_file.read_text().split()[0]

    def _readline(self, timeout):
        got = []
        t = threading.Thread(target=lambda: got.append(
            self.p.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        return got[0] if got else ""

    def conn(self, timeout=120):
        if self.unix is not None:
            return UnixHTTPConnection(self.unix, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port,
                                          timeout=timeout)

    def request(self, method, path, body=None, headers=None, raw=None,
                timeout=120):
        h = dict(headers or {})
        if self.token and "Authorization" not in h and \
                "X-Sbx-Token" not in h:
            h["Authorization"] = "Bearer " + self.token
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        c = self.conn(timeout)
        try:
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            text = r.read().decode()
            return r.status, (json.loads(text) if text.strip() else None)
        finally:
            c.close()

    def stop(self):
        if self.p.stderr.closed:
            return self.err
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.err = self.p.stderr.read()
        self.p.stdout.close()
        self.p.stderr.close()
        return self.err


@pytest.fixture
def server(sbx_env):
    # The default: a unix socket in $SBX_HOME/run, for this user only.
    s = Server(sbx_env)
    yield s
    s.stop()
    assert s.p.returncode == 0


def body_for(repo, **kw):
    b = {"provider": "local", "repo": str(repo)}
    b.update(kw)
    return b


def assert_error(status, body, code, etype):
    assert status == code, body
    assert set(body) == {"error"}, body
    assert body["error"]["type"] == etype, body
    assert body["error"]["message"], body


def test_lifecycle_routes(sbx_env, repo, server):
    st, body = server.request("GET", "/session")
    assert (st, body) == (200, [])
    st, body = server.request("GET", "/session/t1/sandbox")
    assert_error(st, body, 404, "NotFoundError")

    st, body = server.request("POST", "/session/t1/sandbox", body_for(repo))
    assert st == 200, body
    assert body["session"] == "t1" and body["state"] == "ready"
    mnt = Path(body["mountpoint"])
    assert (mnt / "README.md").read_text() == "# sample\n"

    # The same status object as `sbx status --json`.
    cli = sbx_env.sbx_ok("status", "t1", "--json").json()
    st, got = server.request("GET", "/session/t1/sandbox")
    assert st == 200 and got == cli
    st, arr = server.request("GET", "/session")
    assert st == 200 and arr == [cli]

    # Get-or-create: a second POST returns the live session.
    st, again = server.request("POST", "/session/t1/sandbox", body_for(repo))
    assert st == 200 and again["sandbox_id"] == body["sandbox_id"]

    st, snap = server.request("POST", "/session/t1/sandbox/snapshot",
                              {"message": "before"})
    assert st == 201, snap
    sid = snap["id"]
    st, snaps = server.request("GET", "/session/t1/sandbox/snapshots")
    assert st == 200 and sid in [s["id"] for s in snaps]
    assert [s["message"] for s in snaps if s["id"] == sid] == ["before"]

    (mnt / "after.txt").write_text("x\n")
    st, res = server.request("POST", "/session/t1/sandbox/restore",
                             {"snapshot": sid})
    assert st == 200 and res["restored"] == sid, res
    assert not (mnt / "after.txt").exists()

    st, res = server.request("DELETE", "/session/t1/sandbox")
    # The restore's safety snapshot is fine; the worktree is clean.
    assert st == 200 and res == {"session": "t1", "state": "stopped"}, res
    assert not sbx_env.state_file("t1").exists()
    st, body = server.request("GET", "/session/t1/sandbox")
    assert_error(st, body, 404, "NotFoundError")
    st, body = server.request("DELETE", "/session/t1/sandbox")
    assert_error(st, body, 404, "NotFoundError")


def test_down_refuses_uncommitted_work(sbx_env, repo, server):
    st, body = server.request("POST", "/session/t1/sandbox", body_for(repo))
    assert st == 200, body
    Path(body["mountpoint"], "work.txt").write_text("precious\n")
    st, err = server.request("DELETE", "/session/t1/sandbox")
    assert_error(st, err, 409, "FileError")
    # Refused: still there and mounted, as `sbx down` leaves it.
    assert Path(body["mountpoint"], "work.txt").exists()
    st, res = server.request("DELETE", "/session/t1/sandbox?force=true")
    assert st == 200, res


def test_request_errors(sbx_env, repo, server):
    st, b = server.request("POST", "/session/t1/sandbox", raw=b"{nope")
    assert_error(st, b, 400, "ConfigError")
    st, b = server.request("POST", "/session/t1/sandbox", raw=b"[1]")
    assert_error(st, b, 400, "ConfigError")
    st, b = server.request("POST", "/session/t1/sandbox", {"bogus": 1})
    assert_error(st, b, 400, "ConfigError")
    st, b = server.request("POST", "/session/t1/sandbox",
                           {"provider": "nosuch", "repo": str(repo)})
    assert_error(st, b, 400, "ConfigError")
    assert not sbx_env.state_file("t1").exists()
    st, b = server.request("POST", "/session/t1/sandbox",
                           {"provider": "local",
                            "repo": str(sbx_env.root / "nothere")})
    assert st in (400, 500) and b["error"]["type"] in (
        "ConfigError", "CreateError"), b
    st, b = server.request("GET", "/session/..bad/sandbox")
    assert_error(st, b, 400, "ConfigError")
    st, b = server.request("GET", "/nowhere")
    assert_error(st, b, 404, "NotFoundError")
    st, b = server.request("PUT", "/session/t1/sandbox")
    assert_error(st, b, 405, "ConfigError")
    st, b = server.request("POST", "/session/t1/sandbox/snapshot")
    assert_error(st, b, 404, "NotFoundError")
    st, b = server.request("GET", "/session/t1/sandbox/snapshots")
    assert_error(st, b, 404, "NotFoundError")
    st, b = server.request("POST", "/session/t1/sandbox/restore", {})
    assert_error(st, b, 400, "ConfigError")
    st, b = server.request("POST", "/session/t1/sandbox/exec",
                           {"argv": ["true"]})
    assert_error(st, b, 404, "NotFoundError")
    st, b = server.request("POST", "/session/t1/sandbox/exec", {"argv": []})
    assert_error(st, b, 400, "ConfigError")


def test_concurrent_posts_create_once(sbx_env, repo, server):
    results = []

    def post():
        results.append(server.request("POST", "/session/t1/sandbox",
                                      body_for(repo)))

    ts = [threading.Thread(target=post) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert [st for st, _ in results] == [200, 200], results
    a, b = (body for _, body in results)
    assert a["sandbox_id"] == b["sandbox_id"]
    assert a["mountpoint"] == b["mountpoint"]
    # One worktree, one branch, one session, and no "reusing" adoption.
    wts = sbx_env.git("worktree", "list", "--porcelain", cwd=repo).out
    assert wts.count("worktree ") == 2, wts
    assert sbx_env.session_names() == ["t1"]
    st, _ = server.request("DELETE", "/session/t1/sandbox")
    assert st == 200
    assert "reusing the existing sandbox" not in server.stop()


def read_ndjson(server, name, req):
    c = server.conn()
    h = {"Content-Type": "application/json"}
    if server.token:
        h["X-Sbx-Token"] = server.token
    c.request("POST", f"/session/{name}/sandbox/exec",
              body=json.dumps(req).encode(), headers=h)
    r = c.getresponse()
    assert r.status == 200, r.read()
    assert r.getheader("Content-Type") == "application/x-ndjson"
    events = [json.loads(line) for line in r.read().decode().splitlines()]
    c.close()
    return events


def test_exec_streaming(sbx_env, repo, server):
    st, body = server.request("POST", "/session/t1/sandbox", body_for(repo))
    assert st == 200, body
    ev = read_ndjson(server, "t1", {
        "argv": ["sh", "-c",
                 "echo out1; echo err1 >&2; pwd; echo $FOO; "
                 "echo made > made.txt; exit 3"],
        "cwd": "src", "env": {"FOO": "bar"}})
    assert ev[-1] == {"exit": 3}, ev
    assert all("exit" not in e for e in ev[:-1])
    out = b"".join(base64.b64decode(e["data_b64"]) for e in ev[:-1]
                   if e["stream"] == "stdout").decode()
    err = b"".join(base64.b64decode(e["data_b64"]) for e in ev[:-1]
                   if e["stream"] == "stderr").decode()
    assert out.splitlines() == ["out1", str(sbx_env.worktree("t1") / "src"),
                                "bar"], out
    assert err == "err1\n"
    # The exec barrier: the file is in the mount when the stream ends.
    assert Path(body["mountpoint"], "src", "made.txt").read_text() == "made\n"

    # Large output arrives whole, in order.
    ev = read_ndjson(server, "t1", {"argv": ["sh", "-c",
                                             "seq 1 200000"]})
    out = b"".join(base64.b64decode(e["data_b64"]) for e in ev[:-1])
    assert out.decode().split() == [str(i) for i in range(1, 200001)]
    assert ev[-1] == {"exit": 0}

    ev = read_ndjson(server, "t1", {"argv": ["no-such-command-xyz"]})
    assert ev[-1]["exit"] == 127, ev
    sbx_env.sbx_ok("down", "t1", "--force")


def sse_events(resp, want, timeout=60):
    """Read `want` session events from an SSE response."""
    got, data = [], []
    end = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < end:
        line = resp.readline().decode()
        if not line:
            break
        line = line.rstrip("\n")
        if line.startswith("data: "):
            data.append(line[6:])
        elif line == "" and data:
            got.append(json.loads("\n".join(data)))
            data = []
    return got


def test_events_create_ready_stopped(sbx_env, repo, server):
    c = server.conn(timeout=60)
    c.request("GET", "/events")
    r = c.getresponse()
    assert r.status == 200
    assert r.getheader("Content-Type") == "text/event-stream"

    st, body = server.request("POST", "/session/t1/sandbox?wait=false",
                              body_for(repo))
    assert st == 202, body
    assert body["session"] == "t1" and body["state"] == "creating"
    ev = sse_events(r, 2)
    assert [(e["session"], e["state"]) for e in ev] == [
        ("t1", "creating"), ("t1", "ready")], ev
    assert ev[1]["status"]["mountpoint"]
    st, got = server.request("GET", "/session/t1/sandbox")
    assert st == 200 and got["state"] == "ready"
    # Live already: wait=false answers 200 at once.
    st, got = server.request("POST", "/session/t1/sandbox?wait=false",
                             body_for(repo))
    assert st == 200 and got["state"] == "ready"

    st, _ = server.request("DELETE", "/session/t1/sandbox")
    assert st == 200
    ev = sse_events(r, 1)
    assert [(e["session"], e["state"]) for e in ev] == [("t1", "stopped")]
    c.close()


def test_token_required(sbx_env, repo):
    tok = sbx_env.root / "token"
    tok.write_text("s3cret-token\n")
    tok.chmod(0o600)
    s = Server(sbx_env, "--listen", "127.0.0.1:0", "--token-file", tok)
    try:
        for h in ({}, {"X-Sbx-Token": "wrong"},
                  {"Authorization": "Bearer s3cret-tokex"},
                  {"Authorization": "Bearer s3cret-token2"},
                  {"Authorization": "Basic s3cret-token"}):
            for method, path in (("GET", "/session"), ("GET", "/events"),
                                 ("POST", "/session/t1/sandbox"),
                                 ("DELETE", "/session/t1/sandbox")):
                st, b = s.request(method, path, headers=h)
                assert_error(st, b, 401, "AuthError")
        assert not sbx_env.state_file("t1").exists()
        st, b = s.request("GET", "/session",
                          headers={"Authorization": "Bearer s3cret-token"})
        assert (st, b) == (200, [])
        st, b = s.request("GET", "/session",
                          headers={"X-Sbx-Token": "s3cret-token"})
        assert (st, b) == (200, [])
    finally:
        s.stop()


def test_listen_rules(sbx_env, tmp_path):
    r = sbx_env.sbx("serve", "--listen", "0.0.0.0:0", timeout=10)
    assert r.rc == 5 and "loopback" in r.err, r
    r = sbx_env.sbx("serve", "--listen", "nonsense", timeout=10)
    assert r.rc == 5, r
    # A unix socket, owner-only.
    sock = tmp_path / "api.sock"
    p = subprocess.Popen([str(sbx_env.bin("sbx")), "serve", "--listen",
                          f"unix:{sock}"], env=sbx_env.env,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == f"listening on unix:{sock}"
        assert stat.S_IMODE(sock.stat().st_mode) & 0o077 == 0
        import socket
        u = socket.socket(socket.AF_UNIX)
        u.connect(str(sock))
        u.sendall(b"GET /session HTTP/1.1\r\nHost: x\r\n"
                  b"Connection: close\r\n\r\n")
        data = b""
        while chunk := u.recv(65536):
            data += chunk
        u.close()
        assert data.startswith(b"HTTP/1.1 200"), data
        assert data.rstrip().endswith(b"[]")
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) == 0
        p.stdout.close()
    assert not sock.exists()


def test_oversized_body(sbx_env, server):
    # A declared Content-Length over 1 MiB is refused before the body is
    # read: send the headers only and read the answer.
    c = server.conn()
    c.putrequest("POST", "/session/t1/sandbox")
    c.putheader("Content-Type", "application/json")
    c.putheader("Content-Length", str((1 << 20) + 1))
    c.endheaders()
    r = c.getresponse()
    assert r.status == 413
    b = json.loads(r.read())
    assert_error(413, b, 413, "ConfigError")
    c.close()
    # Exactly 1 MiB is accepted (and then refused for its content).
    pad = b'{"provider":"' + b"x" * ((1 << 20) - 16) + b'"}'
    assert len(pad) <= 1 << 20
    st, b = server.request("POST", "/session/t1/sandbox", raw=pad)
    assert_error(st, b, 400, "ConfigError")

    # Chunked (no Content-Length): refused at the cap as well.
    c = server.conn()
    c.putrequest("POST", "/session/t1/sandbox")
    c.putheader("Transfer-Encoding", "chunked")
    c.endheaders()
    try:
        for _ in range(20):
            piece = b"x" * (128 << 10)
            c.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        c.send(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    r = c.getresponse()
    assert r.status == 413
    assert json.loads(r.read())["error"]["type"] == "ConfigError"
    c.close()
    assert not sbx_env.state_file("t1").exists()


FAKE_OPENCODE = r"""#!/bin/sh
# A stand-in for opencode: records what it was started with, then runs a
# command the way opencode 1.18's `!` shell does:
#   <shell> -l -c '<script>' opencode <cwd>
out="$FAKE_OPENCODE_OUT"
{
  echo "cwd=$(pwd)"
  echo "shell=$SHELL"
  echo "args=$*"
} > "$out/launch.txt"
"$SHELL" -l -c 'cd "$1" && pwd > bang-pwd.txt && echo "ran $0" && pwd' \
  opencode "$(pwd)" > "$out/bang.txt" 2>&1 </dev/null
echo "status=$?" >> "$out/launch.txt"
# opencode's bash tool: <shell> -c '<command>' with cwd in the mount.
"$SHELL" -c 'echo tool > tool.txt; uname -n' > "$out/tool.txt" 2>&1 \
  </dev/null
"""


def test_opencode_launcher(sbx_env, repo, tmp_path):
    fake_bin = tmp_path / "fakebin"
    fake_bin.mkdir()
    oc = fake_bin / "opencode"
    oc.write_text(FAKE_OPENCODE)
    oc.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    # The sandbox section of opencode.json chooses the provider.
    (repo / "opencode.json").write_text(json.dumps(
        {"$schema": "https://opencode.ai/config.json",
         "sandbox": {"provider": "local"}}))
    sbx_dir = sbx_env.bin("sbx").parent
    env = {"PATH": f"{fake_bin}:{sbx_dir}:{os.environ['PATH']}",
           "FAKE_OPENCODE_OUT": str(out)}
    r = sbx_env.run([SRC / "contrib/opencode/sbx-opencode", "oc1", "--",
                     "--model", "x/y"], cwd=repo, env=env, timeout=120)
    assert r.rc == 0, r
    mnt = sbx_env.mount_root / "oc1"
    wt = sbx_env.worktree("oc1")
    launch = dict(line.split("=", 1)
                  for line in (out / "launch.txt").read_text().splitlines())
    assert launch["cwd"] == str(mnt)
    shims = sbx_env.home / "shims"
    assert launch["shell"] == str(shims / "bash")
    assert os.readlink(shims / "bash").endswith("sbx-exec")
    assert launch["args"] == "--model x/y"
    assert launch["status"] == "0", (out / "bang.txt").read_text()
    # The `!` script ran in the sandbox: its cwd argument (a mount path)
    # was translated, so pwd is the worktree, and its file is there.
    bang = (out / "bang.txt").read_text().splitlines()
    assert bang == ["ran opencode", str(wt)], bang
    assert (wt / "bang-pwd.txt").read_text() == f"{wt}\n"
    assert (mnt / "bang-pwd.txt").read_text() == f"{wt}\n"
    assert (wt / "tool.txt").read_text() == "tool\n"
    st = sbx_env.sbx_ok("status", "oc1", "--json").json()
    assert st["provider"] == "local"
    sbx_env.sbx_ok("down", "oc1", "--force")


def test_exec_client_gone(sbx_env, repo, server):
    st, body = server.request("POST", "/session/t1/sandbox", body_for(repo))
    assert st == 200, body
    c = server.conn()
    c.request("POST", "/session/t1/sandbox/exec", body=json.dumps(
        {"argv": ["sh", "-c", "for i in $(seq 40); do echo $i; "
                  "sleep 0.05; done; echo end > end.txt"]}).encode())
    r = c.getresponse()
    assert r.status == 200
    first = json.loads(r.readline())
    assert base64.b64decode(first["data_b64"]).startswith(b"1\n")
    c.close()  # gone mid-stream
    # The server keeps serving; the command sees EPIPE and ends.
    st, got = server.request("GET", "/session/t1/sandbox")
    assert st == 200 and got["state"] == "ready"
    ev = read_ndjson(server, "t1", {"argv": ["true"]})
    assert ev == [{"exit": 0}]
    # ... and is gone before the session is taken down.
    assert wait_for(lambda: not procs_running("end.txt", sbx_env.root),
                    timeout=15), procs_running("end.txt", sbx_env.root)
    sbx_env.sbx_ok("down", "t1", "--force")


def procs_running(marker, under):
    """Pids whose command line has `marker` and whose cwd is below
    `under` (this test's own, not another run's)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            cwd = os.readlink(d / "cwd")
        except OSError:
            continue
        if marker.encode() in cmd and cwd.startswith(str(under)):
            found.append(int(d.name))
    return found


# ---- who can reach the API (docs/api.md, "Who can reach it") ---------------

NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534",
          "--clear-groups"]

# Run as another user: one HTTP request to the server, prints
# "STATUS BODY" or "ERR <exception>".  Raw sockets, the whole request in
# one write: a server that answers 403 before reading the body may close
# while a client still sends it.
CLIENT = r"""
import socket, sys
where, method, path = sys.argv[1], sys.argv[2], sys.argv[3]
body = b"{}" if method == "POST" else b""
head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n")
if len(sys.argv) > 4:
    head += f"Authorization: Bearer {sys.argv[4]}\r\n"
try:
    if where.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(where[5:])
    else:
        host, port = where.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=10)
    try:
        s.sendall(head.encode() + b"\r\n" + body)
    except (BrokenPipeError, ConnectionResetError):
        pass
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    status = data.split(b"\r\n", 1)[0].split()[1].decode()
    print(status, data.split(b"\r\n\r\n", 1)[1].decode().strip())
except Exception as e:
    print("ERR", type(e).__name__, e)
"""


def as_nobody(address, method, path, token=None):
    argv = [*NOBODY, "/usr/bin/python3", "-c", CLIENT, address, method,
            path] + ([token] if token else [])
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                       cwd="/")
    assert p.returncode == 0, p
    return p.stdout.strip()


@pytest.fixture
def shared_dir():
    """A directory every user can enter (the test tree is root's 0700)."""
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="sbx-serve-"))
    d.chmod(0o755)
    yield d
    import shutil
    shutil.rmtree(d, ignore_errors=True)


def tcp_listeners(pid):
    """The TCP sockets process `pid` holds (inodes in /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            t = os.readlink(fd)
        except OSError:
            continue
        if t.startswith("socket:["):
            inodes.add(t[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[9] in inodes:
                found.append(f[1])
    return found


def test_default_is_a_private_unix_socket(sbx_env, repo):
    """Issue item 3: the default was 127.0.0.1:7077 without a token, so any
    local user could create sessions and run commands as the server's user.
    Now it is a unix socket in a 0700 directory, nothing on TCP."""
    s = Server(sbx_env)
    try:
        sock = sbx_env.home / "run" / "serve.sock"
        assert s.address == f"unix:{sock}", s.address
        st = sock.parent.stat()
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
        assert stat.S_IMODE(sock.stat().st_mode) & 0o077 == 0
        assert tcp_listeners(s.p.pid) == []
        assert s.request("GET", "/session") == (200, [])
        # Another user: the directory keeps it out.
        out = as_nobody(s.address, "POST", "/session/evil/sandbox")
        assert out.startswith("ERR PermissionError"), out
        assert not sbx_env.state_file("evil").exists()
    finally:
        s.stop()
    assert s.p.returncode == 0
    assert not sock.exists()


def test_default_socket_in_xdg_runtime_dir(sbx_env, tmp_path):
    # Without SBX_HOME: $XDG_RUNTIME_DIR/sbx/serve.sock.
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    env = dict(sbx_env.env)
    env.pop("SBX_HOME")
    env["XDG_RUNTIME_DIR"] = str(rt)
    p = subprocess.Popen([str(sbx_env.bin("sbx")), "serve"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        line = p.stdout.readline().strip()
        assert line == f"listening on unix:{rt}/sbx/serve.sock", \
            (line, p.stderr.read() if p.poll() is not None else "")
        assert stat.S_IMODE((rt / "sbx").stat().st_mode) == 0o700
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) == 0
        p.stdout.close()
        p.stderr.close()


def test_unix_socket_peer_credentials(sbx_env, repo, shared_dir):
    """Even a socket others can open (a shared directory, a chmod) serves
    only the server's user and root: SO_PEERCRED."""
    sock = shared_dir / "api.sock"
    s = Server(sbx_env, "--listen", f"unix:{sock}")
    try:
        sock.chmod(0o666)
        for method, path in (("GET", "/session"),
                             ("POST", "/session/evil/sandbox")):
            out = as_nobody(s.address, method, path)
            assert out.startswith("403 "), out
            assert json.loads(out[4:])["error"]["type"] == "AuthError"
        assert not sbx_env.state_file("evil").exists()
        assert s.request("GET", "/session") == (200, [])
    finally:
        s.stop()
    # --socket PATH is the same as --listen unix:PATH.
    s = Server(sbx_env, "--socket", sock)
    try:
        assert s.address == f"unix:{sock}"
        assert s.request("GET", "/session") == (200, [])
    finally:
        s.stop()
    r = sbx_env.sbx("serve", "--socket", sock, "--listen", "127.0.0.1:0",
                    timeout=10)
    assert r.rc == 2, r


def test_tcp_generates_a_token(sbx_env, repo):
    """TCP reaches every local user: without --token-file the server makes
    a token, writes it to a 0600 file and prints the file's path."""
    s = Server(sbx_env, "--listen", "127.0.0.1:0")
    try:
        tf = s.token_file
        assert tf is not None and tf.parent == sbx_env.home / "run", tf
        assert stat.S_IMODE(tf.stat().st_mode) == 0o600
        assert len(s.token) >= 32
        st, b = s.request("GET", "/session",
                          headers={"X-Sbx-Token": "wrong"})
        assert_error(st, b, 401, "AuthError")
        c = s.conn()
        c.request("GET", "/session")
        r = c.getresponse()
        assert r.status == 401, r.read()
        c.close()
        assert s.request("GET", "/session") == (200, [])
        out = as_nobody(s.address, "POST", "/session/evil/sandbox")
        assert out.startswith("401 "), out
        assert not sbx_env.state_file("evil").exists()
        assert s.token not in s.stop()
    finally:
        s.stop()
    assert not tf.exists()


def test_token_file_open_to_others_refused(sbx_env):
    """Issue item 5, for `sbx serve --token-file`: like ssh with a key."""
    tok = sbx_env.root / "token"
    tok.write_text("s3cret-token\n")
    for mode in (0o644, 0o640, 0o604):
        tok.chmod(mode)
        r = sbx_env.sbx("serve", "--listen", "127.0.0.1:0", "--token-file",
                        tok, timeout=10)
        assert r.rc == 5, r
        assert "chmod 600" in r.err and str(tok) in r.err, r
        assert "s3cret" not in r.text
