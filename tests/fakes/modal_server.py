#!/usr/bin/python3
"""A protocol-faithful FAKE Modal gRPC server for the sbx tests.

No Modal account is needed: the fake speaks Modal's client gRPC API (the
subset in providers/modal/modal_api.proto, package modal.client, service
ModalClient, and providers/modal/task_command_router.proto) over TLS + HTTP/2,
and "runs" each sandbox whose entrypoint is `... sbx-agent serve ...` as a
REAL sbx-agent process on loopback, which is then the sandbox's tunnel
endpoint.  Behaviour follows /work/shared/reference/modal.md.
Needs /usr/bin/python3 with grpcio (1.51) and protobuf, `protoc` and the
`openssl` CLI.  The message classes are generated at startup with
`protoc --python_out` from the project's .proto files (load_protos(), also
used by the tests).

Usage
-----
    /usr/bin/python3 tests/fakes/modal_server.py --dir DIR \\
        --agent build/agent/sbx-agent [--listen 127.0.0.1:0]
        [--schedule-ms 100:300] [--build-step-ms 40] [--list-page-size 100]

Creates DIR and writes there:
    ca.pem ca.key            the fake's CA (openssl CLI, EC P-256)
    server.pem server.key    gRPC server certificate (127.0.0.1, localhost)
    agent.pem agent.key      certificate given to every agent (127.0.0.1)
    modal.toml               profiles `fake` (active) and `other`, both
                             accepted; server_url = https://127.0.0.1:PORT
    ready                    (atomically, once serving) JSON: port, pid, url,
                             token_id, token_secret, ca, config (modal.toml),
                             other_token_id, other_token_secret, router_port,
                             router_url, control_port, control_url
    fake.log                 the fake's log
    requests.jsonl           one JSON line per call (see the request log)
    sandboxes/<sb-id>/fs/    the sandbox's container file system; the agent's
                             --root P is fs/P, its cwd fs/<workdir>
    sandboxes/<sb-id>/agent.log   the agent's stdout+stderr
    images/<im-id>/fs/       the image's files (COPYed context files,
                             snapshot contents)

SIGTERM/SIGINT, or the parent process dying: stops every agent, exits 0.
Agents get PR_SET_PDEATHSIG(SIGKILL) (prctl in preexec_fn, forked from one
long-lived thread), so a SIGKILLed fake leaves no agent behind either.

Authentication (ModalClient)
----------------------------
Every call needs `x-modal-client-type` (a decimal ClientType) and
`x-modal-client-version` (FAILED_PRECONDITION when missing) and `x-modal-token-id` +
`x-modal-token-secret` of one of the two profiles (UNAUTHENTICATED, with
Modal's wording, when missing or wrong).  An `x-modal-auth-token` (from
AuthTokenGet) is optional; when sent it must be valid and unexpired.
The router listener (TaskCommandRouter) needs only
`authorization: Bearer <jwt>` from TaskGetCommandRouterAccess for that task.
Creating calls (AppGetOrCreate, ImageGetOrCreate, SandboxCreate,
SandboxSnapshotFs, TaskSnapshotFilesystem) carrying an `x-idempotency-key`
already answered successfully get the same answer again (a retry after a
lost answer creates nothing new); polls and lookups are answered afresh.
Injected faults are applied before the header and token checks.

RPCs (real status codes: NOT_FOUND, INVALID_ARGUMENT, FAILED_PRECONDITION,
UNAUTHENTICATED, ALREADY_EXISTS, UNAVAILABLE when injected)
-------------------------------------------------------------------------
EnvironmentGetOrCreate  "" or "main" exists; other names need
    CREATE_IF_MISSING (else NOT_FOUND).  settings.image_builder_version
    "2024.10", webhook_suffix "modal.run".
AppGetOrCreate          ap-<22 base62>, stable per (environment, name);
    missing app without CREATE_IF_MISSING/EPHEMERAL → NOT_FOUND;
    CREATE_FAIL_IF_EXISTS on an existing one → ALREADY_EXISTS.
ImageGetOrCreate        needs builder_version (FAILED_PRECONDITION) and
    dockerfile_commands[0] = `FROM <image>` (INVALID_ARGUMENT).  im-<22>,
    the same id for the same definition.  A new build answers without
    `result`: ImageJoinStreaming then streams TaskLogs (one response per
    entry, entry ids `<ms>-<seq>`, last_entry_id honoured, timeout honoured:
    the stream ends without a result when it runs out, the client rejoins),
    then a response with the result (eof=true).  Already built: `result`
    SUCCESS at once; joining a finished build sends only the result unless
    include_logs_for_finished.  Base image containing `buildfail`, or a
    COPY of a name missing from context_files → FAILURE with an exception.
    Simulated Dockerfile: FROM, COPY [--chmod=M] src... dest (context files,
    materialised under images/<id>/fs; a directory source copies every
    context file below it; ELF files get mode 755), ENV k=v / ENV k v,
    WORKDIR, RUN (logged only; `chmod` of image files applied).  The agent:
    an ELF context file COPYed (its in-image path) or a COPYed bundle
    directory holding bin/sbx-agent.
SandboxCreate           app, image (built; waits for a running build),
    timeout_secs <= 86400 (0 means 300, Modal's default), absolute workdir.
    sb-<22 base62>.  Then: scheduled after --schedule-ms (task id ta-<22>),
    and the entrypoint runs:
      * `[wrappers] PROG ... serve ARGS`: if PROG (or any word before
        `serve`) exists in the image or is the image's agent path, the REAL
        --agent binary runs `serve ARGS` with: --root P → fs/P (created),
        --listen H:PORT → 127.0.0.1:<free port> (PORT is the container port
        matched against open_ports; H being 127.0.0.1/localhost/::1 makes the
        tunnel unreachable, as in a real container), --token-file P → fs/P,
        --tls-cert/--tls-key replaced by (or added as) agent.pem/agent.key
        (the tunnel is TLS with the fake's CA), --token-env NAME kept (see
        the token convention), cwd fs/<workdir>, environment: PATH, LANG,
        HOME=fs/root, MODAL_SANDBOX_ID, MODAL_TASK_ID, the image's ENV, the
        secrets, the wrapper's K=V (not the host's environment, except
        SBX_LOG/SBX_AGENT_*/sanitizer knobs).  Wrappers understood:
        `env [-i] K=V...`, `sh|bash -c "[exec] [K=V...] PROG ..."`, `exec`.
        Otherwise exit 127 "no such file or directory" (FAILURE).
      * anything else: simulated as a process running until terminated.
    Image names (the FROM image) containing `neverready`: never scheduled
    (no task id, no tunnels, until terminate/timeout); `crash`: the
    entrypoint exits with 1 right after scheduling (FAILURE, exitcode 1);
    `crashlog`: the same after writing 9 log lines, whose tail is the
    exception (as when the agent exits by itself).
    The agent exiting by itself: SUCCESS (0) or FAILURE (exitcode);
    timeout_secs: TIMEOUT; SandboxTerminate: TERMINATED.
SandboxGetTaskId        long poll up to `timeout` (none: answers at once)
    for the task id; wait_until_ready also waits for the agent to listen.
    task_result once finished.  NOT_FOUND for unknown ids.
SandboxGetTunnels       long poll up to `timeout` (max 55 s) for the
    container to run: one TunnelData per open port {host 127.0.0.1, port,
    container_port}; the agent's port for the port it listens on (the agent
    may not listen yet: poll /v1/health), a closed port for the others.
    result TIMEOUT when the poll runs out; the sandbox's result once
    finished.
SandboxTerminate        stops the agent (SIGTERM, SIGKILL after 2 s);
    existing_result when it had already finished.
SandboxWait             long poll up to `timeout`; empty result before.
SandboxList             filters app_id, environment_name, include_finished,
    tags (all must match); newest first, at most --list-page-size per page,
    before_timestamp pages (created_at strictly before).
SandboxTagsSet          replaces the tags.
SandboxSnapshotFs       copies fs/ into images/<new im-id>/fs (an image with
    the same agent/ENV as the sandbox's), result SUCCESS.
TaskGetCommandRouterAccess  {jwt (HS256, task_id claim, exp +1 h), url
    https://127.0.0.1:ROUTER_PORT}: a second TLS gRPC listener serving
    /modal.task_command_router.TaskCommandRouter/TaskSnapshotFilesystem
    (same snapshot as above; the same snapshot_id gives the same image).
AuthTokenGet            a JWT (exp +30 min).
SecretGetOrCreate       only if the .proto declares it (env_dict).

Token convention for `--token-env NAME`
---------------------------------------
The proto's Sandbox has no environment field (Modal's SDKs turn `env` into
an ephemeral Secret, and SecretGetOrCreate is not in the subset).  The value
of NAME is taken, last one winning, from: the image's `ENV NAME=value`
commands, the secrets in definition.secret_ids (only when the proto has
SecretGetOrCreate), and `K=V` assignments in the entrypoint wrapper
(`env NAME=value /path/sbx-agent serve ...` or
`sh -c "NAME=value exec /path/sbx-agent serve ..."`).  `--token-file P`
also works (P is read from the sandbox's fs, e.g. a COPYed context file).
Without any, the agent exits naming the variable (sandbox FAILURE).

Control surface (plain HTTP on 127.0.0.1:control_port, JSON bodies)
-------------------------------------------------------------------
    GET  /calls[?since=N]        {"calls": [...], "next": N}: every call,
         each {seq, time, service, method, metadata (keys), idempotency_key,
         retry_attempt, client_type, client_version, token_id, code,
         message, injected, replayed, ms, request (summary)}
    DELETE /calls                clear the log
    POST /fail {"method": M|"*", "code": "UNAVAILABLE", "count": N,
         "message": S, "when": "before"|"after", "delay_ms": D,
         "service": "ModalClient"|"TaskCommandRouter"|"*"}
         the next N calls of M fail with CODE ("after": the call is carried
         out, then the answer is lost); code "OK" with delay_ms only delays
    GET  /fail   pending rules;  DELETE /fail   drop them
    POST /sandboxes/<id>/kill {"signal": "KILL", "status": "TERMINATED"}
         kills the agent (the sandbox finishes with that status; default
         TERMINATED, exitcode 137); with "status": null the result is
         what the agent's exit gives (SUCCESS/FAILURE + exit code)
    GET  /sandboxes, /sandboxes/<id>, /images, /images/<id>   state
    POST /config {"list_page_size": N, "schedule_ms": [lo, hi],
         "build_step_ms": D, "router_jwt_ttl": SECONDS}
    POST /tokens {"token_id", "token_secret", "revoke": bool}

Left out: V2 sandboxes, exec/stdio through the router, readiness probes,
idle timeouts, volumes/mounts, GPU, real image building (RUN only logged),
unencrypted ports (served as TLS too), H2 tunnels (the agent is HTTP/1.1),
state across restarts (only the CA, certificates and tokens are kept).
PR_SET_PDEATHSIG covers the agents; commands an agent started in their own
session outlive a SIGKILLed fake (SIGTERM kills each agent's process group).
"""

