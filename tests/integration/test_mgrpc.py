"""End-to-end tests of sbx's gRPC client (providers/modal/mgrpc.c).

A tiny grpcio server (tests/fakes/grpc_test_server.py) runs in this process
over TLS with a throw-away self-signed certificate; the C side is
tests/modal/mgrpc_driver (built by meson), which prints one line per
result.  No FUSE, no Modal account.

    /usr/bin/python3 -m pytest tests/integration/test_mgrpc.py \\
        --build-dir=build -v
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.nofuse

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fakes"))

grpc = pytest.importorskip("grpc")
if not shutil.which("protoc") or not shutil.which("openssl"):
    pytest.skip("protoc and openssl are needed", allow_module_level=True)

import grpc_test_server  # noqa: E402


@pytest.fixture(scope="module")
def driver(request):
    # Only the driver is needed, not the whole build (conftest's build_dir
    # insists on cli/sbx).
    d = (request.config.getoption("--build-dir")
         or os.environ.get("MESON_BUILD_DIR") or str(REPO / "build"))
    exe = Path(d).resolve() / "tests" / "modal" / "mgrpc_driver"
    if not exe.exists():
        pytest.fail("%s is missing: build with ninja first" % exe)
    return exe


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def server(tls, tmp_path_factory):
    api, router = grpc_test_server.load_protos(
        tmp_path_factory.mktemp("pb2"))
    fake = grpc_test_server.FakeGrpc(api, router)
    fake.start(tls[0].read_bytes(), tls[1].read_bytes())
    yield fake
    fake.stop()


def run(driver, server, tls, *args, url=None, ca=True, timeout=60):
    """Run the driver; returns its output lines."""
    cmd = [str(driver)]
    if ca:
        cmd += ["--ca", str(tls[0])]
    cmd += list(args[:-2])
    cmd += [url or "https://localhost:%d" % server.port] + list(args[-2:])
    p = subprocess.run(cmd, capture_output=True, timeout=timeout,
                       env=dict(os.environ))
    out = p.stdout.decode("utf-8", "replace")
    assert p.returncode == 0, (cmd, out, p.stderr.decode())
    # Sanitizer builds: any report fails the test.
    assert b"Sanitizer" not in p.stderr and b"runtime error" not in p.stderr, \
        p.stderr.decode()
    return out.splitlines()


def fields(line):
    """'ok a=1 b=2 msg=rest of line' -> {'kind': 'ok', 'a': '1', ...}"""
    kind, _, rest = line.partition(" ")
    d = {"kind": kind}
    if "msg=" in rest:
        rest, _, msg = rest.partition("msg=")
        d["msg"] = msg
    for tok in rest.split():
        k, _, v = tok.partition("=")
        d[k] = v
    return d


def calls_for(server, method, pred=lambda md, req: True):
    return [(md, req) for m, md, req in list(server.calls)
            if m == method and pred(md, req)]


def test_unary_ok(driver, server, tls):
    (line,) = run(driver, server, tls, "unary", "ok")
    f = fields(line)
    assert f["kind"] == "ok" and f["app_id"] == "ap-ok", line
    assert f["attempts"] == "1"


def test_metadata_and_deadline_sent(driver, server, tls):
    lines = run(driver, server, tls,
                "--header", "X-Modal-Token-Id: ak-test",
                "--header", "x-modal-token-secret: as-test",
                "--header", "x-modal-client-type: 9",
                "--deadline", "7000", "unary", "echo-md")
    f = fields(lines[0])
    assert f["kind"] == "ok", lines
    got = json.loads(lines[0].split("app_id=", 1)[1].rsplit(" attempts=", 1)[0])
    md = got["md"]
    assert md["x-modal-token-id"] == "ak-test"
    assert md["x-modal-token-secret"] == "as-test"
    assert md["x-modal-client-type"] == "9"
    # grpc-timeout reached the server: its deadline is at most 7 s away.
    assert 0 < got["remaining"] <= 7.0
    # Without --retry, no retry metadata.
    assert "x-idempotency-key" not in md and "x-retry-attempt" not in md


def test_error_status_percent_encoded_message(driver, server, tls):
    (line,) = run(driver, server, tls, "unary", "notfound")
    f = fields(line)
    assert f["kind"] == "err", line
    assert f["errno"] == "ENOENT" and f["status"] == "5"
    assert f["detail"] == "5"
    assert "AppGetOrCreate" in f["msg"] and "NOT_FOUND" in f["msg"]
    assert "App 'x' not found: 100% gone, ünïcode\tend" in f["msg"], f["msg"]


def test_unauthenticated_says_what_to_check(driver, server, tls):
    (line,) = run(driver, server, tls, "unary", "unauth")
    f = fields(line)
    assert f["errno"] == "EACCES" and f["status"] == "16"
    assert "UNAUTHENTICATED" in f["msg"] and "bad token" in f["msg"]
    assert "MODAL_TOKEN_ID" in f["msg"] and ".modal.toml" in f["msg"]


def test_trailers_only_error(driver, server, tls):
    (line,) = run(driver, server, tls, "unary", "trailers-only")
    f = fields(line)
    assert f["errno"] == "EINVAL" and f["status"] == "3", line
    assert "INVALID_ARGUMENT: bad app name" in f["msg"]


def timed_retry(driver, server, tls, app):
    """One unary call with retries: (fields, line, seconds it took)."""
    t = time.monotonic()
    (line,) = run(driver, server, tls, "--retry", "unary", app)
    return fields(line), line, time.monotonic() - t


def test_retries_on_unavailable(driver, server, tls):
    f, line, took = timed_retry(driver, server, tls, "flaky-2")
    assert f["kind"] == "ok" and f["app_id"] == "ap-flaky", line
    assert f["attempts"] == "3"
    assert took >= 0.3  # 100 ms + 200 ms of backoff
    keys = {}
    for md, req in calls_for(server, "AppGetOrCreate",
                             lambda md, req: req.app_name == "flaky-2"):
        keys.setdefault(md["x-idempotency-key"], []).append(
            int(md["x-retry-attempt"]))
    # One logical call: one key, attempts numbered 0, 1, 2.
    assert len(keys) == 1, keys
    (key, attempts), = keys.items()
    assert len(key) == 36 and key[14] == "4", key
    assert attempts == [0, 1, 2]


def test_retries_give_up(driver, server, tls):
    f, line, took = timed_retry(driver, server, tls, "flaky-99")
    assert f["kind"] == "err" and f["errno"] == "EAGAIN", line
    assert f["status"] == "14" and f["attempts"] == "4"
    assert "after 4 attempts" in f["msg"] and "UNAVAILABLE" in f["msg"]
    assert took >= 0.7  # 100 + 200 + 400 ms


def test_no_retry_without_flag(driver, server, tls):
    (line,) = run(driver, server, tls, "unary", "flaky-1")
    f = fields(line)
    assert f["errno"] == "EAGAIN" and f["attempts"] == "1", line


def test_deadline_exceeded(driver, server, tls):
    t = time.monotonic()
    (line,) = run(driver, server, tls, "--deadline", "500", "unary", "slow")
    took = time.monotonic() - t
    f = fields(line)
    assert f["kind"] == "err" and f["errno"] == "ETIMEDOUT", line
    assert took < 2.5
    assert f["status"] == "4"  # DEADLINE_EXCEEDED, client or server side
    assert "AppGetOrCreate" in f["msg"] and "DEADLINE_EXCEEDED" in f["msg"]


def test_stream_delivers_messages_one_by_one(driver, server, tls):
    lines = run(driver, server, tls, "stream", "im-4")
    msgs = [fields(x) for x in lines if x.startswith("msg ")]
    assert [m["entry_id"] for m in msgs] == ["0", "1", "2", "3"], lines
    assert [m["eof"] for m in msgs] == ["0", "0", "0", "1"]
    ts = [int(m["t"]) for m in msgs]
    # The server sleeps 0.3 s between messages: each arrived on its own.
    for a, b in zip(ts, ts[1:]):
        assert b - a >= 200, ts
    assert fields(lines[-1])["kind"] == "ok", lines


def test_stream_callback_stops(driver, server, tls):
    lines = run(driver, server, tls, "--stop-after", "2", "stream", "im-5")
    assert len([x for x in lines if x.startswith("msg ")]) == 2, lines
    f = fields(lines[-1])
    assert f["kind"] == "stopped" and f["rc"] == "42", lines


def test_stream_error_after_messages(driver, server, tls):
    lines = run(driver, server, tls, "--retry", "stream", "im-fail")
    assert lines[0].startswith("msg entry_id=0"), lines
    f = fields(lines[-1])
    assert f["kind"] == "err" and f["errno"] == "EIO", lines
    assert f["status"] == "13" and "INTERNAL: build broke" in f["msg"]
    # A message was delivered: no retry even with --retry.
    assert f["attempts"] == "1"


def test_command_router_service(driver, server, tls):
    (line,) = run(driver, server, tls,
                  "--header", "authorization: Bearer jwt-x",
                  "snapshot", "ta-1")
    f = fields(line)
    assert f["kind"] == "ok" and f["image_id"] == "im-snap-ta-1", line
    md, req = calls_for(server, "TaskSnapshotFilesystem")[-1]
    assert md["authorization"] == "Bearer jwt-x"
    assert req.snapshot_id == "00000000-0000-4000-8000-000000000000"


def test_concurrent_calls_share_a_channel(driver, server, tls):
    lines = run(driver, server, tls, "--threads", "8", "unary", "ok")
    assert len(lines) == 8
    assert all(fields(x)["app_id"] == "ap-ok" for x in lines), lines


def test_connection_refused(driver, server, tls):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    (line,) = run(driver, server, tls, "unary", "ok",
                  url="https://127.0.0.1:%d" % port)
    f = fields(line)
    assert f["kind"] == "err" and f["errno"] == "ECONNREFUSED", line
    assert f["status"] == "0" and f["class"] == "3"  # SBX_ERR_HTTP
    assert "AppGetOrCreate" in f["msg"]


def test_untrusted_certificate(driver, server, tls):
    (line,) = run(driver, server, tls, "unary", "ok", ca=False)
    f = fields(line)
    assert f["kind"] == "err" and f["status"] == "0", line
    assert f["class"] == "3"
    assert "certificate" in f["msg"].lower() or "ssl" in f["msg"].lower()


def test_bad_url_and_header(driver, server, tls):
    (line,) = run(driver, server, tls, "unary", "ok", url="ftp://x")
    assert fields(line)["errno"] == "EINVAL" and "https://" in line
    (line,) = run(driver, server, tls, "--header", "no-colon", "unary", "ok")
    assert fields(line)["errno"] == "EINVAL" and "metadata" in line
