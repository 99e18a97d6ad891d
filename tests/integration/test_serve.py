"""`sbx serve`: the session REST API (docs/api.md) and the opencode launcher
(contrib/opencode/sbx-opencode).

Every test runs a real `sbx serve` on 127.0.0.1 (port 0, read from its
"listening on" line) against the local provider and real FUSE mounts.
"""

import base64
import http.client
import json
import os
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2]


class Server:
    def __init__(self, env, *extra):
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
        host, port = line.split()[-1].rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.token = None

    def conn(self, timeout=120):
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
    s = Server(sbx_env, "--listen", "127.0.0.1:0")
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
    time.sleep(2.5)
    sbx_env.sbx_ok("down", "t1", "--force")