import base64
import contextlib
import ctypes
import hashlib
import hmac
import http.server
import importlib
import json
import os
import random
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
from concurrent import futures
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fakecommon  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO / "providers" / "modal"
BUILDER_VERSION = "2024.10"
BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
MAX_POLL = 55.0
STATUS = {"UNSPECIFIED": 0, "SUCCESS": 1, "FAILURE": 2, "TERMINATED": 3,
          "TIMEOUT": 4, "INIT_FAILURE": 5, "INTERNAL_FAILURE": 6,
          "IDLE_TIMEOUT": 7, "MEMORY_MANAGER_EVICTION": 8}
PASS_ENV_PREFIXES = ("SBX_LOG", "SBX_AGENT_", "ASAN_", "UBSAN_", "LSAN_",
                     "MSAN_", "TSAN_")
# Unary methods whose answer is replayed for a repeated x-idempotency-key
# (creations; polls, lists and lookups are always answered afresh).
REPLAY_METHODS = ("AppGetOrCreate", "ImageGetOrCreate", "SandboxCreate",
                  "SandboxSnapshotFs", "SecretGetOrCreate",
                  "TaskSnapshotFilesystem")
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")
MSG_TOKEN_MISSING = (
    "Token missing. Could not authenticate client. If you have token "
    "credentials, see modal.com/docs/reference/modal.config for setup help. "
    "If you are a new user, register an account at modal.com, then run "
    "`modal token new`.")
MSG_TOKEN_BAD = (
    "Token validation failed: the token id/secret pair is invalid or has "
    "been revoked. Run `modal token new` or check MODAL_TOKEN_ID / "
    "MODAL_TOKEN_SECRET and your profile in ~/.modal.toml.")

SHUTDOWN = threading.Event()
log = fakecommon.Log()


# -- protos -------------------------------------------------------------------------

_PB = {}


def load_protos(out_dir=None, proto_dir=None):
    """Generate (protoc --python_out) and import the message modules of
    providers/modal/*.proto; returns (modal_api_pb2, task_command_router_pb2).
    Loaded once per process."""
    if "mods" in _PB:
        return _PB["mods"]
    proto_dir = Path(proto_dir or PROTO_DIR)
    out_dir = out_dir or tempfile.mkdtemp(prefix="modalfake-pb-")
    os.makedirs(out_dir, exist_ok=True)
    files = ["modal_api.proto", "task_command_router.proto"]
    for f in files:
        if not (proto_dir / f).exists():
            raise RuntimeError(f"{proto_dir / f} is missing")
    r = subprocess.run(["protoc", f"--python_out={out_dir}", f"-I{proto_dir}",
                        "-I/usr/include"] + files, capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"protoc failed:\n{r.stderr}")
    sys.path.insert(0, str(out_dir))
    api = importlib.import_module("modal_api_pb2")
    router = importlib.import_module("task_command_router_pb2")
    _PB["mods"] = (api, router)
    return api, router


def msg_class(desc):
    from google.protobuf import symbol_database
    try:
        return symbol_database.Default().GetSymbol(desc.full_name)
    except KeyError:
        from google.protobuf import message_factory
        return message_factory.MessageFactory().GetPrototype(desc)


def has_field(msg_or_cls, name):
    return name in msg_or_cls.DESCRIPTOR.fields_by_name


def setf(msg, name, value):
    """Set a scalar field only if this proto revision has it."""
    if has_field(msg, name) and value is not None:
        setattr(msg, name, value)


