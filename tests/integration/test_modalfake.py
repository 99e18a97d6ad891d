"""Tests of the fake Modal gRPC server (tests/fakes/modal_server.py).

No FUSE, no Modal account: the fake runs on loopback with TLS; it is driven
here with Python grpcio over TLS (the fake's CA), with the message classes
generated from providers/modal/*.proto, and it runs real sbx-agent
processes, reached over HTTPS at the sandbox's tunnel.

    /usr/bin/python3 -m pytest tests/integration/test_modalfake.py \\
        --build-dir=build -v

Fixtures defined here (reusable by other test files that import them):
    modal_fake     one fake for the module (ModalFake), fast build steps
    pb             the generated modal_api_pb2 module
"""

import base64
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import tomllib
import urllib.request
import uuid
from pathlib import Path

import pytest
from testenv.fakeproc import start_logged, wait_ready

pytestmark = pytest.mark.nofuse

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "fakes" / "modal_server.py"
PYTHON = "/usr/bin/python3"
AGENT_TOKEN = "modal-agent-token-0123"
BASE_IMAGE = "python:3.11-slim"

sys.path.insert(0, str(REPO / "tests" / "fakes"))
import modal_server  # noqa: E402

grpc = pytest.importorskip("grpc")


# -- the fake, as a process -------------------------------------------------------


class ModalFakeError(AssertionError):
    pass