def summarize(msg):
    """A JSON-able summary of a request (long strings/bytes shortened)."""
    from google.protobuf import json_format
    try:
        d = json_format.MessageToDict(msg, preserving_proto_field_name=True)
    except Exception:  # noqa: BLE001
        return {}

    def cut(v, key=None):
        if isinstance(v, dict):
            return {k: cut(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [cut(x, key) for x in v]
        if isinstance(v, str) and len(v) > 300:
            return v[:120] + f"...({len(v)} chars)"
        return v
    img = d.get("image")
    if isinstance(img, dict) and "context_files" in img:
        img["context_files"] = [
            {"filename": c.get("filename", ""),
             "size": len(base64.b64decode(c.get("data", "") or ""))}
            for c in img["context_files"]]
    return cut(d)


# -- small helpers -----------------------------------------------------------------


def new_id(prefix, n=22):
    return prefix + "-" + "".join(secrets.choice(BASE62) for _ in range(n))


def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def b64url_dec(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def jwt_make(key, claims):
    h = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    p = b64url(json.dumps(claims, separators=(",", ":")).encode())
    sig = hmac.new(key, f"{h}.{p}".encode(), hashlib.sha256).digest()
    return f"{h}.{p}.{b64url(sig)}"


def jwt_check(key, token):
    """The claims of a valid, unexpired token, else None."""
    try:
        h, p, s = token.split(".")
        want = hmac.new(key, f"{h}.{p}".encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(want, b64url_dec(s)):
            return None
        claims = json.loads(b64url_dec(p))
        if claims.get("exp", 0) < time.time():
            return None
        return claims
    except (ValueError, TypeError, json.JSONDecodeError):
        return None


def make_certs(d):
    leaf_ext = ("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                "extendedKeyUsage=serverAuth\n")
    fakecommon.make_certs(d, "/CN=sbx-fake-modal-ca", [
        ("server", "/CN=api.modal.fake", leaf_ext),
        ("agent", "/CN=tunnel.modal.fake", leaf_ext)], ".pem")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DeadPort:
    """A loopback port bound but never listening: connections are refused
    (a tunnel whose container port nobody serves)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def close(self):
        self.sock.close()


class RpcFail(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


# -- process spawning -----------------------------------------------------------------

_LIBC = ctypes.CDLL("libc.so.6", use_errno=True)
PR_SET_PDEATHSIG = 1


class Spawner(fakecommon.Spawner):
    """Agents get PR_SET_PDEATHSIG (SIGKILL) in preexec_fn (see
    fakecommon.Spawner for why one thread starts them all)."""

    def start(self, argv, kw):
        parent = os.getpid()
        prctl = _LIBC.prctl

        def preexec():
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(127)
        return subprocess.Popen(argv, preexec_fn=preexec, **kw)


# -- state ------------------------------------------------------------------------------


class ImageRec:
    def __init__(self, iid, d):
        self.id = iid
        self.dir = os.path.join(d, "images", iid)
        self.fs = os.path.join(self.dir, "fs")
        self.key = None
        self.app_id = ""
        self.base = ""
        self.commands = []
        self.context = []          # [{"filename", "size", "elf"}]
        self.env = {}
        self.workdir = None
        self.agent_path = None
        self.logs = []             # [((ms, seq), entry_id, text, ts)]
        self.result = None         # {"status", "exception", "exitcode"}
        self.created = time.time()
        self.source = "build"
        self.snapshot_of = None

    def info(self):
        return {"id": self.id, "base": self.base, "commands": self.commands,
                "context_files": self.context, "env": sorted(self.env),
                "agent_path": self.agent_path, "result": self.result,
                "source": self.source, "snapshot_of": self.snapshot_of,
                "fs": self.fs, "app_id": self.app_id,
                "log": [e[2] for e in self.logs]}


class SandboxRec:
    def __init__(self, sid, d):
        self.id = sid
        self.dir = os.path.join(d, "sandboxes", sid)
        self.fs = os.path.join(self.dir, "fs")
        self.log_path = os.path.join(self.dir, "agent.log")
        self.app_id = ""
        self.env_name = "main"
        self.image = None
        self.entrypoint = []
        self.workdir = "/"
        self.timeout_secs = 300
        self.open_ports = []       # [(port, unencrypted)]
        self.tags = {}
        self.created_at = 0.0
        self.task_id = None
        self.scheduled_at = None
        self.state = "pending"    # pending, running, finished
        self.result = None
        self.plan = None           # {"kind": agent|idle|missing, ...}
        self.proc = None
        self.agent_port = None
        self.container_port = None
        self.container_host = None
        self.ready_at = None
        self.spawned = False
        self.finished_at = None
        self.stop = threading.Event()
        self.kill_status = None
        self.dead_ports = {}
        self.snapshots = {}        # snapshot_id -> image id

    def info(self):
        return {"id": self.id, "app_id": self.app_id, "env": self.env_name,
                "image_id": self.image.id if self.image else None,
                "entrypoint": self.entrypoint, "workdir": self.workdir,
                "timeout_secs": self.timeout_secs,
                "open_ports": self.open_ports, "tags": self.tags,
                "created_at": self.created_at, "task_id": self.task_id,
                "state": self.state, "result": self.result,
                "plan": self.plan, "agent_pid": self.proc.pid if self.proc else None,
                "agent_port": self.agent_port,
                "container_port": self.container_port,
                "ready": self.ready_at is not None, "fs": self.fs,
                "agent_log": self.log_path}


class Fake:
    def __init__(self, args, d, pb, rpb):
        self.args = args
        self.dir = d
        self.pb = pb
        self.rpb = rpb
        self.cv = threading.Condition()
        self.spawner = Spawner()
        self.jwt_key = secrets.token_bytes(32)
        self.tokens = {}           # token_id -> {"secret", "profile"}
        self.envs = {"main": {"id": new_id("en"), "name": "main"}}
        self.apps = {}             # (env, name) -> app dict
        self.apps_by_id = {}
        self.images = {}
        self.image_keys = {}
        self.sandboxes = {}
        self.tasks = {}
        self.secrets = {}          # secret id -> env dict
        self.calls = []
        self.faults = []
        self.idem = {}             # (method, key) -> response bytes
        self.seq = 0
        self.entry_seq = 0
        self.last_created = 0.0
        lo, _, hi = str(args.schedule_ms).partition(":")
        self.schedule_ms = (float(lo), float(hi or lo))
        self.build_step_ms = float(args.build_step_ms)
        self.list_page_size = int(args.list_page_size)
        self.router_url = None
        self.jwt_ttl = 3600
        self.req_log = open(os.path.join(d, "requests.jsonl"), "a")

    # -- request bookkeeping ------------------------------------------------------

    def begin(self, service, method, req, ctx):
        md = {}
        for k, v in ctx.invocation_metadata() or ():
            md.setdefault(k.lower(), v)
        rec = {"seq": 0, "time": time.time(), "service": service,
               "method": method, "metadata": sorted(md),
               "idempotency_key": md.get("x-idempotency-key"),
               "retry_attempt": md.get("x-retry-attempt"),
               "client_type": md.get("x-modal-client-type"),
               "client_version": md.get("x-modal-client-version"),
               "token_id": md.get("x-modal-token-id"),
               "code": None, "message": "", "injected": False,
               "replayed": False, "request": summarize(req)}
        with self.cv:
            self.seq += 1
            rec["seq"] = self.seq
            self.calls.append(rec)
        return rec, md

    def finish(self, rec, code, message=""):
        rec["code"] = code
        rec["message"] = message
        rec["ms"] = round((time.time() - rec["time"]) * 1000, 1)
        try:
            with self.cv:
                self.req_log.write(json.dumps(rec) + "\n")
                self.req_log.flush()
        except (OSError, ValueError):
            pass

    def take_fault(self, service, method, when):
        with self.cv:
            for f in self.faults:
                if f["count"] <= 0 or f.get("when", "before") != when:
                    continue
                if f.get("method", "*") not in ("*", method):
                    continue
                if f.get("service", "*") not in ("*", service):
                    continue
                f["count"] -= 1
                f["used"] = f.get("used", 0) + 1
                self.faults = [x for x in self.faults if x["count"] > 0]
                return dict(f)
        return None

    def apply_fault(self, rec, service, method, when):
        f = self.take_fault(service, method, when)
        if not f:
            return
        if f.get("delay_ms"):
            time.sleep(float(f["delay_ms"]) / 1000)
        code = f.get("code", "UNAVAILABLE")
        if code != "OK":
            rec["injected"] = True
            raise RpcFail(code, f.get("message") or
                          f"injected failure: {code} ({method})")

    def check_client(self, md):
        if not re.fullmatch(r"\d+", md.get("x-modal-client-type") or "") or \
                not md.get("x-modal-client-version"):
            raise RpcFail("FAILED_PRECONDITION",
                          "Missing client type or version: requests must carry "
                          "x-modal-client-type and x-modal-client-version. "
                          "Please update your Modal client.")
        tid = md.get("x-modal-token-id")
        tsec = md.get("x-modal-token-secret")
        if not tid or not tsec:
            raise RpcFail("UNAUTHENTICATED", MSG_TOKEN_MISSING)
        with self.cv:
            t = self.tokens.get(tid)
        if not t or not hmac.compare_digest(t["secret"], tsec):
            raise RpcFail("UNAUTHENTICATED", MSG_TOKEN_BAD)
        at = md.get("x-modal-auth-token")
        if at:
            claims = jwt_check(self.jwt_key, at)
            if not claims or claims.get("token_id") != tid:
                raise RpcFail("UNAUTHENTICATED",
                              "Invalid or expired auth token "
                              "(x-modal-auth-token): fetch a new one with "
                              "AuthTokenGet.")

    def check_router(self, md, req):
        auth = md.get("authorization", "")
        if not auth.startswith("Bearer "):
            raise RpcFail("UNAUTHENTICATED",
                          "missing authorization: Bearer <jwt>")
        claims = jwt_check(self.jwt_key, auth[7:].strip())
        if not claims or claims.get("typ") != "command-router":
            raise RpcFail("UNAUTHENTICATED", "invalid or expired JWT")
        tid = getattr(req, "task_id", "")
        if tid and claims.get("task_id") != tid:
            raise RpcFail("UNAUTHENTICATED",
                          f"JWT is not valid for task {tid}")

    def wrap(self, service, method, fn, resp_cls, streaming):
        def run_pre(rec, md, req, ctx):
            self.apply_fault(rec, service, method, "before")
            if service == "ModalClient":
                self.check_client(md)
            else:
                self.check_router(md, req)
            if fn is None:
                raise RpcFail("UNIMPLEMENTED",
                              f"Method {method} is not implemented by the fake")

        def fail(ctx, rec, e):
            import grpc
            if rec is not None:
                self.finish(rec, e.code, e.message)
            ctx.abort(getattr(grpc.StatusCode, e.code), e.message)

        @contextlib.contextmanager
        def answering(ctx, rec):
            """An RpcFail ends the call with its status, anything else
            with INTERNAL (and a log line)."""
            try:
                yield
            except RpcFail as e:
                fail(ctx, rec, e)
            except Exception as e:  # noqa: BLE001
                log(f"{method} crashed:\n{traceback.format_exc()}")
                fail(ctx, rec, RpcFail("INTERNAL", f"internal error: {e}"))

        if not streaming:
            def unary(req, ctx):
                rec, md = self.begin(service, method, req, ctx)
                with answering(ctx, rec):
                    run_pre(rec, md, req, ctx)
                    key = md.get("x-idempotency-key") \
                        if method in REPLAY_METHODS else None
                    if key:
                        with self.cv:
                            cached = self.idem.get((method, key))
                        if cached is not None:
                            rec["replayed"] = True
                            self.finish(rec, "OK")
                            return resp_cls.FromString(cached)
                    resp = fn(req, ctx, md)
                    if key:
                        with self.cv:
                            self.idem[(method, key)] = resp.SerializeToString()
                    self.apply_fault(rec, service, method, "after")
                    self.finish(rec, "OK")
                    return resp
            return unary

        def stream(req, ctx):
            rec, md = self.begin(service, method, req, ctx)
            with answering(ctx, rec):
                run_pre(rec, md, req, ctx)
                for r in fn(req, ctx, md):
                    yield r
                self.apply_fault(rec, service, method, "after")
                self.finish(rec, "OK")
        return stream

    def handlers(self, pbmod, service):
        import grpc
        svc = pbmod.DESCRIPTOR.services_by_name[service]
        table = {}
        for m in svc.methods:
            req_cls, resp_cls = msg_class(m.input_type), msg_class(m.output_type)
            fn = getattr(self, "rpc_" + m.name, None)
            streaming = bool(getattr(m, "server_streaming", False))
            h = self.wrap(service, m.name, fn, resp_cls, streaming)
            if streaming:
                table[m.name] = grpc.unary_stream_rpc_method_handler(
                    h, request_deserializer=req_cls.FromString,
                    response_serializer=resp_cls.SerializeToString)
            else:
                table[m.name] = grpc.unary_unary_rpc_method_handler(
                    h, request_deserializer=req_cls.FromString,
                    response_serializer=resp_cls.SerializeToString)
        return grpc.method_handlers_generic_handler(svc.full_name, table)

    # -- utilities ------------------------------------------------------------------

    @staticmethod
    def poll_timeout(ctx, t, default=0.0):
        t = float(t) if t else default
        t = max(0.0, min(t, MAX_POLL))
        rem = ctx.time_remaining()
        if rem is not None:
            t = min(t, max(0.0, rem - 0.2))
        return t

    def wait_until(self, done, t):
        """With self.cv held: wait until done(), for at most t seconds, or
        until the fake stops."""
        deadline = time.monotonic() + t
        while not done() and time.monotonic() < deadline and \
                not SHUTDOWN.is_set():
            self.cv.wait(min(0.5, max(0.0, deadline - time.monotonic())))

    def result_msg(self, r):
        res = self.pb.GenericResult()
        if r:
            res.status = STATUS[r["status"]]
            res.exception = r.get("exception", "") or ""
            res.exitcode = int(r.get("exitcode", 0) or 0)
        return res

    def env_lookup(self, name, create=False):
        name = name or "main"
        with self.cv:
            e = self.envs.get(name)
            if e is None and create:
                e = self.envs[name] = {"id": new_id("en"), "name": name}
        if e is None:
            raise RpcFail("NOT_FOUND", f"Environment '{name}' not found")
        return e

    def lookup(self, table, key, message):
        """table[key], read under the lock; NOT_FOUND with `message` when
        it is not there."""
        with self.cv:
            v = table.get(key)
        if v is None:
            raise RpcFail("NOT_FOUND", message)
        return v

    def sandbox(self, sid):
        if not sid:
            raise RpcFail("INVALID_ARGUMENT", "sandbox_id is required")
        sb = self.lookup(self.sandboxes, sid,
                         f"Sandbox with id '{sid}' not found")
        return sb

    # -- environments, apps, auth, secrets ---------------------------------------------------

    def rpc_EnvironmentGetOrCreate(self, req, ctx, md):
        ct = req.object_creation_type
        e = self.env_lookup(req.deployment_name, create=ct in (1, 3))
        resp = self.pb.EnvironmentGetOrCreateResponse(environment_id=e["id"])
        resp.metadata.name = e["name"]
        resp.metadata.settings.image_builder_version = BUILDER_VERSION
        resp.metadata.settings.webhook_suffix = "modal.run"
        return resp

    def rpc_AppGetOrCreate(self, req, ctx, md):
        if not req.app_name:
            raise RpcFail("INVALID_ARGUMENT", "App name is required")
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", req.app_name):
            raise RpcFail("INVALID_ARGUMENT",
                          f"Invalid App name '{req.app_name}': names may "
                          "contain only alphanumeric characters, dashes, "
                          "periods and underscores, and be < 64 characters")
        e = self.env_lookup(req.environment_name)
        ct = req.object_creation_type
        key = (e["name"], req.app_name)
        with self.cv:
            app = self.apps.get(key)
            if app is not None and ct == 2:
                raise RpcFail("ALREADY_EXISTS",
                              f"App '{req.app_name}' already exists in "
                              f"environment '{e['name']}'")
            if app is None or ct == 5:
                if ct not in (1, 2, 3, 4, 5):
                    raise RpcFail("NOT_FOUND",
                                  f"App '{req.app_name}' not found in "
                                  f"environment '{e['name']}'")
                app = {"id": new_id("ap"), "name": req.app_name,
                       "env": e["name"], "created": time.time()}
                if ct != 5:
                    self.apps[key] = app
                self.apps_by_id[app["id"]] = app
        return self.pb.AppGetOrCreateResponse(app_id=app["id"])

    def rpc_AuthTokenGet(self, req, ctx, md):
        now = int(time.time())
        tok = jwt_make(self.jwt_key, {"typ": "auth", "sub": md.get("x-modal-token-id"),
                                      "token_id": md.get("x-modal-token-id"),
                                      "iat": now, "exp": now + 1800})
        return self.pb.AuthTokenGetResponse(token=tok)

    def rpc_SecretGetOrCreate(self, req, ctx, md):
        env = dict(getattr(req, "env_dict", {}) or {})
        sid = new_id("st")
        with self.cv:
            self.secrets[sid] = env
        return self.pb.SecretGetOrCreateResponse(secret_id=sid)

    # -- images -------------------------------------------------------------------------

    def next_entry(self):
        with self.cv:
            self.entry_seq += 1
            ms = int(time.time() * 1000)
            return (ms, self.entry_seq), f"{ms}-{self.entry_seq}"

    def img_log(self, img, text):
        key, eid = self.next_entry()
        with self.cv:
            img.logs.append((key, eid, text if text.endswith("\n") else text + "\n",
                             time.time()))
            self.cv.notify_all()

    def rpc_ImageGetOrCreate(self, req, ctx, md):
        if not req.builder_version:
            raise RpcFail("FAILED_PRECONDITION",
                          "Image builder version is required: get it from "
                          "EnvironmentGetOrCreate "
                          "(metadata.settings.image_builder_version)")
        if req.existing_image_id:
            img = self.lookup(self.images, req.existing_image_id,
                              f"Image {req.existing_image_id} not found")
            resp = self.pb.ImageGetOrCreateResponse(image_id=img.id)
            if img.result:
                resp.result.CopyFrom(self.result_msg(img.result))
            return resp
        if req.app_id:
            with self.cv:
                if req.app_id not in self.apps_by_id:
                    raise RpcFail("NOT_FOUND", f"App {req.app_id} not found")
        cmds = list(req.image.dockerfile_commands)
        if not cmds:
            raise RpcFail("INVALID_ARGUMENT",
                          "Image definition has no Dockerfile commands")
        m = re.match(r"^\s*FROM\s+(\S+)(\s+AS\s+\S+)?\s*$", cmds[0], re.I)
        if not m:
            raise RpcFail("INVALID_ARGUMENT",
                          f"The first Dockerfile command must be "
                          f"`FROM <image>`, got {cmds[0]!r}")
        files = {}
        for cf in req.image.context_files:
            files[cf.filename.lstrip("/").removeprefix("./")] = cf.data
        h = hashlib.sha256()
        h.update(req.builder_version.encode() + b"\0")
        for c in cmds:
            h.update(c.encode() + b"\0")
        for name in sorted(files):
            h.update(name.encode() + b"\0" +
                     hashlib.sha256(files[name]).digest())
        key = h.hexdigest()
        with self.cv:
            iid = self.image_keys.get(key)
            img = self.images.get(iid) if iid else None
            if img is not None and not req.force_build and \
                    (img.result is None or img.result["status"] == "SUCCESS"):
                resp = self.pb.ImageGetOrCreateResponse(image_id=img.id)
                if img.result:
                    resp.result.CopyFrom(self.result_msg(img.result))
                return resp
            img = ImageRec(new_id("im"), self.dir)
            img.key = key
            img.app_id = req.app_id
            img.base = m.group(1)
            img.commands = cmds
            img.context = [{"filename": n, "size": len(b),
                            "elf": b[:4] == b"\x7fELF"}
                           for n, b in files.items()]
            self.images[img.id] = img
            self.image_keys[key] = img.id
        threading.Thread(target=self.build, args=(img, files), daemon=True,
                         name="build-" + img.id).start()
        return self.pb.ImageGetOrCreateResponse(image_id=img.id)

    def build(self, img, files):
        step = self.build_step_ms / 1000
        try:
            res = self._build(img, files, step)
        except Exception as e:  # noqa: BLE001
            log(f"build {img.id} crashed:\n{traceback.format_exc()}")
            res = {"status": "FAILURE", "exception": f"internal error: {e}",
                   "exitcode": 1}
        if res["status"] == "SUCCESS":
            self.img_log(img, f"Saving image {img.id}...")
            time.sleep(step)
            self.img_log(img, f"Image saved, took {len(img.logs) * step:.2f}s")
        with self.cv:
            img.result = res
            self.cv.notify_all()
        log(f"image {img.id} ({img.base}): {res['status']} "
            f"agent={img.agent_path}")

    def _build(self, img, files, step):
        os.makedirs(img.fs, exist_ok=True)
        n = len(img.commands)
        self.img_log(img, f"Building image {img.id}")
        time.sleep(step)
        for i, cmd in enumerate(img.commands, 1):
            self.img_log(img, f"Step {i}/{n} : {cmd}")
            time.sleep(step)
            word, _, rest = cmd.strip().partition(" ")
            word = word.upper()
            if word == "FROM":
                if "buildfail" in img.base:
                    self.img_log(img, f"Error: failed to pull {img.base}: "
                                 "manifest unknown (simulated build failure)")
                    return {"status": "FAILURE", "exitcode": 1,
                            "exception": f"Image build for {img.id} failed. "
                            "See build logs for more details."}
                self.img_log(img, f" ---> Pulled {img.base}")
            elif word in ("COPY", "ADD"):
                err = self.do_copy(img, files, rest)
                if err:
                    self.img_log(img, err)
                    return {"status": "FAILURE", "exitcode": 1,
                            "exception": f"Image build for {img.id} failed: "
                            f"{err}"}
            elif word == "ENV":
                self.do_env(img, rest)
            elif word == "WORKDIR":
                img.workdir = rest.strip()
                os.makedirs(os.path.join(img.fs, img.workdir.lstrip("/")),
                            exist_ok=True)
            elif word == "RUN":
                self.do_run(img, rest)
                self.img_log(img, " ---> Running in sandbox (simulated)")
            time.sleep(step)
        return {"status": "SUCCESS", "exitcode": 0, "exception": ""}

    def do_env(self, img, rest):
        try:
            words = shlex.split(rest)
        except ValueError:
            words = rest.split()
        if words and "=" not in words[0]:
            img.env[words[0]] = " ".join(words[1:])
            return
        for w in words:
            k, _, v = w.partition("=")
            img.env[k] = v

    def do_run(self, img, rest):
        try:
            words = shlex.split(rest)
        except ValueError:
            return
        if words[:1] == ["chmod"] and len(words) >= 3:
            mode = words[1]
            for p in words[2:]:
                full = os.path.join(img.fs, p.lstrip("/"))
                if os.path.isfile(full):
                    cur = os.stat(full).st_mode & 0o7777
                    if re.fullmatch(r"[0-7]{3,4}", mode):
                        os.chmod(full, int(mode, 8))
                    elif "+x" in mode:
                        os.chmod(full, cur | 0o111)

    def do_copy(self, img, files, rest):
        rest = rest.strip()
        chmod = None
        words = []
        if rest.startswith("["):
            try:
                words = json.loads(rest)
            except json.JSONDecodeError:
                return f"COPY: malformed JSON form: {rest}"
        else:
            try:
                words = shlex.split(rest)
            except ValueError:
                words = rest.split()
        opts = [w for w in words if w.startswith("--")]
        words = [w for w in words if not w.startswith("--")]
        for o in opts:
            if o.startswith("--chmod="):
                chmod = int(o.split("=", 1)[1], 8)
        if len(words) < 2:
            return f"COPY needs a source and a destination: {rest}"
        srcs, dest = words[:-1], words[-1]
        multi = len(srcs) > 1 or dest.endswith("/")
        for src in srcs:
            s = src.lstrip("/").removeprefix("./").rstrip("/")
            copied = []
            if s in files:
                name = os.path.basename(s)
                target = os.path.join(dest, name) if multi else dest
                copied.append((s, target))
            else:
                under = [f for f in files if s in ("", ".") or
                         f.startswith(s + "/")]
                if not under:
                    return (f"COPY failed: file not found in build context "
                            f"or excluded: {src}")
                for f in under:
                    relp = f if s in ("", ".") else f[len(s) + 1:]
                    copied.append((f, os.path.join(dest, relp)))
                bundle_agent = [t for f, t in copied
                                if t.endswith("/bin/sbx-agent")]
                if bundle_agent and not img.agent_path:
                    img.agent_path = "/" + bundle_agent[0].lstrip("/")
            total = 0
            for f, target in copied:
                data = files[f]
                full = os.path.join(img.fs, target.lstrip("/"))
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "wb") as fh:
                    fh.write(data)
                elf = data[:4] == b"\x7fELF"
                mode = chmod if chmod is not None else \
                    (0o755 if elf or data[:2] == b"#!" else 0o644)
                os.chmod(full, mode)
                total += len(data)
                if elf and not img.agent_path and \
                        (os.path.basename(target) == "sbx-agent" or
                         len(copied) == 1):
                    img.agent_path = "/" + target.lstrip("/")
            self.img_log(img, f" ---> Copied {src} to {dest} "
                         f"({len(copied)} file(s), {total} bytes)")
        return None

    def rpc_ImageJoinStreaming(self, req, ctx, md):
        img = self.lookup(self.images, req.image_id,
                          f"Image {req.image_id} not found")
        t = self.poll_timeout(ctx, req.timeout, MAX_POLL)
        deadline = time.monotonic() + t
        last = (0, 0)
        if req.last_entry_id:
            mm = re.fullmatch(r"(\d+)-(\d+)", req.last_entry_id)
            if not mm:
                raise RpcFail("INVALID_ARGUMENT",
                              f"invalid last_entry_id {req.last_entry_id!r}")
            last = (int(mm.group(1)), int(mm.group(2)))
        with self.cv:
            done_at_start = img.result is not None
        send_logs = not done_at_start or req.include_logs_for_finished
        while True:
            with self.cv:
                new = [e for e in img.logs if e[0] > last] if send_logs else []
                result = img.result
                if not new and result is None:
                    self.cv.wait(max(0.0, min(0.2, deadline - time.monotonic())))
                    new = [e for e in img.logs if e[0] > last] if send_logs else []
                    result = img.result
            for key, eid, text, ts in new:
                r = self.pb.ImageJoinStreamingResponse(entry_id=eid)
                tl = r.task_logs.add(data=text, timestamp=ts)
                setf(tl, "file_descriptor", 1)
                last = key
                yield r
            if result is not None and (not send_logs or
                                       not [e for e in img.logs if e[0] > last]):
                r = self.pb.ImageJoinStreamingResponse(eof=True)
                r.result.CopyFrom(self.result_msg(result))
                yield r
                return
            if time.monotonic() >= deadline or not ctx.is_active() or \
                    SHUTDOWN.is_set():
                return

    # -- sandboxes -------------------------------------------------------------------------

    def rpc_SandboxCreate(self, req, ctx, md):
        app = self.lookup(self.apps_by_id, req.app_id,
                          f"App {req.app_id!r} not found")
        d = req.definition
        if not d.image_id:
            raise RpcFail("INVALID_ARGUMENT", "Sandbox definition has no image_id")
        img = self.lookup(self.images, d.image_id,
                          f"Image {d.image_id} not found")
        deadline = time.monotonic() + 60
        with self.cv:
            while img.result is None and time.monotonic() < deadline:
                self.cv.wait(0.2)
        if img.result is None or img.result["status"] != "SUCCESS":
            raise RpcFail("FAILED_PRECONDITION",
                          f"Image {img.id} failed to build or is not built")
        if d.timeout_secs > 86400:
            raise RpcFail("INVALID_ARGUMENT",
                          "timeout_secs must be at most 86400 (24 hours)")
        workdir = d.workdir if d.HasField("workdir") else (img.workdir or "/")
        if not workdir.startswith("/"):
            raise RpcFail("INVALID_ARGUMENT",
                          f"workdir must be an absolute path, got: {workdir}")
        env = dict(img.env)
        for sid in d.secret_ids:
            s = self.lookup(self.secrets, sid,
                            f"Secret {sid} not found")
            env.update(s)
        sb = SandboxRec(new_id("sb"), self.dir)
        sb.app_id = app["id"]
        sb.env_name = app["env"]
        sb.image = img
        sb.entrypoint = list(d.entrypoint_args)
        sb.workdir = workdir
        sb.timeout_secs = d.timeout_secs or 300
        if d.HasField("open_ports"):
            sb.open_ports = [(p.port, p.unencrypted) for p in d.open_ports.ports]
        os.makedirs(sb.dir, exist_ok=True)
        if os.path.isdir(img.fs):
            subprocess.run(["cp", "-a", img.fs, sb.fs], check=True)
        os.makedirs(os.path.join(sb.fs, workdir.lstrip("/")), exist_ok=True)
        sb.plan = self.plan(sb, env)
        with self.cv:
            now = time.time()
            if now <= self.last_created:
                now = self.last_created + 1e-6
            self.last_created = now
            sb.created_at = now
            self.sandboxes[sb.id] = sb
            self.cv.notify_all()
        threading.Thread(target=self.lifecycle, args=(sb,), daemon=True,
                         name="sandbox-" + sb.id).start()
        log(f"sandbox {sb.id}: image {img.id} plan {sb.plan.get('kind')} "
            f"entrypoint {sb.entrypoint}")
        return self.pb.SandboxCreateResponse(sandbox_id=sb.id)

    def map_path(self, sb, p):
        full = os.path.normpath(os.path.join(sb.fs, p.lstrip("/")))
        if not (full + "/").startswith(sb.fs.rstrip("/") + "/"):
            full = os.path.join(sb.fs, os.path.basename(p))
        return full

    def plan(self, sb, env):
        """What the entrypoint does: {"kind": agent|idle|missing, ...}."""
        args = list(sb.entrypoint)
        env = dict(env)
        # wrappers: sh -c "...", env K=V, exec, K=V
        for _ in range(4):
            if len(args) >= 3 and os.path.basename(args[0]) in (
                    "sh", "bash", "dash") and args[1] == "-c":
                try:
                    args = shlex.split(args[2])
                except ValueError:
                    break
                continue
            if args and args[0] == "exec":
                args = args[1:]
                continue
            if args and os.path.basename(args[0]) == "env":
                args = args[1:]
                while args and args[0].startswith("-"):
                    args = args[1:]
                continue
            if args and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", args[0]):
                while args and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", args[0]):
                    k, _, v = args[0].partition("=")
                    env[k] = v
                    args = args[1:]
                continue
            break
        if "serve" not in args:
            return {"kind": "idle", "argv": args}
        i = args.index("serve")
        before = args[:i]
        found = None
        for w in before:
            if w.startswith("-") or "=" in w:
                continue
            if not w.startswith("/"):
                # a bare name: looked up in the image's PATH
                w = next(("/" + os.path.join(p, w) for p in
                          ("usr/local/sbin", "usr/local/bin", "usr/sbin",
                           "usr/bin", "sbin", "bin")
                          if "/" not in w and
                          os.path.isfile(os.path.join(sb.fs, p, w))), None)
                if w is None:
                    continue
            if w == sb.image.agent_path or os.path.isfile(self.map_path(sb, w)):
                if w == sb.image.agent_path or os.path.basename(w) == "sbx-agent":
                    found = w
                    break
                found = found or w
        prog = before[0] if before else "serve"
        if found is None:
            return {"kind": "missing", "argv": args, "prog": prog}
        return {"kind": "agent", "argv": args[i:], "prog": found, "env": env}

    def agent_argv(self, sb):
        out = [self.args.agent]
        args = sb.plan["argv"]
        for opt, val in fakecommon.agent_options(args):
            if val is None:
                out.append(opt)
                continue
            if opt in ("--tls-cert", "--tls-key"):
                continue
            if opt == "--root":
                val = self.map_path(sb, val)
                os.makedirs(val, exist_ok=True)
            elif opt == "--token-file":
                val = self.map_path(sb, val)
            elif opt == "--listen":
                m = re.fullmatch(r"(.*):(\d+)", val)
                if m:
                    sb.container_host = m.group(1)
                    sb.container_port = int(m.group(2))
                sb.agent_port = free_port()
                val = f"127.0.0.1:{sb.agent_port}"
            out += [opt, val]
        out += ["--tls-cert", os.path.join(self.dir, "agent.pem"),
                "--tls-key", os.path.join(self.dir, "agent.key")]
        return out

    def set_state(self, sb, **kw):
        with self.cv:
            for k, v in kw.items():
                setattr(sb, k, v)
            self.cv.notify_all()

    def finish_sb(self, sb, status, exitcode=0, exception=""):
        with self.cv:
            if sb.result is None:
                sb.result = {"status": status, "exitcode": exitcode,
                             "exception": exception}
                sb.state = "finished"
                sb.finished_at = time.time()
                log(f"sandbox {sb.id}: finished {status} exit {exitcode} "
                    f"{exception}")
            self.cv.notify_all()
        sb.stop.set()

    def kill_agent(self, sb, sig=signal.SIGTERM, grace=2.0):
        proc = sb.proc
        if proc is None or proc.poll() is not None:
            return
        fakecommon.signal_group(proc, sig)
        fakecommon.reap(proc, grace)

    def alog(self, sb, text):
        with open(sb.log_path, "a") as f:
            f.write(text if text.endswith("\n") else text + "\n")

    def lifecycle(self, sb):
        try:
            self._lifecycle(sb)
        except Exception as e:  # noqa: BLE001
            log(f"sandbox {sb.id} lifecycle crashed:\n{traceback.format_exc()}")
            self.finish_sb(sb, "INTERNAL_FAILURE", 1, f"internal error: {e}")
        finally:
            self.kill_agent(sb, signal.SIGTERM)
            for dp in sb.dead_ports.values():
                dp.close()

    def _lifecycle(self, sb):
        deadline = sb.created_at + sb.timeout_secs
        base = sb.image.base
        lo, hi = self.schedule_ms
        if "neverready" in base:
            self.alog(sb, f"image {base}: never scheduled (simulated)")
            if not sb.stop.wait(max(0.0, deadline - time.time())):
                self.finish_sb(sb, "TIMEOUT", 0,
                               "Sandbox timed out before it was scheduled")
            return
        if sb.stop.wait(random.uniform(lo, hi) / 1000):
            return
        with self.cv:
            if sb.result is not None:
                return
            sb.task_id = new_id("ta")
            sb.scheduled_at = time.time()
            self.tasks[sb.task_id] = sb
            self.cv.notify_all()
        if "crashlog" in base:
            # As the agent's own exit: the log's tail is the exception.
            for i in range(1, 9):
                self.alog(sb, f"start step {i}")
            self.alog(sb, "fatal: cannot serve /workspace: Permission "
                      "denied")
            tail = open(sb.log_path, errors="replace").read()[-500:]
            self.finish_sb(sb, "FAILURE", 1, "Sandbox entrypoint exited "
                           f"with code 1: {tail.strip()}")
            return
        if "crash" in base:
            self.alog(sb, "entrypoint crashed at start (simulated)")
            self.finish_sb(sb, "FAILURE", 1,
                           "Sandbox entrypoint exited with code 1")
            return
        kind = sb.plan["kind"]
        if kind == "missing":
            msg = (f'exec: "{sb.plan["prog"]}": stat {sb.plan["prog"]}: '
                   "no such file or directory")
            self.alog(sb, msg)
            self.finish_sb(sb, "FAILURE", 127, msg)
            return
        if kind == "agent":
            if not self.spawn(sb):
                return
        else:
            self.set_state(sb, state="running", ready_at=time.time())
        pos = 0
        while not sb.stop.wait(0.02):
            if time.time() >= deadline:
                self.kill_agent(sb, signal.SIGKILL, 1)
                self.finish_sb(sb, "TIMEOUT", 0,
                               f"Sandbox timed out after {sb.timeout_secs}s")
                return
            if sb.proc is None:
                continue
            if sb.ready_at is None:
                try:
                    with open(sb.log_path, "rb") as f:
                        f.seek(pos)
                        data = f.read()
                    if re.search(rb"listening on", data):
                        self.set_state(sb, ready_at=time.time())
                        log(f"sandbox {sb.id}: agent listening on "
                            f"127.0.0.1:{sb.agent_port}")
                except OSError:
                    pass
            code = sb.proc.poll()
            if code is not None:
                code = code if code >= 0 else 128 - code
                if sb.kill_status:
                    self.finish_sb(sb, sb.kill_status, 137,
                                   "Sandbox was killed")
                else:
                    tail = ""
                    try:
                        tail = open(sb.log_path, errors="replace").read()[-500:]
                    except OSError:
                        pass
                    self.finish_sb(sb, "SUCCESS" if code == 0 else "FAILURE",
                                   code, "" if code == 0 else
                                   f"Sandbox entrypoint exited with code "
                                   f"{code}: {tail.strip()}")
                return

    def spawn(self, sb):
        argv = self.agent_argv(sb)
        # A container's environment: the image's, not the host's (only
        # debugging/sanitizer knobs of the fake's own environment pass).
        home = os.path.join(sb.fs, "root")
        os.makedirs(home, exist_ok=True)
        penv = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
                        "/sbin:/bin", "HOME": home, "LANG": "C.UTF-8",
                "HOSTNAME": "modal"}
        for k, v in os.environ.items():
            if k.startswith(PASS_ENV_PREFIXES):
                penv[k] = v
        penv.update(sb.plan.get("env") or {})
        penv["MODAL_SANDBOX_ID"] = sb.id
        penv["MODAL_TASK_ID"] = sb.task_id or ""
        cwd = os.path.join(sb.fs, sb.workdir.lstrip("/"))
        os.makedirs(cwd, exist_ok=True)
        with open(sb.log_path, "ab") as lf:
            lf.write(f"--- {' '.join(argv)}\n".encode())
            lf.flush()
            try:
                proc = self.spawner.popen(
                    argv, stdin=subprocess.DEVNULL, stdout=lf,
                    stderr=subprocess.STDOUT, env=penv, cwd=cwd,
                    start_new_session=True)
            except OSError as e:
                self.finish_sb(sb, "FAILURE", 127, f"exec failed: {e}")
                return False
        for port, _unenc in sb.open_ports:
            reachable = (port == sb.container_port and
                         sb.container_host not in LOOPBACK_NAMES)
            if not reachable:
                sb.dead_ports[port] = DeadPort()
        if sb.container_host in LOOPBACK_NAMES:
            self.alog(sb, f"fake: the agent listens on {sb.container_host} "
                      "inside the container: the tunnel cannot reach it")
        self.set_state(sb, proc=proc, state="running", spawned=True)
        log(f"sandbox {sb.id}: agent pid {proc.pid} port {sb.agent_port} "
            f"(container port {sb.container_port})")
        return True

    def tunnels(self, sb):
        out = []
        for port, _unenc in sb.open_ports:
            t = self.pb.TunnelData(host="127.0.0.1", container_port=port)
            if port in sb.dead_ports:
                t.port = sb.dead_ports[port].port
            elif port == sb.container_port and sb.agent_port:
                t.port = sb.agent_port
            else:
                dp = sb.dead_ports.setdefault(port, DeadPort())
                t.port = dp.port
            out.append(t)
        return out

    def rpc_SandboxGetTaskId(self, req, ctx, md):
        sb = self.sandbox(req.sandbox_id)
        t = self.poll_timeout(ctx, req.timeout if req.HasField("timeout") else 0)

        def done():
            if sb.result is not None:
                return True
            if req.wait_until_ready:
                return sb.task_id is not None and sb.ready_at is not None
            return sb.task_id is not None
        with self.cv:
            self.wait_until(done, t)
            resp = self.pb.SandboxGetTaskIdResponse()
            if sb.task_id and (not req.wait_until_ready or sb.ready_at or
                               sb.result):
                resp.task_id = sb.task_id
            if sb.result is not None:
                resp.task_result.CopyFrom(self.result_msg(sb.result))
        return resp

    def rpc_SandboxGetTunnels(self, req, ctx, md):
        sb = self.sandbox(req.sandbox_id)
        t = self.poll_timeout(ctx, req.timeout, 0)
        with self.cv:
            self.wait_until(lambda: sb.result is not None or
                            sb.state == "running", t)
            resp = self.pb.SandboxGetTunnelsResponse()
            if sb.result is not None:
                resp.result.CopyFrom(self.result_msg(sb.result))
            elif sb.state != "running":
                resp.result.status = STATUS["TIMEOUT"]
            else:
                resp.tunnels.extend(self.tunnels(sb))
        return resp

    def rpc_SandboxTerminate(self, req, ctx, md):
        sb = self.sandbox(req.sandbox_id)
        resp = self.pb.SandboxTerminateResponse()
        with self.cv:
            if sb.result is not None:
                resp.existing_result.CopyFrom(self.result_msg(sb.result))
                return resp
        self.finish_sb(sb, "TERMINATED", 0, "")
        self.kill_agent(sb, signal.SIGTERM)
        return resp

    def rpc_SandboxWait(self, req, ctx, md):
        sb = self.sandbox(req.sandbox_id)
        t = self.poll_timeout(ctx, req.timeout, 0)
        with self.cv:
            self.wait_until(lambda: sb.result is not None, t)
            resp = self.pb.SandboxWaitResponse()
            if sb.result is not None:
                resp.result.CopyFrom(self.result_msg(sb.result))
        return resp

    def sandbox_info(self, sb):
        si = self.pb.SandboxInfo(id=sb.id, created_at=sb.created_at,
                                 app_id=sb.app_id, image_id=sb.image.id,
                                 timeout_secs=sb.timeout_secs)
        for k, v in sb.tags.items():
            si.tags.add(tag_name=k, tag_value=v)
        if sb.ready_at is not None:
            setf(si, "ready_at", sb.ready_at)
        if sb.state == "running" and sb.result is None:
            si.tunnels.extend(self.tunnels(sb))
        ti = si.task_info
        setf(ti, "id", sb.task_id)
        setf(ti, "sandbox_id", sb.id)
        setf(ti, "enqueued_at", sb.created_at)
        setf(ti, "started_at", sb.scheduled_at)
        setf(ti, "finished_at", sb.finished_at)
        if sb.result is not None and has_field(ti, "result"):
            ti.result.CopyFrom(self.result_msg(sb.result))
        return si

    def rpc_SandboxList(self, req, ctx, md):
        env = self.env_lookup(req.environment_name)
        if req.app_id:
            with self.cv:
                if req.app_id not in self.apps_by_id:
                    raise RpcFail("NOT_FOUND", f"App {req.app_id} not found")
        want = {}
        for t in req.tags:
            if not t.tag_name:
                raise RpcFail("INVALID_ARGUMENT", "tag name must not be empty")
            want[t.tag_name] = t.tag_value
        with self.cv:
            sbs = sorted(self.sandboxes.values(), key=lambda s: -s.created_at)
            out = []
            for sb in sbs:
                if sb.env_name != env["name"]:
                    continue
                if req.app_id and sb.app_id != req.app_id:
                    continue
                if not req.include_finished and sb.result is not None:
                    continue
                if req.before_timestamp and \
                        not sb.created_at < req.before_timestamp:
                    continue
                if any(sb.tags.get(k) != v for k, v in want.items()):
                    continue
                out.append(self.sandbox_info(sb))
                if len(out) >= self.list_page_size:
                    break
        resp = self.pb.SandboxListResponse()
        resp.sandboxes.extend(out)
        return resp

    def rpc_SandboxTagsSet(self, req, ctx, md):
        self.env_lookup(req.environment_name)
        sb = self.sandbox(req.sandbox_id)
        tags = {}
        for t in req.tags:
            if not t.tag_name:
                raise RpcFail("INVALID_ARGUMENT", "tag name must not be empty")
            tags[t.tag_name] = t.tag_value
        with self.cv:
            sb.tags = tags
        from google.protobuf import empty_pb2
        return empty_pb2.Empty()

    def snapshot(self, sb):
        with self.cv:
            if sb.result is not None:
                raise RpcFail("FAILED_PRECONDITION",
                              f"Sandbox {sb.id} has already finished")
            if sb.task_id is None:
                raise RpcFail("FAILED_PRECONDITION",
                              f"Sandbox {sb.id} is not running yet")
        img = ImageRec(new_id("im"), self.dir)
        src = sb.image
        img.app_id, img.base, img.commands = src.app_id, src.base, src.commands
        img.env, img.workdir, img.agent_path = dict(src.env), src.workdir, \
            src.agent_path
        img.source, img.snapshot_of = "snapshot", sb.id
        os.makedirs(img.dir, exist_ok=True)
        r = subprocess.run(["cp", "-a", "--", sb.fs, img.fs],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RpcFail("INTERNAL", f"snapshot failed: {r.stderr.strip()}")
        img.result = {"status": "SUCCESS", "exitcode": 0, "exception": ""}
        self.img_log(img, f"Snapshot of {sb.id} saved as {img.id}")
        with self.cv:
            self.images[img.id] = img
            self.cv.notify_all()
        log(f"sandbox {sb.id}: snapshot {img.id}")
        return img

    def rpc_SandboxSnapshotFs(self, req, ctx, md):
        sb = self.sandbox(req.sandbox_id)
        img = self.snapshot(sb)
        resp = self.pb.SandboxSnapshotFsResponse(image_id=img.id)
        resp.result.CopyFrom(self.result_msg(img.result))
        return resp

    def rpc_TaskGetCommandRouterAccess(self, req, ctx, md):
        sb = self.lookup(self.tasks, req.task_id,
                         f"Task {req.task_id!r} not found")
        if sb.result is not None:
            raise RpcFail("FAILED_PRECONDITION",
                          f"Task {req.task_id} has already finished")
        now = int(time.time())
        jwt = jwt_make(self.jwt_key, {"typ": "command-router",
                                      "task_id": req.task_id,
                                      "sandbox_id": sb.id,
                                      "iat": now, "exp": now + self.jwt_ttl})
        return self.pb.TaskGetCommandRouterAccessResponse(jwt=jwt,
                                                          url=self.router_url)

    # router service
    def rpc_TaskSnapshotFilesystem(self, req, ctx, md):
        sb = self.lookup(self.tasks, req.task_id,
                         f"Task {req.task_id!r} not found")
        if req.snapshot_id:
            with self.cv:
                iid = sb.snapshots.get(req.snapshot_id)
            if iid:
                return self.rpb.TaskSnapshotFilesystemResponse(image_id=iid)
        img = self.snapshot(sb)
        if req.snapshot_id:
            with self.cv:
                sb.snapshots[req.snapshot_id] = img.id
        return self.rpb.TaskSnapshotFilesystemResponse(image_id=img.id)

    # -- shutdown ---------------------------------------------------------------------------

    def stop_all(self):
        with self.cv:
            sbs = list(self.sandboxes.values())
        for sb in sbs:
            sb.kill_status = sb.kill_status or "TERMINATED"
            sb.stop.set()
        for sb in sbs:
            self.kill_agent(sb, signal.SIGTERM, 2.0)


# -- control surface --------------------------------------------------------------------


class Control(http.server.BaseHTTPRequestHandler):
    fake = None
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def reply(self, code, obj):
        body = json.dumps(obj, default=str).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        if not n:
            return {}
        return json.loads(self.rfile.read(n))

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def do_DELETE(self):
        self.route("DELETE")

    def route(self, verb):
        try:
            self._route(verb)
        except Exception as e:  # noqa: BLE001
            log(f"control {verb} {self.path} failed:\n{traceback.format_exc()}")
            self.reply(500, {"error": str(e)})

    def _route(self, verb):
        f = self.fake
        u = urllib.parse.urlparse(self.path)
        q = urllib.parse.parse_qs(u.query)
        parts = [p for p in u.path.split("/") if p]
        if parts == ["calls"] and verb == "GET":
            since = int(q.get("since", ["0"])[0])
            with f.cv:
                calls = [dict(c) for c in f.calls if c["seq"] > since]
                nxt = f.seq
            return self.reply(200, {"calls": calls, "next": nxt})
        if parts == ["calls"] and verb == "DELETE":
            with f.cv:
                f.calls = []
            return self.reply(200, {"ok": True})
        if parts == ["fail"]:
            if verb == "POST":
                b = self.body()
                rule = {"method": b.get("method", "*"),
                        "service": b.get("service", "*"),
                        "code": b.get("code", "UNAVAILABLE").upper(),
                        "count": int(b.get("count", 1)),
                        "message": b.get("message", ""),
                        "when": b.get("when", "before"),
                        "delay_ms": float(b.get("delay_ms", 0))}
                import grpc
                if rule["code"] != "OK" and \
                        not hasattr(grpc.StatusCode, rule["code"]):
                    return self.reply(400, {"error": "unknown code"})
                with f.cv:
                    f.faults.append(rule)
                return self.reply(200, {"ok": True, "rule": rule})
            if verb == "DELETE":
                with f.cv:
                    f.faults = []
                return self.reply(200, {"ok": True})
            with f.cv:
                return self.reply(200, {"rules": list(f.faults)})
        if parts and parts[0] == "sandboxes":
            if len(parts) == 1:
                with f.cv:
                    return self.reply(200, {"sandboxes": [
                        s.info() for s in f.sandboxes.values()]})
            with f.cv:
                sb = f.sandboxes.get(parts[1])
            if sb is None:
                return self.reply(404, {"error": "no such sandbox"})
            if len(parts) == 3 and parts[2] == "kill" and verb == "POST":
                b = self.body()
                sig = getattr(signal, "SIG" + b.get("signal", "KILL").upper()
                              .removeprefix("SIG"))
                status = b.get("status", "TERMINATED")
                if status:
                    sb.kill_status = status
                proc = sb.proc
                if proc is not None and proc.poll() is None:
                    try:
                        os.killpg(proc.pid, sig)
                    except ProcessLookupError:
                        pass
                    try:
                        proc.wait(5)
                    except subprocess.TimeoutExpired:
                        pass
                elif status:
                    f.finish_sb(sb, status, 137, "Sandbox was killed")
                deadline = time.monotonic() + 5
                while sb.result is None and time.monotonic() < deadline:
                    time.sleep(0.02)
                return self.reply(200, sb.info())
            return self.reply(200, sb.info())
        if parts and parts[0] == "images":
            with f.cv:
                if len(parts) == 1:
                    return self.reply(200, {"images": [
                        i.info() for i in f.images.values()]})
                img = f.images.get(parts[1])
                if img is None:
                    return self.reply(404, {"error": "no such image"})
                return self.reply(200, img.info())
        if parts == ["config"] and verb == "POST":
            b = self.body()
            with f.cv:
                if "list_page_size" in b:
                    f.list_page_size = int(b["list_page_size"])
                if "schedule_ms" in b:
                    f.schedule_ms = tuple(float(x) for x in b["schedule_ms"])
                if "build_step_ms" in b:
                    f.build_step_ms = float(b["build_step_ms"])
                if "router_jwt_ttl" in b:
                    f.jwt_ttl = int(b["router_jwt_ttl"])
            return self.reply(200, {"ok": True})
        if parts == ["tokens"] and verb == "POST":
            b = self.body()
            with f.cv:
                if b.get("revoke"):
                    f.tokens.pop(b["token_id"], None)
                else:
                    f.tokens[b["token_id"]] = {"secret": b["token_secret"],
                                               "profile": b.get("profile", "")}
            return self.reply(200, {"ok": True})
        return self.reply(404, {"error": f"no route {verb} {u.path}"})


# -- main ---------------------------------------------------------------------------------


def load_tokens(d):
    p = os.path.join(d, "tokens.json")
    try:
        with open(p) as f:
            t = json.load(f)
        if "fake" in t and "other" in t:
            return t
    except (OSError, ValueError):
        pass
    t = {prof: {"token_id": new_id("ak"), "token_secret": new_id("as")}
         for prof in ("fake", "other")}
    fakecommon.write_atomic(p, json.dumps(t), 0o600)
    return t


def main(argv=None):
    ap = fakecommon.arg_parser("fake Modal gRPC server for the sbx tests "
                               "(see the module docstring)")
    ap.add_argument("--schedule-ms", default="100:300",
                    help="delay before a sandbox is scheduled, LO:HI ms")
    ap.add_argument("--build-step-ms", type=float, default=40)
    ap.add_argument("--list-page-size", type=int, default=100)
    ap.add_argument("--proto-dir", default=str(PROTO_DIR))
    args = ap.parse_args(argv)
    d = os.path.abspath(args.dir)
    args.agent = os.path.abspath(args.agent)
    err = fakecommon.prepare_dir(d, ["sandboxes", "images"], log, args.agent,
                                 "modal_server")
    if err:
        sys.stderr.write(err)
        return 2
    import grpc
    make_certs(d)
    pb, rpb = load_protos(os.path.join(d, "pb"), args.proto_dir)
    fake = Fake(args, d, pb, rpb)
    toks = load_tokens(d)
    for prof, t in toks.items():
        fake.tokens[t["token_id"]] = {"secret": t["token_secret"],
                                      "profile": prof}
    with open(os.path.join(d, "server.key"), "rb") as f:
        key = f.read()
    with open(os.path.join(d, "server.pem"), "rb") as f:
        cert = f.read()
    creds = grpc.ssl_server_credentials([(key, cert)])
    opts = [("grpc.max_receive_message_length", 256 << 20),
            ("grpc.max_send_message_length", 256 << 20),
            ("grpc.so_reuseport", 0)]
    pool = futures.ThreadPoolExecutor(max_workers=128,
                                      thread_name_prefix="grpc")
    server = grpc.server(pool, options=opts)
    server.add_generic_rpc_handlers((fake.handlers(pb, "ModalClient"),))
    host, _, port = args.listen.rpartition(":")
    port = server.add_secure_port(f"{host or '127.0.0.1'}:{port}", creds)
    if not port:
        sys.stderr.write(f"modal_server: cannot listen on {args.listen}\n")
        return 1
    rpool = futures.ThreadPoolExecutor(max_workers=32,
                                       thread_name_prefix="router")
    router = grpc.server(rpool, options=opts)
    router.add_generic_rpc_handlers((fake.handlers(rpb, "TaskCommandRouter"),))
    rport = router.add_secure_port("127.0.0.1:0", creds)
    fake.router_url = f"https://127.0.0.1:{rport}"
    Control.fake = fake
    ctl = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Control)
    ctl.daemon_threads = True
    cport = ctl.server_address[1]
    server.start()
    router.start()
    threading.Thread(target=ctl.serve_forever, daemon=True,
                     name="control").start()

    url = f"https://127.0.0.1:{port}"
    ft, ot = toks["fake"], toks["other"]
    fakecommon.write_atomic(os.path.join(d, "modal.toml"),
                 "# written by tests/fakes/modal_server.py\n"
                 "[fake]\n"
                 f'token_id = "{ft["token_id"]}"\n'
                 f'token_secret = "{ft["token_secret"]}"\n'
                 f'server_url = "{url}"\n'
                 "active = true\n\n"
                 "[other]\n"
                 f'token_id = "{ot["token_id"]}"\n'
                 f'token_secret = "{ot["token_secret"]}"\n'
                 f'server_url = "{url}"\n', 0o600)

    def on_signal(signum, frame):
        SHUTDOWN.set()

    def thread_excepthook(a):
        log(f"thread {a.thread.name if a.thread else '?'} crashed:\n" +
            "".join(traceback.format_exception(a.exc_type, a.exc_value,
                                               a.exc_traceback)))
    threading.excepthook = thread_excepthook
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ppid = os.getppid()
    ready = {"port": port, "pid": os.getpid(), "url": url,
             "token_id": ft["token_id"], "token_secret": ft["token_secret"],
             "other_token_id": ot["token_id"],
             "other_token_secret": ot["token_secret"],
             "ca": os.path.join(d, "ca.pem"),
             "config": os.path.join(d, "modal.toml"),
             "router_port": rport, "router_url": fake.router_url,
             "control_port": cport,
             "control_url": f"http://127.0.0.1:{cport}"}
    fakecommon.write_atomic(os.path.join(d, "ready"), json.dumps(ready))
    log(f"listening on {url} (router {fake.router_url}, control "
        f"{ready['control_url']}, pid {os.getpid()})")
    try:
        while not SHUTDOWN.wait(0.5):
            if os.getppid() != ppid:
                log("parent died: shutting down")
                break
    finally:
        SHUTDOWN.set()
        log("stopping")
        fakecommon.unlink_quiet(os.path.join(d, "ready"))
        with fake.cv:
            fake.cv.notify_all()
        fake.stop_all()
        server.stop(0.5).wait(3)
        router.stop(0.2).wait(2)
        ctl.shutdown()
        log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