class ModalFake:
    """Starts tests/fakes/modal_server.py and talks to it (gRPC + control)."""

    def __init__(self, workdir, agent, extra=()):
        self.dir = Path(workdir)
        self.agent = str(agent)
        self.extra = list(extra)
        self.proc = None
        self.channels = []

    def start(self, timeout=30):
        self.dir.mkdir(parents=True, exist_ok=True)
        self.out_path = self.dir.parent / (self.dir.name + ".out")
        self.proc = start_logged(FAKE, self.dir, self.agent,
                                 ["--listen", "127.0.0.1:0"] + self.extra,
                                 self.out_path)
        self.ready = wait_ready(self.proc, self.dir, timeout, self.output,
                                self.stop, ModalFakeError)
        self.ca = Path(self.ready["ca"]).read_bytes()
        self.pb, self.rpb = modal_server.load_protos()
        self.channel = self.new_channel(self.ready["port"])
        return self

    def output(self):
        try:
            return self.out_path.read_text()[-3000:]
        except OSError:
            return ""

    def new_channel(self, port):
        ch = grpc.secure_channel(f"127.0.0.1:{port}",
                                 grpc.ssl_channel_credentials(root_certificates=self.ca))
        self.channels.append(ch)
        return ch

    def stop(self, sig=signal.SIGTERM, timeout=15):
        for ch in self.channels:
            ch.close()
        self.channels = []
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else None

    # -- gRPC --------------------------------------------------------------------

    def md(self, token_id=None, token_secret=None, client_type="9",
           version="1.0.0", extra=()):
        m = []
        if client_type is not None:
            m.append(("x-modal-client-type", client_type))
        if version is not None:
            m.append(("x-modal-client-version", version))
        tid = self.ready["token_id"] if token_id is None else token_id
        tsec = self.ready["token_secret"] if token_secret is None else token_secret
        if tid:
            m.append(("x-modal-token-id", tid))
        if tsec:
            m.append(("x-modal-token-secret", tsec))
        return m + list(extra)

    def _resp_cls(self, method):
        svc = self.pb.DESCRIPTOR.services_by_name["ModalClient"]
        return modal_server.msg_class(svc.methods_by_name[method].output_type)

    def call(self, method, req, md=None, timeout=30):
        fn = self.channel.unary_unary(
            f"/modal.client.ModalClient/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=self._resp_cls(method).FromString)
        return fn(req, metadata=self.md() if md is None else md,
                  timeout=timeout)

    def stream(self, method, req, md=None, timeout=60):
        fn = self.channel.unary_stream(
            f"/modal.client.ModalClient/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=self._resp_cls(method).FromString)
        return list(fn(req, metadata=self.md() if md is None else md,
                       timeout=timeout))

    def router_call(self, req, jwt=None, url=None, timeout=30):
        port = int((url or self.ready["router_url"]).rsplit(":", 1)[1])
        ch = self.new_channel(port)
        fn = ch.unary_unary(
            "/modal.task_command_router.TaskCommandRouter/TaskSnapshotFilesystem",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=self.rpb.TaskSnapshotFilesystemResponse.FromString)
        md = [("authorization", f"Bearer {jwt}")] if jwt else []
        return fn(req, metadata=md, timeout=timeout)

    # -- control -------------------------------------------------------------------

    def control(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.ready["control_url"] + path,
                                     data=data, method=method)
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def calls(self, since=0):
        return self.control("GET", f"/calls?since={since}")["calls"]

    def last_seq(self):
        return self.control("GET", "/calls?since=999999999")["next"]

    # -- helpers built on the RPCs ------------------------------------------------

    def app(self, name):
        pb = self.pb
        env = self.call("EnvironmentGetOrCreate", pb.EnvironmentGetOrCreateRequest())
        r = self.call("AppGetOrCreate", pb.AppGetOrCreateRequest(
            app_name=name, object_creation_type=pb.OBJECT_CREATION_TYPE_CREATE_IF_MISSING))
        return r.app_id, env.metadata.settings.image_builder_version

    def image(self, app_id, builder, base=BASE_IMAGE, extra_cmds=(),
              expect="SUCCESS"):
        pb = self.pb
        agent = Path(self.agent).read_bytes()
        img = pb.Image(dockerfile_commands=[f"FROM {base}",
                                            "COPY sbx-agent /opt/sbx/sbx-agent"]
                       + list(extra_cmds))
        img.context_files.add(filename="sbx-agent", data=agent)
        r = self.call("ImageGetOrCreate", pb.ImageGetOrCreateRequest(
            app_id=app_id, image=img, builder_version=builder))
        result = r.result if r.HasField("result") else None
        if result is None:
            msgs = self.stream("ImageJoinStreaming", pb.ImageJoinStreamingRequest(
                image_id=r.image_id, timeout=55))
            result = [m.result for m in msgs if m.HasField("result")][-1]
        want = getattr(pb.GenericResult, "GENERIC_STATUS_" + expect)
        assert result.status == want, result
        return r.image_id

    def create(self, app_id, image_id, args=None, port=8443, workdir="/work",
               timeout_secs=600):
        pb = self.pb
        if args is None:
            args = agent_entrypoint(port)
        d = pb.Sandbox(entrypoint_args=args, image_id=image_id,
                       timeout_secs=timeout_secs, workdir=workdir)
        d.resources.milli_cpu = 1000
        d.resources.memory_mb = 1024
        d.open_ports.ports.add(port=port, unencrypted=False)
        return self.call("SandboxCreate", pb.SandboxCreateRequest(
            app_id=app_id, definition=d)).sandbox_id

    def task_id(self, sid, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.call("SandboxGetTaskId", self.pb.SandboxGetTaskIdRequest(
                sandbox_id=sid, timeout=5))
            if r.task_id:
                return r.task_id
        raise ModalFakeError(f"no task id for {sid}")

    def tunnel(self, sid, port=8443):
        r = self.call("SandboxGetTunnels", self.pb.SandboxGetTunnelsRequest(
            sandbox_id=sid, timeout=20))
        assert r.result.status == 0, r
        t = {t.container_port: t for t in r.tunnels}[port]
        return t.host, t.port

    def https(self, host, port, method, path, token=None, body=None,
              timeout=5):
        ctx = ssl.create_default_context(cafile=self.ready["ca"])
        c = http.client.HTTPSConnection(host, port, context=ctx,
                                        timeout=timeout)
        try:
            h = {"X-Sbx-Token": token} if token else {}
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def wait_health(self, host, port, timeout=15):
        deadline = time.monotonic() + timeout
        err = None
        while time.monotonic() < deadline:
            try:
                st, body = self.https(host, port, "GET", "/v1/health")
                if st == 200:
                    return json.loads(body)
            except (OSError, ssl.SSLError, http.client.HTTPException) as e:
                err = e
            time.sleep(0.05)
        raise ModalFakeError(f"agent at {host}:{port} never healthy: {err}")

    def wait_result(self, sid, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.call("SandboxWait", self.pb.SandboxWaitRequest(
                sandbox_id=sid, timeout=5))
            if r.result.status:
                return r.result
        raise ModalFakeError(f"{sid} did not finish")


def agent_entrypoint(port=8443):
    return ["env", f"SBX_TOKEN={AGENT_TOKEN}", "/opt/sbx/sbx-agent", "serve",
            "--root", "/work", "--listen", f"0.0.0.0:{port}",
            "--token-env", "SBX_TOKEN"]


def status_name(pb, st):
    return pb.GenericResult.GenericStatus.Name(st)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_dead(pids, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not [p for p in pids if alive(p)]:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def pgrep_dir(d):
    r = subprocess.run(["pgrep", "-f", str(d)], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split() if int(p) != os.getpid() and alive(int(p))]


@pytest.fixture(scope="module")
def agent_bin(build_dir):
    a = build_dir / "agent" / "sbx-agent"
    if not a.exists():
        pytest.skip(f"{a} is not built")
    return a


@pytest.fixture(scope="module")
def modal_fake(tmp_path_factory, agent_bin):
    f = ModalFake(tmp_path_factory.mktemp("modalfake") / "fake", agent_bin,
                  extra=["--build-step-ms", "10"])
    f.start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def pb(modal_fake):
    return modal_fake.pb


@pytest.fixture(scope="module")
def app(modal_fake):
    return modal_fake.app("sbx-test")


@pytest.fixture(scope="module")
def agent_image(modal_fake, app):
    return modal_fake.image(app[0], app[1])


def code_of(excinfo):
    return excinfo.value.code()


# -- tests ---------------------------------------------------------------------------


def test_ready_and_config(modal_fake, pb):
    r = modal_fake.ready
    for k in ("port", "pid", "url", "token_id", "token_secret", "ca"):
        assert k in r
    assert r["url"] == f"https://127.0.0.1:{r['port']}"
    assert r["pid"] == modal_fake.proc.pid
    cfg = tomllib.loads((modal_fake.dir / "modal.toml").read_text())
    assert cfg["fake"]["active"] is True
    assert cfg["fake"]["token_id"] == r["token_id"]
    assert cfg["fake"]["server_url"] == r["url"]
    assert not cfg["other"].get("active")
    assert cfg["other"]["token_id"] != cfg["fake"]["token_id"]
    # both profiles are accepted
    for prof in ("fake", "other"):
        md = modal_fake.md(cfg[prof]["token_id"], cfg[prof]["token_secret"])
        e = modal_fake.call("EnvironmentGetOrCreate",
                            pb.EnvironmentGetOrCreateRequest(), md=md)
        assert e.metadata.settings.image_builder_version == "2024.10"
        assert e.environment_id.startswith("en-")
    # the server certificate verifies against ca.pem for 127.0.0.1
    ctx = ssl.create_default_context(cafile=r["ca"])
    with ctx.wrap_socket(__import__("socket").create_connection(
            ("127.0.0.1", r["port"])), server_hostname="127.0.0.1") as s:
        assert s.version()


def test_auth_failures(modal_fake, pb):
    req = pb.EnvironmentGetOrCreateRequest()
    seq = modal_fake.last_seq()
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.call("EnvironmentGetOrCreate", req,
                        md=modal_fake.md(token_id="", token_secret=""))
    assert code_of(ei) == grpc.StatusCode.UNAUTHENTICATED
    assert "Token missing" in ei.value.details()
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.call("EnvironmentGetOrCreate", req,
                        md=modal_fake.md(token_secret="as-wrong"))
    assert code_of(ei) == grpc.StatusCode.UNAUTHENTICATED
    assert "Token validation failed" in ei.value.details()
    # a secret of the other profile does not match this id
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.call("EnvironmentGetOrCreate", req, md=modal_fake.md(
            token_secret=modal_fake.ready["other_token_secret"]))
    assert code_of(ei) == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.call("EnvironmentGetOrCreate", req,
                        md=modal_fake.md(client_type=None))
    assert code_of(ei) == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.call("EnvironmentGetOrCreate", req,
                        md=modal_fake.md(version=None))
    assert code_of(ei) == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.call("EnvironmentGetOrCreate", req,
                        md=modal_fake.md(client_type="libmodal"))
    assert code_of(ei) == grpc.StatusCode.FAILED_PRECONDITION
    # AuthTokenGet: a JWT, accepted back as x-modal-auth-token
    tok = modal_fake.call("AuthTokenGet", pb.AuthTokenGetRequest()).token
    assert tok.count(".") == 2
    modal_fake.call("EnvironmentGetOrCreate", req, md=modal_fake.md(
        extra=[("x-modal-auth-token", tok)]))
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.call("EnvironmentGetOrCreate", req, md=modal_fake.md(
            extra=[("x-modal-auth-token", tok[:-3] + "abc")]))
    assert code_of(ei) == grpc.StatusCode.UNAUTHENTICATED
    codes = [(c["method"], c["code"]) for c in modal_fake.calls(seq)]
    assert codes[:6] == [("EnvironmentGetOrCreate", "UNAUTHENTICATED")] * 3 + \
        [("EnvironmentGetOrCreate", "FAILED_PRECONDITION")] * 3
    assert ("AuthTokenGet", "OK") in codes


def test_environment_and_app(modal_fake, pb):
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.call("EnvironmentGetOrCreate",
                        pb.EnvironmentGetOrCreateRequest(deployment_name="nope"))
    assert code_of(ei) == grpc.StatusCode.NOT_FOUND
    e = modal_fake.call("EnvironmentGetOrCreate", pb.EnvironmentGetOrCreateRequest(
        deployment_name="staging",
        object_creation_type=pb.OBJECT_CREATION_TYPE_CREATE_IF_MISSING))
    assert e.metadata.name == "staging"
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.call("AppGetOrCreate", pb.AppGetOrCreateRequest(
            app_name="never-made"))
    assert code_of(ei) == grpc.StatusCode.NOT_FOUND
    a1 = modal_fake.call("AppGetOrCreate", pb.AppGetOrCreateRequest(
        app_name="stable", object_creation_type=pb.OBJECT_CREATION_TYPE_CREATE_IF_MISSING))
    a2 = modal_fake.call("AppGetOrCreate", pb.AppGetOrCreateRequest(
        app_name="stable", environment_name="main",
        object_creation_type=pb.OBJECT_CREATION_TYPE_CREATE_IF_MISSING))
    a3 = modal_fake.call("AppGetOrCreate", pb.AppGetOrCreateRequest(
        app_name="stable", environment_name="staging",
        object_creation_type=pb.OBJECT_CREATION_TYPE_CREATE_IF_MISSING))
    assert a1.app_id == a2.app_id != a3.app_id
    assert a1.app_id.startswith("ap-") and len(a1.app_id) == 25
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.call("AppGetOrCreate", pb.AppGetOrCreateRequest(
            app_name="x", environment_name="nope",
            object_creation_type=pb.OBJECT_CREATION_TYPE_CREATE_IF_MISSING))
    assert code_of(ei) == grpc.StatusCode.NOT_FOUND


def test_image_build_stream(modal_fake, pb, app):
    app_id, builder = app
    agent = Path(modal_fake.agent).read_bytes()
    img = pb.Image(dockerfile_commands=[
        "FROM python:3.11", "COPY sbx-agent /opt/sbx/sbx-agent",
        "ENV SBX_MARK=1", "RUN echo hello"])
    img.context_files.add(filename="sbx-agent", data=agent)
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.call("ImageGetOrCreate", pb.ImageGetOrCreateRequest(
            app_id=app_id, image=img))
    assert code_of(ei) == grpc.StatusCode.FAILED_PRECONDITION
    bad = pb.Image(dockerfile_commands=["RUN true"])
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.call("ImageGetOrCreate", pb.ImageGetOrCreateRequest(
            app_id=app_id, image=bad, builder_version=builder))
    assert code_of(ei) == grpc.StatusCode.INVALID_ARGUMENT
    r = modal_fake.call("ImageGetOrCreate", pb.ImageGetOrCreateRequest(
        app_id=app_id, image=img, builder_version=builder))
    assert r.image_id.startswith("im-") and not r.HasField("result")
    msgs = modal_fake.stream("ImageJoinStreaming", pb.ImageJoinStreamingRequest(
        image_id=r.image_id, timeout=55))
    logs = [(m.entry_id, m.task_logs[0].data) for m in msgs if m.task_logs]
    text = "".join(d for _, d in logs)
    assert "Step 1/4 : FROM python:3.11" in text
    assert "Step 2/4 : COPY sbx-agent /opt/sbx/sbx-agent" in text
    ids = [e for e, _ in logs]
    assert all(ids) and len(set(ids)) == len(ids) >= 5
    final = msgs[-1]
    assert final.result.status == pb.GenericResult.GENERIC_STATUS_SUCCESS
    # rejoin after the third entry: only what follows
    again = modal_fake.stream("ImageJoinStreaming", pb.ImageJoinStreamingRequest(
        image_id=r.image_id, timeout=55, last_entry_id=ids[2],
        include_logs_for_finished=True))
    assert [m.entry_id for m in again if m.task_logs] == ids[3:]
    assert again[-1].result.status == pb.GenericResult.GENERIC_STATUS_SUCCESS
    # a finished build without include_logs_for_finished: the result only
    only = modal_fake.stream("ImageJoinStreaming", pb.ImageJoinStreamingRequest(
        image_id=r.image_id, timeout=55))
    assert len(only) == 1 and only[0].result.status == 1
    # the same definition: the same id, already built
    r2 = modal_fake.call("ImageGetOrCreate", pb.ImageGetOrCreateRequest(
        app_id=app_id, image=img, builder_version=builder))
    assert r2.image_id == r.image_id and r2.result.status == 1
    info = modal_fake.control("GET", f"/images/{r.image_id}")
    assert info["agent_path"] == "/opt/sbx/sbx-agent"
    assert info["context_files"] == [{"filename": "sbx-agent",
                                      "size": len(agent), "elf": True}]
    assert "SBX_MARK" in info["env"]
    # a bundle directory holding bin/sbx-agent is accepted as well
    b = pb.Image(dockerfile_commands=["FROM debian:12", "COPY sbx /opt/sbx"])
    b.context_files.add(filename="sbx/bin/sbx-agent", data=agent)
    b.context_files.add(filename="sbx/lib/README", data=b"libs\n")
    rb = modal_fake.call("ImageGetOrCreate", pb.ImageGetOrCreateRequest(
        app_id=app_id, image=b, builder_version=builder))
    modal_fake.stream("ImageJoinStreaming", pb.ImageJoinStreamingRequest(
        image_id=rb.image_id, timeout=55))
    assert modal_fake.control("GET", f"/images/{rb.image_id}")["agent_path"] \
        == "/opt/sbx/bin/sbx-agent"


def test_image_join_timeout_and_rejoin(modal_fake, pb, app):
    app_id, builder = app
    modal_fake.control("POST", "/config", {"build_step_ms": 150})
    try:
        img = pb.Image(dockerfile_commands=["FROM debian:12", "RUN make",
                                            "ENV SLOW=1"])
        r = modal_fake.call("ImageGetOrCreate", pb.ImageGetOrCreateRequest(
            app_id=app_id, image=img, builder_version=builder))
        assert not r.HasField("result")
        ids, result, joins = [], None, 0
        while result is None and joins < 50:
            joins += 1
            msgs = modal_fake.stream("ImageJoinStreaming", pb.ImageJoinStreamingRequest(
                image_id=r.image_id, timeout=0.3,
                last_entry_id=ids[-1] if ids else ""))
            ids += [m.entry_id for m in msgs if m.task_logs]
            result = next((m.result for m in msgs if m.HasField("result")), None)
        assert joins >= 2          # the first join ran out before the end
        assert result.status == pb.GenericResult.GENERIC_STATUS_SUCCESS
        assert len(ids) == len(set(ids)) >= 7   # no entry twice, none lost
        info = modal_fake.control("GET", f"/images/{r.image_id}")
        assert len(info["log"]) == len(ids)
    finally:
        modal_fake.control("POST", "/config", {"build_step_ms": 10})


def test_image_build_failures(modal_fake, pb, app):
    app_id, builder = app
    img = pb.Image(dockerfile_commands=["FROM registry.example/buildfail:1"])
    r = modal_fake.call("ImageGetOrCreate", pb.ImageGetOrCreateRequest(
        app_id=app_id, image=img, builder_version=builder))
    msgs = modal_fake.stream("ImageJoinStreaming", pb.ImageJoinStreamingRequest(
        image_id=r.image_id, timeout=55))
    res = msgs[-1].result
    assert res.status == pb.GenericResult.GENERIC_STATUS_FAILURE
    assert "failed" in res.exception
    assert any("buildfail" in m.task_logs[0].data for m in msgs if m.task_logs)
    img = pb.Image(dockerfile_commands=["FROM debian:12", "COPY missing /x"])
    r = modal_fake.call("ImageGetOrCreate", pb.ImageGetOrCreateRequest(
        app_id=app_id, image=img, builder_version=builder))
    msgs = modal_fake.stream("ImageJoinStreaming", pb.ImageJoinStreamingRequest(
        image_id=r.image_id, timeout=55))
    assert msgs[-1].result.status == pb.GenericResult.GENERIC_STATUS_FAILURE
    # a sandbox from a failed image is refused
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.create(app_id, r.image_id)
    assert code_of(ei) == grpc.StatusCode.FAILED_PRECONDITION


def test_full_sequence_agent_health(modal_fake, pb, app, agent_image):
    app_id, _ = app
    sid = modal_fake.create(app_id, agent_image)
    assert sid.startswith("sb-") and len(sid) == 25
    assert all(c.isalnum() for c in sid[3:])
    # not scheduled at once: the first immediate poll has no task id
    r = modal_fake.call("SandboxGetTaskId", pb.SandboxGetTaskIdRequest(sandbox_id=sid))
    assert not r.task_id
    r = modal_fake.call("SandboxGetTaskId", pb.SandboxGetTaskIdRequest(
        sandbox_id=sid, timeout=10, wait_until_ready=True))
    assert r.task_id.startswith("ta-") and not r.HasField("task_result")
    host, port = modal_fake.tunnel(sid)
    assert host == "127.0.0.1"
    h = modal_fake.wait_health(host, port)
    assert h["ok"] is True
    st, body = modal_fake.https(host, port, "GET", "/v1/info")
    assert st == 401
    st, body = modal_fake.https(host, port, "GET", "/v1/info", token=AGENT_TOKEN)
    assert st == 200
    info = json.loads(body)
    sbinfo = modal_fake.control("GET", f"/sandboxes/{sid}")
    assert info["root"] == str(Path(sbinfo["fs"]) / "work")
    assert sbinfo["container_port"] == 8443
    pid = sbinfo["agent_pid"]
    assert alive(pid)
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.call("SandboxGetTaskId", pb.SandboxGetTaskIdRequest(
            sandbox_id="sb-" + "x" * 22))
    assert code_of(ei) == grpc.StatusCode.NOT_FOUND
    # wait before the end: an empty result
    r = modal_fake.call("SandboxWait", pb.SandboxWaitRequest(sandbox_id=sid, timeout=0.3))
    assert r.result.status == 0
    modal_fake.call("SandboxTerminate", pb.SandboxTerminateRequest(sandbox_id=sid))
    res = modal_fake.wait_result(sid)
    assert res.status == pb.GenericResult.GENERIC_STATUS_TERMINATED
    assert wait_dead([pid]) == []
    with pytest.raises((OSError, ssl.SSLError, http.client.HTTPException)):
        modal_fake.https(host, port, "GET", "/v1/health", timeout=2)
    r = modal_fake.call("SandboxTerminate", pb.SandboxTerminateRequest(sandbox_id=sid))
    assert r.existing_result.status == pb.GenericResult.GENERIC_STATUS_TERMINATED
    r = modal_fake.call("SandboxGetTaskId", pb.SandboxGetTaskIdRequest(sandbox_id=sid))
    assert r.task_result.status == pb.GenericResult.GENERIC_STATUS_TERMINATED


def test_token_from_image_env_and_sh_wrapper(modal_fake, pb, app):
    app_id, builder = app
    iid = modal_fake.image(app_id, builder, extra_cmds=[f"ENV SBX_TOKEN={AGENT_TOKEN}"])
    sid = modal_fake.create(app_id, iid, args=[
        "/opt/sbx/sbx-agent", "serve", "--root", "/work", "--listen",
        "0.0.0.0:8443", "--token-env", "SBX_TOKEN"])
    sid2 = modal_fake.create(app_id, iid, args=[
        "sh", "-c", "SBX_TOKEN=other-token exec /opt/sbx/sbx-agent serve "
        "--root /srv --listen :8443 --token-env SBX_TOKEN"])
    for s, tok in ((sid, AGENT_TOKEN), (sid2, "other-token")):
        host, port = modal_fake.tunnel(s)
        modal_fake.wait_health(host, port)
        st, _ = modal_fake.https(host, port, "GET", "/v1/info", token=tok)
        assert st == 200
        modal_fake.call("SandboxTerminate", pb.SandboxTerminateRequest(sandbox_id=s))
    # a bare program name is looked up in the image's PATH
    img = pb.Image(dockerfile_commands=[
        "FROM debian:12", "COPY --chmod=755 sbx-agent /usr/local/bin/",
        f"ENV SBX_TOKEN={AGENT_TOKEN}"])
    img.context_files.add(filename="sbx-agent", data=Path(modal_fake.agent).read_bytes())
    r = modal_fake.call("ImageGetOrCreate", pb.ImageGetOrCreateRequest(
        app_id=app_id, image=img, builder_version=builder))
    modal_fake.stream("ImageJoinStreaming", pb.ImageJoinStreamingRequest(
        image_id=r.image_id, timeout=55))
    sid4 = modal_fake.create(app_id, r.image_id, args=[
        "sbx-agent", "serve", "--root", "/work", "--listen", "0.0.0.0:8443",
        "--token-env", "SBX_TOKEN"])
    modal_fake.wait_health(*modal_fake.tunnel(sid4))
    assert modal_fake.control("GET", f"/sandboxes/{sid4}")["plan"]["prog"] == \
        "/usr/local/bin/sbx-agent"
    modal_fake.call("SandboxTerminate", pb.SandboxTerminateRequest(sandbox_id=sid4))
    # no agent in the image: the entrypoint does not exist (exit 127)
    img = pb.Image(dockerfile_commands=["FROM debian:12"])
    r = modal_fake.call("ImageGetOrCreate", pb.ImageGetOrCreateRequest(
        app_id=app_id, image=img, builder_version=builder))
    modal_fake.stream("ImageJoinStreaming", pb.ImageJoinStreamingRequest(
        image_id=r.image_id, timeout=55))
    sid3 = modal_fake.create(app_id, r.image_id)
    res = modal_fake.wait_result(sid3)
    assert res.status == pb.GenericResult.GENERIC_STATUS_FAILURE
    assert res.exitcode == 127


def test_neverready(modal_fake, pb, app):
    app_id, builder = app
    iid = modal_fake.image(app_id, builder, base="example/neverready:1")
    sid = modal_fake.create(app_id, iid)
    t0 = time.monotonic()
    r = modal_fake.call("SandboxGetTaskId", pb.SandboxGetTaskIdRequest(
        sandbox_id=sid, timeout=0.6))
    assert not r.task_id and time.monotonic() - t0 >= 0.5
    r = modal_fake.call("SandboxGetTunnels", pb.SandboxGetTunnelsRequest(
        sandbox_id=sid, timeout=0.5))
    assert r.result.status == pb.GenericResult.GENERIC_STATUS_TIMEOUT
    assert not r.tunnels
    modal_fake.call("SandboxTerminate", pb.SandboxTerminateRequest(sandbox_id=sid))
    assert modal_fake.wait_result(sid).status == \
        pb.GenericResult.GENERIC_STATUS_TERMINATED


def test_crash(modal_fake, pb, app):
    app_id, builder = app
    iid = modal_fake.image(app_id, builder, base="example/crash:1")
    sid = modal_fake.create(app_id, iid)
    res = modal_fake.wait_result(sid)
    assert res.status == pb.GenericResult.GENERIC_STATUS_FAILURE
    assert res.exitcode == 1
    r = modal_fake.call("SandboxGetTaskId", pb.SandboxGetTaskIdRequest(
        sandbox_id=sid, timeout=1))
    assert r.task_result.status == pb.GenericResult.GENERIC_STATUS_FAILURE
    r = modal_fake.call("SandboxGetTunnels", pb.SandboxGetTunnelsRequest(
        sandbox_id=sid, timeout=1))
    assert r.result.status == pb.GenericResult.GENERIC_STATUS_FAILURE


def test_list_tags_paging(modal_fake, pb, agent_image):
    app_id, _ = modal_fake.app("list-app")
    idle = ["sleep", "infinity"]
    sids = [modal_fake.create(app_id, agent_image, args=idle) for _ in range(4)]
    for i, s in enumerate(sids):
        req = pb.SandboxTagsSetRequest(sandbox_id=s)
        req.tags.add(tag_name="role", tag_value="even" if i % 2 == 0 else "odd")
        req.tags.add(tag_name="owner", tag_value="sbx")
        modal_fake.call("SandboxTagsSet", req)
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.call("SandboxTagsSet", pb.SandboxTagsSetRequest(
            sandbox_id="sb-" + "0" * 22))
    assert code_of(ei) == grpc.StatusCode.NOT_FOUND

    def lst(tags=(), before=0.0, include_finished=False):
        req = pb.SandboxListRequest(app_id=app_id, before_timestamp=before,
                                    include_finished=include_finished)
        for k, v in tags:
            req.tags.add(tag_name=k, tag_value=v)
        return list(modal_fake.call("SandboxList", req).sandboxes)

    allsb = lst()
    assert [s.id for s in allsb] == sids[::-1]   # newest first
    assert all(s.app_id == app_id and s.image_id == agent_image for s in allsb)
    assert {t.tag_name: t.tag_value for t in allsb[0].tags} == \
        {"role": "odd", "owner": "sbx"}
    assert [s.id for s in lst([("role", "even")])] == [sids[2], sids[0]]
    assert [s.id for s in lst([("role", "even"), ("owner", "sbx")])] == \
        [sids[2], sids[0]]
    assert lst([("role", "even"), ("owner", "else")]) == []
    modal_fake.control("POST", "/config", {"list_page_size": 3})
    try:
        page1 = lst()
        assert [s.id for s in page1] == sids[::-1][:3]
        page2 = lst(before=page1[-1].created_at)
        assert [s.id for s in page2] == [sids[0]]
        assert lst(before=page2[-1].created_at) == []
    finally:
        modal_fake.control("POST", "/config", {"list_page_size": 100})
    modal_fake.call("SandboxTerminate", pb.SandboxTerminateRequest(sandbox_id=sids[1]))
    modal_fake.wait_result(sids[1])
    assert sids[1] not in [s.id for s in lst()]
    assert sids[1] in [s.id for s in lst(include_finished=True)]
    for s in sids:
        modal_fake.call("SandboxTerminate", pb.SandboxTerminateRequest(sandbox_id=s))
    assert lst() == []


def test_snapshot_via_router(modal_fake, pb, app, agent_image):
    app_id, _ = app
    rpb = modal_fake.rpb
    sid = modal_fake.create(app_id, agent_image)
    tid = modal_fake.task_id(sid)
    host, port = modal_fake.tunnel(sid)
    modal_fake.wait_health(host, port)
    ops = {"ops": [{"op": "create", "path": "hello.txt", "mode": 0o644},
                   {"op": "write", "path": "hello.txt", "offset": 0,
                    "data": base64.b64encode(b"snapshot me\n").decode()}],
           "stop_on_error": True}
    st, body = modal_fake.https(host, port, "POST", "/v1/fs/batch",
                                token=AGENT_TOKEN, body=json.dumps(ops).encode())
    assert st == 200 and all(r.get("ok") for r in json.loads(body)["results"]), body
    acc = modal_fake.call("TaskGetCommandRouterAccess",
                          pb.TaskGetCommandRouterAccessRequest(task_id=tid))
    assert acc.jwt.count(".") == 2 and acc.url.startswith("https://127.0.0.1:")
    snap_id = str(uuid.uuid4())
    req = rpb.TaskSnapshotFilesystemRequest(task_id=tid, snapshot_id=snap_id)
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.router_call(req, url=acc.url)
    assert code_of(ei) == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.router_call(req, jwt=acc.jwt[:-4] + "AAAA", url=acc.url)
    assert code_of(ei) == grpc.StatusCode.UNAUTHENTICATED
    # the Modal token is not what the router wants
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.router_call(req, jwt=modal_fake.ready["token_secret"], url=acc.url)
    assert code_of(ei) == grpc.StatusCode.UNAUTHENTICATED
    r = modal_fake.router_call(req, jwt=acc.jwt, url=acc.url)
    assert r.image_id.startswith("im-") and r.image_id != agent_image
    assert modal_fake.router_call(req, jwt=acc.jwt, url=acc.url).image_id == r.image_id
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.call("TaskGetCommandRouterAccess",
                        pb.TaskGetCommandRouterAccessRequest(task_id="ta-nope"))
    assert code_of(ei) == grpc.StatusCode.NOT_FOUND
    # legacy SandboxSnapshotFs
    legacy = modal_fake.call("SandboxSnapshotFs", pb.SandboxSnapshotFsRequest(
        sandbox_id=sid, timeout=55))
    assert legacy.result.status == pb.GenericResult.GENERIC_STATUS_SUCCESS
    modal_fake.call("SandboxTerminate", pb.SandboxTerminateRequest(sandbox_id=sid))
    # a new sandbox from each snapshot image has the file
    for iid in (r.image_id, legacy.image_id):
        s2 = modal_fake.create(app_id, iid)
        host, port = modal_fake.tunnel(s2)
        modal_fake.wait_health(host, port)
        st, body = modal_fake.https(host, port, "GET",
                                    "/v1/fs/read?path=hello.txt", token=AGENT_TOKEN)
        assert (st, body) == (200, b"snapshot me\n")
        modal_fake.call("SandboxTerminate", pb.SandboxTerminateRequest(sandbox_id=s2))


def test_injected_unavailable_and_retries(modal_fake, pb, app, agent_image):
    app_id, _ = app
    modal_fake.control("POST", "/fail", {"method": "AppGetOrCreate",
                                         "code": "UNAVAILABLE", "count": 2})
    seq = modal_fake.last_seq()
    key = str(uuid.uuid4())
    req = pb.AppGetOrCreateRequest(app_name="retry-app",
                                   object_creation_type=pb.OBJECT_CREATION_TYPE_CREATE_IF_MISSING)
    got, codes = None, []
    for attempt in range(4):
        extra = [("x-idempotency-key", key)]
        if attempt:
            extra.append(("x-retry-attempt", str(attempt)))
        try:
            got = modal_fake.call("AppGetOrCreate", req, md=modal_fake.md(extra=extra))
            break
        except grpc.RpcError as e:
            codes.append(e.code())
            time.sleep(0.1 * 2 ** attempt)
    assert codes == [grpc.StatusCode.UNAVAILABLE] * 2 and got.app_id
    log = [c for c in modal_fake.calls(seq) if c["method"] == "AppGetOrCreate"]
    assert [c["code"] for c in log] == ["UNAVAILABLE", "UNAVAILABLE", "OK"]
    assert [c["injected"] for c in log] == [True, True, False]
    assert {c["idempotency_key"] for c in log} == {key}
    assert [c["retry_attempt"] for c in log] == [None, "1", "2"]
    assert "x-idempotency-key" in log[0]["metadata"]
    assert log[0]["client_version"] == "1.0.0"
    # "after": the sandbox is created but the answer is lost; the retry with
    # the same key gets the same sandbox
    modal_fake.control("POST", "/fail", {"method": "SandboxCreate",
                                         "code": "UNAVAILABLE", "when": "after"})
    key = str(uuid.uuid4())
    d = pb.Sandbox(entrypoint_args=["sleep", "infinity"], image_id=agent_image)
    creq = pb.SandboxCreateRequest(app_id=app_id, definition=d)
    before = {s["id"] for s in modal_fake.control("GET", "/sandboxes")["sandboxes"]}
    with pytest.raises(grpc.RpcError) as ei:
        modal_fake.call("SandboxCreate", creq, md=modal_fake.md(
            extra=[("x-idempotency-key", key)]))
    assert code_of(ei) == grpc.StatusCode.UNAVAILABLE
    r = modal_fake.call("SandboxCreate", creq, md=modal_fake.md(
        extra=[("x-idempotency-key", key), ("x-retry-attempt", "1")]))
    after = {s["id"] for s in modal_fake.control("GET", "/sandboxes")["sandboxes"]}
    assert after - before == {r.sandbox_id}
    assert modal_fake.calls(modal_fake.last_seq() - 1)[-1]["replayed"] is True
    modal_fake.call("SandboxTerminate", pb.SandboxTerminateRequest(sandbox_id=r.sandbox_id))
    assert modal_fake.control("GET", "/fail")["rules"] == []


def test_kill_agent_under_client(modal_fake, pb, app, agent_image):
    app_id, _ = app
    sid = modal_fake.create(app_id, agent_image)
    host, port = modal_fake.tunnel(sid)
    modal_fake.wait_health(host, port)
    info = modal_fake.control("POST", f"/sandboxes/{sid}/kill", {"signal": "KILL"})
    assert info["state"] == "finished"
    assert wait_dead([info["agent_pid"]]) == []
    res = modal_fake.wait_result(sid)
    assert res.status == pb.GenericResult.GENERIC_STATUS_TERMINATED
    with pytest.raises((OSError, ssl.SSLError, http.client.HTTPException)):
        modal_fake.https(host, port, "GET", "/v1/health", timeout=2)
    # timeout_secs: the sandbox ends with TIMEOUT
    sid = modal_fake.create(app_id, agent_image, timeout_secs=1)
    res = modal_fake.wait_result(sid, timeout=10)
    assert res.status == pb.GenericResult.GENERIC_STATUS_TIMEOUT


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL],
                         ids=["sigterm", "sigkill"])
def test_no_agents_left(tmp_path, agent_bin, sig):
    f = ModalFake(tmp_path / "fake", agent_bin, extra=["--build-step-ms", "5"])
    f.start()
    try:
        app_id, builder = f.app("cleanup")
        iid = f.image(app_id, builder)
        sids = [f.create(app_id, iid) for _ in range(2)]
        for s in sids:
            f.wait_health(*f.tunnel(s))
        pids = [f.control("GET", f"/sandboxes/{s}")["agent_pid"] for s in sids]
        assert all(alive(p) for p in pids)
        assert set(pids) <= set(pgrep_dir(f.dir))
    finally:
        code = f.stop(sig)
    if sig == signal.SIGTERM:
        assert code == 0, f.output()
        assert not (f.dir / "ready").exists()
    assert wait_dead(pids) == []
    assert wait_dead(pgrep_dir(f.dir)) == []
