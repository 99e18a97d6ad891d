#!/usr/bin/python3
"""A protocol-faithful FAKE Kubernetes API server for the sbx tests.

No cluster is needed: pods are simulated, and a pod whose main container
runs `sbx-agent serve ...` gets a REAL agent process on loopback, reachable
through the pod proxy subresource exactly as through a real API server
(docs: /work/shared/reference/kubernetes.md).  Standard library + PyYAML.

Usage
-----
    /usr/bin/python3 tests/fakes/kube_apiserver.py --dir DIR \\
        --agent build/agent/sbx-agent [--listen 127.0.0.1:0]
        [--step-ms 60] [--history 10000] [--bookmark-interval 1.0]

Creates DIR, generates (openssl CLI) DIR/ca.crt|key, DIR/server.crt|key
(SAN 127.0.0.1, localhost), DIR/client.crt|key (CN=sbx-test,
O=system:masters), writes DIR/token (bearer token of user "sbx-test") and
DIR/kubeconfig with contexts `token` (current), `cert` (client certificate)
and `insecure` (insecure-skip-tls-verify + token), namespace `sbx-test` in
each.  Serves HTTPS (HTTP/1.1, keep-alive, ALPN http/1.1) and writes
DIR/ready = {"port","pid","url"} (atomically) once it accepts connections.
DIR/fake.log is its log.  SIGTERM/SIGINT (or the parent process dying):
stops every agent and exits 0.  Agents are started with a parent-death
signal, so even a SIGKILLed fake leaves no agent behind.

Authentication: `Authorization: Bearer T` with a known, unexpired token, or a
client certificate signed by the CA (user = CN, groups = O).  Anything else
is 401 Status "Unauthorized" (only /healthz, /livez, /readyz are open).

Kubernetes API (errors are always Status objects with the matching code)
------------------------------------------------------------------------
    GET  /version /api /apis /api/v1          discovery; /openapi/v2 without
         schemas (protobuf or JSON), /openapi/v3 just enough for kubectl
    POST /api/v1/namespaces/NS/pods           201; generateName; 409; 422
    GET  /api/v1/namespaces/NS/pods[/NAME]    list (labelSelector,
         fieldSelector, limit, continue) / get; `Accept: ...;as=Table`
         gets a meta.k8s.io/v1 Table (kubectl get)
    GET  /api/v1/pods                         all namespaces
    GET  ...?watch=true|1                     chunked JSON lines, history
         replay after resourceVersion, 410 Expired ERROR event when too old,
         timeoutSeconds, allowWatchBookmarks, sendInitialEvents
    DELETE .../pods/NAME                      200 + pod with
         deletionTimestamp, gone after min(grace, 1 s) (unscheduled or
         finished pods: at once); DELETE .../pods = deletecollection
    PATCH  .../pods/NAME                      merge patch (metadata/spec)
    PUT    .../pods/NAME                      labels/annotations/spec
    GET  .../pods/NAME/status                 the pod
    GET  .../pods/NAME/log                    the container's output (text;
         container=, tailLines=, previous= as the kubelet: an unknown
         container is 400, previous without a restart is 400)
    POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews
                                              201 + the review with
         status.allowed/denied/reason, decided by the forbid rules below
         (resource "pods/proxy" = resource pods, subresource proxy); the
         group is in discovery (/apis, /apis/authorization.k8s.io/v1) so
         `kubectl auth can-i` works
    ANY  .../pods/NAME[:PORT]/proxy/PATH?Q    the pod proxy (see below)
    .../pods/NAME/exec                        400 (exec is not simulated)

Pod lifecycle (each step a MODIFIED event, --step-ms apart): Pending →
PodScheduled=True (or False/Unschedulable when spec.nodeSelector has key
`sbx.test/unschedulable`) → sandbox (podIP 10.244.x.y, startTime) → init
containers (running, terminated Completed) → main container (the first of
spec.containers) waiting ContainerCreating → by image name:
`errimagepull` ErrImagePull then ImagePullBackOff; `crashstart` runs,
writes a few lines to its log and terminates (exit 1, reason Error, with a
termination message), so the pod is Failed; `invalidimage`
InvalidImageName; `crashloop` running, terminated (exit 1), CrashLoopBackOff
with restartCount; `badconfig` CreateContainerConfigError (also an env
valueFrom secretKeyRef/configMapKeyRef that is not optional); otherwise the
container starts: phase Running, and Ready/ContainersReady=True once the
readinessProbe (httpGet/tcpSocket on the agent's port; none = ready at
once) succeeds; probes go on every 0.5 s (failureThreshold → not ready).
Other containers are simulated as running and ready.

A main container whose command+args contains `serve` (or whose argv[0]
names sbx-agent) runs the real --agent binary with the arguments from
`serve` on (whatever comes before it, e.g. `ld.so --library-path L
.../sbx-agent`, is the program and is replaced by --agent), except: --root/--token-file/--tls-cert/--tls-key paths are mapped into
DIR/pods/UID/fs/ (created), --listen becomes 127.0.0.1:0 (the actual port
is read from the agent's "listening on" line; the port of the original
--listen is the container port), and if the binary does not know
`--token-env NAME` it is replaced by `--token-file DIR/pods/UID/token`
holding that variable's value.  The pod's env (value, fieldRef) is added to
the fake's environment.  Output goes to DIR/pods/UID/agent.log.  An agent
that exits makes the container terminated and the pod Failed (Succeeded
for exit 0 with restartPolicy Never): no restarts are simulated.
activeDeadlineSeconds (from startTime) kills the agent: phase Failed,
reason DeadlineExceeded.

Proxy: authenticates, applies forbidden rules to "pods/proxy" (verb from
the method), strips Authorization, Impersonate-*, X-Remote-* and hop-by-hop
headers, adds X-Forwarded-For, and relays to the agent on 127.0.0.1,
streaming both ways (request bodies as they arrive, Content-Length or
chunked; responses chunk by chunk, flushed at once).  `.../proxy` (empty
path) with GET → 301 to `.../proxy/`.  Unknown pod → 404; a pod without a
listening agent on that port → 503 ServiceUnavailable "error trying to
reach service: dial tcp 10.244.x.y:PORT: connect: connection refused".
Default port (`pods/NAME/proxy`): the first containerPort of the pod, else
the agent's container port, else 80.

Control API (JSON, same listener and authentication, never failed or
forbidden by the rules below, not in the request log)
----------------------------------------------------------------------
    GET    /fake/state                        tokens, rules, counters
    POST   /fake/tokens {"token"?, "user"?, "groups"?, "expires_in"?}
                                              → {"token","user","expires_at"}
    POST   /fake/tokens/TOKEN/expire          expires it now (→ 401)
    DELETE /fake/tokens/TOKEN                 revokes it (→ 401)
    POST   /fake/forbid {"verb":"create"|"*", "resource":"pods"|
           "pods/proxy"|"*", "namespace"?, "user"?, "count"?}   → 403
    DELETE /fake/forbid                       clears every forbid rule
    POST   /fake/failures {"method"?: "GET"|"*", "path": regex (search on
           the path without query), "query"?: regex (search on the query
           string: "watch=" targets watches), "code": 429|500|503|..., "count": N
           (default 1), "retry_after"?: s, "message"?, "action"?:
           "status"|"close"|"delay", "delay"?: s}  → the next N matching
           requests answer CODE (429/503 with Retry-After), "close" drops
           the connection, "delay" reads the request, sleeps, then serves
           it normally (even when the client has given up meanwhile)
    DELETE /fake/failures                     clears injected failures
    GET    /fake/requests[?since=SEQ]         recorded requests: {"seq",
           "method","path","query","params","headers" (names, lower case),
           "user_agent","content_type","user","code","body" (API requests
           with a body: the parsed JSON, else the text, at most 64 KiB;
           not proxy requests), "upstream_headers" (proxy: names sent to
           the agent)}
    DELETE /fake/requests                     clears the log
    GET    /fake/pods/NS/NAME                 internals: uid, agent pid/port/
           argv/env/root/log, container port, the received pod body
    POST   /fake/pods/NS/NAME/kill            SIGKILL the agent: the proxy
           answers 503, the pod goes Failed (exit code 137)
    POST   /fake/pods/NS/NAME/evict           reason Evicted, phase Failed,
           agent killed
    POST   /fake/compact                      drops the watch history: any
           older resourceVersion now gets 410 Expired
    POST   /fake/config {"tables"?: bool, "step_ms"?, "bookmark_interval"?}
           tables false: never answer as=Table (kubectl then prints a
           PodList client-side: NAME, AGE)
"""

import base64
import copy
import datetime
import http.server
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
import uuid
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fakecommon  # noqa: E402

try:
    import yaml
except ImportError:  # only needed for YAML request bodies
    yaml = None

SERVER_VERSION = {
    "major": "1", "minor": "32", "gitVersion": "v1.32.4",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean", "buildDate": "2025-04-22T00:00:00Z",
    "goVersion": "go1.23.8", "compiler": "gc", "platform": "linux/amd64",
}
DEFAULT_NAMESPACE = "sbx-test"
NODE_NAME = "sbx-fake-node"
HOST_IP = "172.18.0.2"
UNSCHEDULABLE_KEY = "sbx.test/unschedulable"
UNSCHEDULABLE_MSG = ("0/3 nodes are available: 3 node(s) didn't match Pod's "
                     "node affinity/selector. preemption: 0/3 nodes are "
                     "available: 3 Preemption is not helpful for "
                     "scheduling.")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case "
                     "alphanumeric characters or '-', and must start and end "
                     "with an alphanumeric character (e.g. 'my-name',  or "
                     "'123-abc', regex used for validation is "
                     "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te",
              "trailer", "transfer-encoding", "upgrade", "expect",
              "proxy-authorization", "proxy-authenticate"}
SHUTDOWN = threading.Event()
log = fakecommon.Log(millis=True)


def now_ts(t=None):
    t = time.time() if t is None else t
    return datetime.datetime.fromtimestamp(
        int(t), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_ts(s):
    try:
        return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc).timestamp()
    except (TypeError, ValueError):
        return time.time()


def human_age(seconds):
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 48:
        return f"{h}h"
    return f"{h // 24}d"


# -- Status objects -------------------------------------------------------------


class ApiError(Exception):
    def __init__(self, code, reason, message, details=None, headers=None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self):
        return status_obj(self.code, self.reason, self.message, self.details)


def status_obj(code, reason, message, details=None):
    s = {"kind": "Status", "apiVersion": "v1", "metadata": {},
         "status": "Failure", "message": message}
    if reason:
        s["reason"] = reason
    if details is not None:
        s["details"] = details
    s["code"] = code
    return s


def not_found(name, kind="pods"):
    return ApiError(404, "NotFound", f'{kind} "{name}" not found',
                    {"name": name, "kind": kind})


def bad_request(msg):
    return ApiError(400, "BadRequest", msg)


REASON_BY_CODE = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden",
    404: "NotFound", 405: "MethodNotAllowed", 409: "Conflict",
    410: "Expired", 413: "RequestEntityTooLarge", 422: "Invalid",
    429: "TooManyRequests", 500: "InternalError",
    503: "ServiceUnavailable", 504: "Timeout",
}


def _pb_varint(buf, i):
    """The varint at buf[i]: (value, index after it)."""
    v, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7f) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def _pb_fields(buf):
    """Protocol buffers wire format: (field, wiretype, value) tuples;
    length-delimited values as bytes, varints as ints."""
    i, out = 0, []
    while i < len(buf):
        key, i = _pb_varint(buf, i)
        field, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _pb_varint(buf, i)
        elif wt == 2:
            n, i = _pb_varint(buf, i)
            v = bytes(buf[i:i + n])
            i += n
        elif wt == 1:
            v = bytes(buf[i:i + 8])
            i += 8
        elif wt == 5:
            v = bytes(buf[i:i + 4])
            i += 4
        else:
            raise ValueError(f"wire type {wt}")
        out.append((field, wt, v))
    return out


def decode_k8s_protobuf(raw):
    """The apiserver's protobuf envelope ("k8s\\0" + runtime.Unknown) of
    an authorization.k8s.io/v1 SelfSubjectAccessReview, as the JSON dict;
    None for anything else."""
    try:
        if not raw.startswith(b"k8s\x00"):
            return None
        tm, body = {}, b""
        for f, _, v in _pb_fields(raw[4:]):
            if f == 1:
                tm = {ff: vv.decode() for ff, _, vv in _pb_fields(v)}
            elif f == 2:
                body = v
        if tm.get(1) != "authorization.k8s.io/v1" or \
                tm.get(2) != "SelfSubjectAccessReview":
            return None
        spec = {}
        names = {1: "namespace", 2: "verb", 3: "group", 4: "version",
                 5: "resource", 6: "subresource", 7: "name"}
        for f, _, v in _pb_fields(body):
            if f != 2:
                continue
            for sf, _, sv in _pb_fields(v):
                if sf == 1:
                    spec["resourceAttributes"] = {
                        names[k]: vv.decode() for k, _, vv in _pb_fields(sv)
                        if k in names}
                elif sf == 2:
                    spec["nonResourceAttributes"] = {
                        {1: "path", 2: "verb"}[k]: vv.decode()
                        for k, _, vv in _pb_fields(sv) if k in (1, 2)}
        return {"apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview", "spec": spec}
    except (IndexError, ValueError, UnicodeDecodeError, KeyError):
        return None


def injected_error(code, message=None, retry_after=None):
    reason = REASON_BY_CODE.get(code, "")
    details = None
    if code == 429:
        message = message or "Too many requests, please try again later."
        details = {"retryAfterSeconds": int(retry_after or 1)}
    elif code == 500:
        inner = message or "injected failure"
        message = f"Internal error occurred: {inner}"
        details = {"causes": [{"message": inner}]}
    elif code == 503:
        message = message or "the server is currently unable to handle the request"
        if retry_after:
            details = {"retryAfterSeconds": int(retry_after)}
    elif code == 504:
        message = message or ("the server was unable to return a response in "
                              "the time allotted, but may still be processing "
                              "the request")
        details = {}
    else:
        message = message or f"injected failure {code}"
    headers = {}
    if code in (429, 503) and (retry_after or code == 429):
        headers["Retry-After"] = str(int(retry_after or 1))
    return ApiError(code, reason, message, details, headers)


# -- selectors ------------------------------------------------------------------


LABEL_KEY = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
LABEL_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"


def split_top(s, sep=","):
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def parse_label_selector(sel):
    """→ list of (key, op, values); raises ApiError 400."""
    reqs = []
    if sel is None or not sel.strip():
        return reqs
    for part in split_top(sel):
        p = part.strip()
        m = re.fullmatch(r"!\s*(" + LABEL_KEY + r")", p)
        if m:
            reqs.append((m.group(1), "!", []))
            continue
        m = re.fullmatch(r"(" + LABEL_KEY + r")\s+(in|notin)\s*\((.*)\)", p)
        if m:
            vals = [v.strip() for v in m.group(3).split(",")]
            for v in vals:
                if not re.fullmatch(LABEL_VALUE, v) or len(v) > 63:
                    raise bad_request(
                        f"unable to parse requirement: values[0]: Invalid "
                        f"value: \"{v}\": a valid label must be an empty "
                        f"string or consist of alphanumeric characters, '-', "
                        f"'_' or '.'")
            reqs.append((m.group(1), m.group(2), vals))
            continue
        m = re.fullmatch(r"(" + LABEL_KEY + r")\s*(==|=|!=|>|<)\s*(\S*)", p)
        if m:
            key, op, val = m.groups()
            if op in (">", "<"):
                if not re.fullmatch(r"-?\d+", val):
                    raise bad_request(
                        "unable to parse requirement: for 'Gt', 'Lt' "
                        "operators, the value must be an integer")
            elif not re.fullmatch(LABEL_VALUE, val) or len(val) > 63:
                raise bad_request(
                    f"unable to parse requirement: values[0][{key}]: "
                    f"Invalid value: \"{val}\": a valid label must be an "
                    f"empty string or consist of alphanumeric characters, "
                    f"'-', '_' or '.', and must start and end with an "
                    f"alphanumeric character")
            reqs.append((key, "=" if op == "==" else op, [val]))
            continue
        m = re.fullmatch(LABEL_KEY, p)
        if m:
            reqs.append((p, "exists", []))
            continue
        raise bad_request(f"unable to parse requirement: found '{p}', "
                          f"expected: !, identifier, or 'end of string'")
    return reqs


def labels_match(reqs, labels):
    labels = labels or {}
    for key, op, vals in reqs:
        has = key in labels
        v = labels.get(key)
        if op == "=" and not (has and v == vals[0]):
            return False
        if op == "!=" and has and v == vals[0]:
            return False
        if op == "in" and not (has and v in vals):
            return False
        if op == "notin" and has and v in vals:
            return False
        if op == "exists" and not has:
            return False
        if op == "!" and has:
            return False
        if op in (">", "<"):
            try:
                n = int(v)
            except (TypeError, ValueError):
                return False
            if op == ">" and not n > int(vals[0]):
                return False
            if op == "<" and not n < int(vals[0]):
                return False
    return True


FIELD_GETTERS = {
    "metadata.name": lambda p: p["metadata"].get("name", ""),
    "metadata.namespace": lambda p: p["metadata"].get("namespace", ""),
    "spec.nodeName": lambda p: p.get("spec", {}).get("nodeName", ""),
    "spec.restartPolicy": lambda p: p.get("spec", {}).get("restartPolicy", "Always"),
    "spec.schedulerName": lambda p: p.get("spec", {}).get("schedulerName", "default-scheduler"),
    "spec.serviceAccountName": lambda p: p.get("spec", {}).get("serviceAccountName", ""),
    "spec.hostNetwork": lambda p: str(bool(p.get("spec", {}).get("hostNetwork"))).lower(),
    "status.phase": lambda p: p.get("status", {}).get("phase", ""),
    "status.podIP": lambda p: p.get("status", {}).get("podIP", ""),
    "status.nominatedNodeName": lambda p: p.get("status", {}).get("nominatedNodeName", ""),
}


def parse_field_selector(sel):
    reqs = []
    if sel is None or not sel.strip():
        return reqs
    for part in sel.split(","):
        m = re.fullmatch(r"\s*([A-Za-z0-9.]+)\s*(==|=|!=)\s*(.*?)\s*", part)
        if not m:
            raise bad_request(f"invalid selector: '{sel}'; can't understand '{part}'")
        key, op, val = m.groups()
        if key not in FIELD_GETTERS:
            raise bad_request(f'field label not supported: {key}')
        reqs.append((key, "!=" if op == "!=" else "=", val))
    return reqs


def fields_match(reqs, pod):
    for key, op, val in reqs:
        got = FIELD_GETTERS[key](pod)
        if (got == val) != (op == "="):
            return False
    return True


# -- certificates and kubeconfig -----------------------------------------------


def make_certs(d):
    fakecommon.make_certs(d, "/CN=sbx-fake-kube-ca", [
        ("server", "/CN=kube-apiserver",
         "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
         "extendedKeyUsage=serverAuth\n"),
        ("client", "/O=system:masters/CN=sbx-test",
         "extendedKeyUsage=clientAuth\n")], ".crt")


def b64file(path):
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


def write_kubeconfig(d, url, token):
    cfg = {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [
            {"name": "fake", "cluster": {
                "server": url,
                "certificate-authority-data": b64file(os.path.join(d, "ca.crt"))}},
            {"name": "fake-insecure", "cluster": {
                "server": url, "insecure-skip-tls-verify": True}},
        ],
        "users": [
            {"name": "token-user", "user": {"token": token}},
            {"name": "cert-user", "user": {
                "client-certificate-data": b64file(os.path.join(d, "client.crt")),
                "client-key-data": b64file(os.path.join(d, "client.key"))}},
        ],
        "contexts": [
            {"name": "token", "context": {"cluster": "fake", "user": "token-user",
                                          "namespace": DEFAULT_NAMESPACE}},
            {"name": "cert", "context": {"cluster": "fake", "user": "cert-user",
                                         "namespace": DEFAULT_NAMESPACE}},
            {"name": "insecure", "context": {"cluster": "fake-insecure",
                                             "user": "token-user",
                                             "namespace": DEFAULT_NAMESPACE}},
        ],
        "current-context": "token",
    }
    tmp = os.path.join(d, "kubeconfig.tmp")
    with open(tmp, "w") as f:
        if yaml is not None:
            yaml.safe_dump(cfg, f, default_flow_style=False, sort_keys=False)
        else:
            json.dump(cfg, f, indent=2)  # JSON is YAML too
    os.chmod(tmp, 0o600)
    os.replace(tmp, os.path.join(d, "kubeconfig"))


# -- process spawning -------------------------------------------------------------


class Spawner(fakecommon.Spawner):
    """Agents get their parent-death signal from setpriv --pdeathsig KILL
    (see fakecommon.Spawner for why one thread starts them all)."""

    def __init__(self):
        self.setpriv = shutil.which("setpriv")
        if self.setpriv:
            r = subprocess.run([self.setpriv, "--help"], capture_output=True,
                               text=True)
            if "--pdeathsig" not in r.stdout + r.stderr:
                self.setpriv = None
        super().__init__()

    def start(self, argv, kw):
        if self.setpriv:
            argv = [self.setpriv, "--pdeathsig", "KILL", "--"] + argv
        return subprocess.Popen(argv, **kw)


# -- the store ----------------------------------------------------------------------


class Store:
    def __init__(self, history):
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.rv = 100
        self.pods = {}              # (ns, name) -> pod dict
        self.history = deque()      # (rv, type, obj, prev)
        self.window = history
        self.compacted = 0          # events with rv <= compacted are gone

    def bump(self):
        self.rv += 1
        return self.rv

    def _event(self, etype, obj, prev):
        self.history.append((int(obj["metadata"]["resourceVersion"]), etype,
                             obj, prev))
        while len(self.history) > self.window:
            self.compacted = self.history.popleft()[0]
        self.cond.notify_all()

    def add(self, pod):
        with self.lock:
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            pod["metadata"]["resourceVersion"] = str(self.bump())
            self.pods[key] = pod
            self._event("ADDED", pod, None)
            return copy.deepcopy(pod)

    def update(self, key, fn, uid=None):
        """Apply fn(pod) to a copy; returns the new pod or None when the pod
        is gone (or another incarnation, when uid is given) or fn returns
        False."""
        with self.lock:
            old = self.pods.get(key)
            if old is None or (uid and old["metadata"]["uid"] != uid):
                return None
            new = copy.deepcopy(old)
            if fn(new) is False:
                return None
            new["metadata"]["resourceVersion"] = str(self.bump())
            self.pods[key] = new
            self._event("MODIFIED", new, old)
            return copy.deepcopy(new)

    def remove(self, key, uid=None):
        with self.lock:
            old = self.pods.get(key)
            if old is None or (uid and old["metadata"]["uid"] != uid):
                return None
            new = copy.deepcopy(old)
            new["metadata"]["resourceVersion"] = str(self.bump())
            del self.pods[key]
            self._event("DELETED", new, old)
            return new

    def get(self, key):
        with self.lock:
            p = self.pods.get(key)
            return copy.deepcopy(p) if p else None

    def compact(self):
        with self.lock:
            self.history.clear()
            self.compacted = self.rv
            self.cond.notify_all()


# -- pods ---------------------------------------------------------------------------


def random_suffix(n=5):
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    return "".join(random.choice(alphabet) for _ in range(n))


def validate_pod(pod):
    """→ list of causes (reason, message, field)."""
    causes = []
    md = pod.get("metadata") or {}
    name = md.get("name")
    if not name:
        causes.append(("FieldValueRequired",
                       "Required value: name or generateName is required",
                       "metadata.name"))
    elif not isinstance(name, str) or len(name) > 63 or \
            not DNS1123_LABEL.match(name):
        msg = DNS1123_LABEL_MSG
        if isinstance(name, str) and len(name) > 63:
            msg = "must be no more than 63 characters"
        causes.append(("FieldValueInvalid",
                       f'Invalid value: "{name}": {msg}', "metadata.name"))
    for k, v in (md.get("labels") or {}).items():
        if not isinstance(v, str) or len(v) > 63 or \
                not re.fullmatch(LABEL_VALUE, v):
            causes.append(("FieldValueInvalid",
                           f'Invalid value: "{v}": a valid label must be an '
                           f"empty string or consist of alphanumeric "
                           f"characters, '-', '_' or '.', and must start and "
                           f"end with an alphanumeric character",
                           "metadata.labels"))
    spec = pod.get("spec")
    containers = (spec or {}).get("containers") or []
    if not containers:
        causes.append(("FieldValueRequired", "Required value",
                       "spec.containers"))
    for kind in ("initContainers", "containers"):
        seen = set()
        for i, c in enumerate((spec or {}).get(kind) or []):
            f = f"spec.{kind}[{i}]"
            cname = c.get("name") if isinstance(c, dict) else None
            if not cname:
                causes.append(("FieldValueRequired", "Required value",
                               f + ".name"))
            elif not DNS1123_LABEL.match(cname):
                causes.append(("FieldValueInvalid",
                               f'Invalid value: "{cname}": {DNS1123_LABEL_MSG}',
                               f + ".name"))
            elif cname in seen:
                causes.append(("FieldValueDuplicate",
                               f'Duplicate value: "{cname}"', f + ".name"))
            seen.add(cname)
            if not isinstance(c, dict) or not c.get("image"):
                causes.append(("FieldValueRequired", "Required value",
                               f + ".image"))
    rp = (spec or {}).get("restartPolicy")
    if rp is not None and rp not in ("Always", "OnFailure", "Never"):
        causes.append(("FieldValueNotSupported",
                       f'Unsupported value: "{rp}": supported values: '
                       f'"Always", "OnFailure", "Never"',
                       "spec.restartPolicy"))
    ads = (spec or {}).get("activeDeadlineSeconds")
    if ads is not None and (not isinstance(ads, int) or ads < 1):
        causes.append(("FieldValueInvalid",
                       f"Invalid value: {ads}: must be between 1 and "
                       f"2147483647, inclusive", "spec.activeDeadlineSeconds"))
    return causes


def invalid_error(name, causes):
    msgs = [f"{f}: {m}" for _, m, f in causes]
    msg = msgs[0] if len(msgs) == 1 else "[" + ", ".join(msgs) + "]"
    return ApiError(422, "Invalid", f'Pod "{name or ""}" is invalid: {msg}',
                    {"name": name or "", "kind": "Pod",
                     "causes": [{"reason": r, "message": m, "field": f}
                                for r, m, f in causes]})


def qos_class(spec):
    cs = (spec.get("containers") or []) + (spec.get("initContainers") or [])
    any_res = False
    guaranteed = True
    for c in cs:
        r = c.get("resources") or {}
        req, lim = r.get("requests") or {}, r.get("limits") or {}
        if req or lim:
            any_res = True
        for k in ("cpu", "memory"):
            if k not in lim or (k in req and req[k] != lim[k]):
                guaranteed = False
    if not any_res:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def pod_status_text(pod):
    st = pod.get("status") or {}
    spec = pod.get("spec") or {}
    reason = st.get("reason") or st.get("phase") or "Pending"
    inits = spec.get("initContainers") or []
    initializing = False
    for i, ics in enumerate(st.get("initContainerStatuses") or []):
        s = ics.get("state") or {}
        if "terminated" in s and s["terminated"].get("exitCode") == 0:
            continue
        if "terminated" in s:
            reason = "Init:" + (s["terminated"].get("reason") or
                                f"ExitCode:{s['terminated'].get('exitCode')}")
        elif "waiting" in s and s["waiting"].get("reason") not in (None, "PodInitializing"):
            reason = "Init:" + s["waiting"]["reason"]
        else:
            reason = f"Init:{i}/{len(inits)}"
        initializing = True
        break
    if not initializing:
        has_running = False
        for cs in reversed(st.get("containerStatuses") or []):
            s = cs.get("state") or {}
            if s.get("waiting", {}).get("reason"):
                reason = s["waiting"]["reason"]
            elif "terminated" in s:
                reason = s["terminated"].get("reason") or \
                    f"ExitCode:{s['terminated'].get('exitCode')}"
            elif "running" in s and cs.get("ready"):
                has_running = True
        if reason == "Completed" and has_running:
            reason = "Running"
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    return reason


def pod_table(pods, rv, include_object, cont=None, remaining=None):
    cols = [("Name", "string", "name", 0), ("Ready", "string", "", 0),
            ("Status", "string", "", 0), ("Restarts", "string", "", 0),
            ("Age", "string", "", 0), ("IP", "string", "", 1),
            ("Node", "string", "", 1), ("Nominated Node", "string", "", 1),
            ("Readiness Gates", "string", "", 1)]
    rows = []
    now = time.time()
    for p in pods:
        st = p.get("status") or {}
        css = st.get("containerStatuses") or []
        total = len((p.get("spec") or {}).get("containers") or [])
        ready = sum(1 for c in css if c.get("ready"))
        restarts = sum(c.get("restartCount", 0) for c in css)
        cells = [p["metadata"]["name"], f"{ready}/{total}",
                 pod_status_text(p), str(restarts),
                 human_age(now - parse_ts(p["metadata"].get("creationTimestamp"))),
                 st.get("podIP") or "<none>",
                 (p.get("spec") or {}).get("nodeName") or "<none>",
                 st.get("nominatedNodeName") or "<none>", "<none>"]
        row = {"cells": cells}
        if include_object == "Object":
            o = copy.deepcopy(p)
            o.setdefault("kind", "Pod")
            o.setdefault("apiVersion", "v1")
            row["object"] = o
        elif include_object != "None":
            row["object"] = {"kind": "PartialObjectMetadata",
                             "apiVersion": "meta.k8s.io/v1",
                             "metadata": copy.deepcopy(p["metadata"])}
        rows.append(row)
    md = {"resourceVersion": str(rv)}
    if cont:
        md["continue"] = cont
    if remaining is not None:
        md["remainingItemCount"] = remaining
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": md,
            "columnDefinitions": [
                {"name": n, "type": t, "format": f, "description": n,
                 "priority": pr} for n, t, f, pr in cols],
            "rows": rows}


def set_terminated(cs, code, reason, started, message=None):
    """Container status `cs` is terminated (a ContainerStateTerminated
    with exit code, reason, start when known, and a container id), not
    ready and not started."""
    t = {"exitCode": code, "reason": reason}
    if started:
        t["startedAt"] = started
    t["finishedAt"] = now_ts()
    t["containerID"] = cs.get("containerID") or \
        "containerd://" + secrets.token_hex(32)
    if message:
        t["message"] = message
    cs["state"] = {"terminated": t}
    cs["ready"] = False
    cs["started"] = False


class PodRuntime:
    """The simulated kubelet for one pod."""

    def __init__(self, server, key, uid):
        self.server = server
        self.store = server.store
        self.key = key
        self.uid = uid
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.proc = None
        self.agent_port = None
        self.container_port = None
        self.argv = None
        self.env_added = {}
        self.killed_reason = None    # "kill", "evict", "deadline", "delete"
        self.started_at = None
        self.ip = server.next_ip()
        self.dir = os.path.join(server.dir, "pods", uid)
        self.fs = os.path.join(self.dir, "fs")
        self.log_path = os.path.join(self.dir, "agent.log")
        self.received = None
        self.deadline_timer = None
        os.makedirs(self.fs, exist_ok=True)
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"pod-{key[1]}")

    # -- helpers --
    def pod(self):
        p = self.store.get(self.key)
        if p is None or p["metadata"]["uid"] != self.uid:
            return None
        return p

    def upd(self, fn):
        if self.stop.is_set():
            return None
        return self.store.update(self.key, fn, uid=self.uid)

    def sleep(self, factor=1.0):
        return not self.stop.wait(self.server.step * factor)

    def info(self):
        with self.lock:
            return {"uid": self.uid, "ip": self.ip, "dir": self.dir,
                    "fs": self.fs,
                    "agent_pid": self.proc.pid if self.proc and
                    self.proc.poll() is None else None,
                    "agent_port": self.agent_port,
                    "container_port": self.container_port,
                    "argv": self.argv, "env": self.env_added,
                    "log": self.log_path, "received": self.received}

    @staticmethod
    def set_cond(st, ctype, status, reason=None, message=None):
        conds = st.setdefault("conditions", [])
        for c in conds:
            if c["type"] == ctype:
                if c["status"] != status:
                    c["lastTransitionTime"] = now_ts()
                c["status"] = status
                c.pop("reason", None)
                c.pop("message", None)
                break
        else:
            c = {"type": ctype, "status": status, "lastProbeTime": None,
                 "lastTransitionTime": now_ts()}
            conds.append(c)
        if reason:
            c["reason"] = reason
        if message:
            c["message"] = message

    def main_cs(self, st):
        return st["containerStatuses"][0]

    # -- the lifecycle --
    def start(self):
        self.thread.start()

    def _run(self):
        try:
            self._lifecycle()
        except Exception:  # noqa: BLE001
            log(f"pod {self.key}: lifecycle crashed:\n{traceback.format_exc()}")

    def _lifecycle(self):
        pod = self.pod()
        if pod is None:
            return
        spec = pod.get("spec") or {}
        containers = spec.get("containers") or []
        inits = spec.get("initContainers") or []
        main = containers[0]
        image = main.get("image", "")
        if not self.sleep():
            return
        # 1. scheduling
        if UNSCHEDULABLE_KEY in (spec.get("nodeSelector") or {}):
            def unsched(p):
                self.set_cond(p["status"], "PodScheduled", "False",
                              "Unschedulable", UNSCHEDULABLE_MSG)
            self.upd(unsched)
            return

        def sched(p):
            p["spec"]["nodeName"] = NODE_NAME
            self.set_cond(p["status"], "PodScheduled", "True")
        if not self.upd(sched) or not self.sleep():
            return
        # 2. sandbox
        main_names = [c["name"] for c in containers]

        def sandbox(p):
            st = p["status"]
            st["hostIP"] = HOST_IP
            st["hostIPs"] = [{"ip": HOST_IP}]
            st["podIP"] = self.ip
            st["podIPs"] = [{"ip": self.ip}]
            st["startTime"] = now_ts()
            self.set_cond(st, "PodReadyToStartContainers", "True")
            if inits:
                self.set_cond(st, "Initialized", "False",
                              "ContainersNotInitialized",
                              "containers with incomplete status: [" +
                              " ".join(c["name"] for c in inits) + "]")
            else:
                self.set_cond(st, "Initialized", "True")
            msg = "containers with unready status: [" + " ".join(main_names) + "]"
            self.set_cond(st, "Ready", "False", "ContainersNotReady", msg)
            self.set_cond(st, "ContainersReady", "False", "ContainersNotReady", msg)
            if inits:
                st["initContainerStatuses"] = [
                    self.cstatus(c, {"waiting": {"reason": "PodInitializing"}})
                    for c in inits]
            st["containerStatuses"] = [
                self.cstatus(c, {"waiting": {
                    "reason": "PodInitializing" if inits else "ContainerCreating"}})
                for c in containers]
        if not self.upd(sandbox):
            return
        ads = spec.get("activeDeadlineSeconds")
        if isinstance(ads, int) and ads > 0:
            self.deadline_timer = threading.Timer(ads, self.deadline)
            self.deadline_timer.daemon = True
            self.deadline_timer.start()
        if not self.sleep():
            return
        # 3. init containers
        for i, c in enumerate(inits):
            def run_init(p, i=i):
                p["status"]["initContainerStatuses"][i] = self.cstatus(
                    c, {"running": {"startedAt": now_ts()}}, started=True,
                    cid=True)
            if not self.upd(run_init) or not self.sleep():
                return

            def done_init(p, i=i):
                ics = p["status"]["initContainerStatuses"][i]
                started = ics["state"]["running"]["startedAt"]
                ics["state"] = {"terminated": {
                    "exitCode": 0, "reason": "Completed",
                    "startedAt": started, "finishedAt": now_ts(),
                    "containerID": ics["containerID"]}}
                ics["ready"] = True
                ics["started"] = False
            if not self.upd(done_init) or not self.sleep():
                return
        if inits:
            def initialized(p):
                self.set_cond(p["status"], "Initialized", "True")
                for cs in p["status"]["containerStatuses"]:
                    cs["state"] = {"waiting": {"reason": "ContainerCreating"}}
            if not self.upd(initialized) or not self.sleep():
                return
        # 4. failure modes by image name
        low = image.lower()
        if "errimagepull" in low:
            self.waiting("ErrImagePull",
                         f'failed to pull and unpack image "{image}": failed '
                         f'to resolve reference "{image}": pull access '
                         f'denied, repository does not exist or may require '
                         f'authorization')
            if self.sleep(2):
                self.waiting("ImagePullBackOff",
                             f'Back-off pulling image "{image}"')
            return
        if "invalidimage" in low:
            self.waiting("InvalidImageName",
                         f'Failed to apply default image tag "{image}": '
                         f'couldn\'t parse image name "{image}": invalid '
                         f'reference format')
            return
        if "badconfig" in low:
            self.waiting("CreateContainerConfigError",
                         'secret "sbx-missing" not found')
            return
        env, err = self.resolve_env(main)
        if err:
            self.waiting("CreateContainerConfigError", err)
            return
        if "crashloop" in low:
            self.crashloop(main)
            return
        if "crashstart" in low:
            self.crash_at_start(main)
            return
        # 5. start the containers
        argv = (main.get("command") or []) + (main.get("args") or [])
        self.started_at = now_ts()
        if self.is_agent(argv):
            ok = self.start_agent(argv, env)
            if not ok:
                return  # start_agent recorded the failure
        else:
            log(f"pod {self.key}: main container {argv!r} is not an agent: "
                f"simulated only")

        def running(p):
            st = p["status"]
            st["phase"] = "Running"
            for i, c in enumerate(containers):
                st["containerStatuses"][i] = self.cstatus(
                    c, {"running": {"startedAt": self.started_at}},
                    started=True, cid=True, ready=(i > 0))
        if not self.upd(running):
            return
        self.probe_loop(main)

    def cstatus(self, c, state, started=False, cid=False, ready=False,
                restarts=0, last=None):
        s = {"name": c.get("name"), "state": state, "lastState": last or {},
             "ready": ready, "restartCount": restarts,
             "image": c.get("image", ""),
             "imageID": "", "started": started}
        if cid:
            s["containerID"] = "containerd://" + secrets.token_hex(32)
            s["imageID"] = c.get("image", "").split(":")[0] + "@sha256:" + \
                secrets.token_hex(32)
        return s

    def waiting(self, reason, message):
        def f(p):
            cs = p["status"]["containerStatuses"][0]
            cs["state"] = {"waiting": {"reason": reason, "message": message}}
            cs["ready"] = False
            cs["started"] = False
        return self.upd(f)

    def crashloop(self, main):
        restarts = 0
        while not self.stop.is_set():
            started = now_ts()

            def run(p):
                cs = p["status"]["containerStatuses"][0]
                p["status"]["phase"] = "Running"
                cs["state"] = {"running": {"startedAt": started}}
                cs["started"] = True
                cs.setdefault("containerID", "containerd://" + secrets.token_hex(32))
            if not self.upd(run) or not self.sleep():
                return
            restarts += 1
            term = {"terminated": {"exitCode": 1, "reason": "Error",
                                   "startedAt": started,
                                   "finishedAt": now_ts(),
                                   "containerID": "containerd://" +
                                   secrets.token_hex(32)}}

            def crashed(p, restarts=restarts):
                cs = p["status"]["containerStatuses"][0]
                cs["state"] = term
                cs["started"] = False
                cs["restartCount"] = restarts - 1
            if not self.upd(crashed) or not self.sleep():
                return

            def backoff(p, restarts=restarts):
                cs = p["status"]["containerStatuses"][0]
                cs["state"] = {"waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {10 * 2 ** min(restarts - 1, 5)}s "
                               f"restarting failed container={main['name']} "
                               f"pod={self.key[1]}_{self.key[0]}({self.uid})"}}
                cs["lastState"] = term
                cs["restartCount"] = restarts
            if not self.upd(backoff):
                return
            if self.stop.wait(max(0.5, self.server.step * 10)):
                return

    CRASH_MESSAGE = ("sbx-agent: cannot serve /workspace: Permission denied "
                     "(the image runs as a user that may not write there)")

    def crash_at_start(self, main):
        """The main container starts, logs, and exits 1 with a
        termination message (restartPolicy Never: the pod fails)."""
        self.started_at = now_ts()

        def running(p):
            st = p["status"]
            st["phase"] = "Running"
            st["containerStatuses"][0] = self.cstatus(
                main, {"running": {"startedAt": self.started_at}},
                started=True, cid=True)
        if not self.upd(running):
            return
        with open(self.log_path, "ab") as f:
            for i in range(1, 31):
                f.write(f"boot step {i}\n".encode())
            f.write(b"fatal: " + self.CRASH_MESSAGE.encode() + b"\n")
        if not self.sleep():
            return
        self.terminated(1, "Error", self.CRASH_MESSAGE)

    def resolve_env(self, c):
        env = {}
        for e in c.get("env") or []:
            name = e.get("name")
            if not name:
                continue
            if "value" in e:
                env[name] = str(e["value"])
            elif "valueFrom" in e:
                vf = e["valueFrom"] or {}
                fr = vf.get("fieldRef")
                if fr:
                    p = self.pod() or {}
                    path = fr.get("fieldPath", "")
                    md = p.get("metadata", {})
                    val = {"metadata.name": md.get("name"),
                           "metadata.namespace": md.get("namespace"),
                           "metadata.uid": md.get("uid"),
                           "status.podIP": self.ip, "status.hostIP": HOST_IP,
                           "spec.nodeName": NODE_NAME,
                           "spec.serviceAccountName":
                               p.get("spec", {}).get("serviceAccountName",
                                                     "default")}.get(path)
                    if path.startswith("metadata.labels['"):
                        val = md.get("labels", {}).get(path[17:-2])
                    elif path.startswith("metadata.annotations['"):
                        val = md.get("annotations", {}).get(path[22:-2])
                    env[name] = val or ""
                for kind, what in (("secretKeyRef", "secret"),
                                   ("configMapKeyRef", "configmap")):
                    ref = vf.get(kind)
                    if ref and not ref.get("optional"):
                        return None, f'{what} "{ref.get("name")}" not found'
            else:
                env[name] = ""
        return env, None

    @staticmethod
    def is_agent(argv):
        if not argv:
            return False
        return "sbx-agent" in os.path.basename(argv[0]) or "serve" in argv

    def map_path(self, p):
        rel = p.lstrip("/")
        full = os.path.normpath(os.path.join(self.fs, rel))
        if not full.startswith(self.fs):
            full = os.path.join(self.fs, os.path.basename(p))
        return full

    def build_argv(self, argv, env, token_env_ok):
        out = [self.server.agent]
        # Everything before "serve" is the program (possibly behind a
        # dynamic loader: ld.so --library-path DIR .../sbx-agent serve ...).
        if "serve" in argv:
            args = list(argv[argv.index("serve"):])
        else:
            args = ["serve"] + list(argv[1:])
        for opt, val in fakecommon.agent_options(args):
            if val is None:
                out.append(opt)
                continue
            if opt == "--root":
                val = self.map_path(val)
                os.makedirs(val, exist_ok=True)
            elif opt in ("--token-file", "--tls-cert", "--tls-key"):
                val = self.map_path(val)
                os.makedirs(os.path.dirname(val), exist_ok=True)
            elif opt == "--listen":
                m = re.search(r":(\d+)$", val)
                if m:
                    self.container_port = int(m.group(1))
                val = "127.0.0.1:0"
            elif opt == "--token-env" and not token_env_ok:
                tf = os.path.join(self.dir, "token")
                with open(tf, "w") as f:
                    f.write(env.get(val, "") + "\n")
                os.chmod(tf, 0o600)
                opt, val = "--token-file", tf
            out += [opt, val]
        return out

    def start_agent(self, argv, env):
        token_env_ok = self.server.agent_has_token_env()
        for attempt in range(2):
            full = self.build_argv(argv, env, token_env_ok)
            penv = dict(os.environ)
            penv.update(env)
            penv.setdefault("HOSTNAME", self.key[1])
            with self.lock:
                self.argv = full
                self.env_added = env
            if self.stop.is_set():
                return False
            with open(self.log_path, "ab") as lf:
                lf.write(f"--- {' '.join(full)}\n".encode())
                lf.flush()
                start = lf.tell()
                try:
                    proc = self.server.spawner.popen(
                        full, stdin=subprocess.DEVNULL, stdout=lf,
                        stderr=subprocess.STDOUT, env=penv, cwd=self.dir,
                        start_new_session=True)
                except OSError as e:
                    self.terminated(128, "StartError", str(e))
                    return False
            with self.lock:
                self.proc = proc
            port = None
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and proc.poll() is None:
                port = self.read_port(start)
                if port:
                    break
                time.sleep(0.02)
            if port is None:
                port = self.read_port(start)
            if port and proc.poll() is None:
                with self.lock:
                    self.agent_port = port
                log(f"pod {self.key}: agent pid {proc.pid} on 127.0.0.1:{port}")
                threading.Thread(target=self.reap, args=(proc,), daemon=True,
                                 name=f"reap-{self.key[1]}").start()
                return True
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            out = self.read_log(start)
            if attempt == 0 and token_env_ok and "--token-env" in argv and \
                    "token-env" in out:
                self.server.token_env_ok = False
                token_env_ok = False
                continue
            log(f"pod {self.key}: agent failed to start "
                f"(exit {proc.returncode}):\n{out[-2000:]}")
            if self.killed_reason is None:
                self.terminated(proc.returncode if proc.returncode >= 0
                                else 128 - proc.returncode, "Error",
                                out[-1000:].strip())
            return False
        return False

    def read_log(self, start):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def read_port(self, start):
        m = re.search(r"listening on \S*?:(\d+)", self.read_log(start))
        return int(m.group(1)) if m else None

    def reap(self, proc):
        code = proc.wait()
        with self.lock:
            if self.proc is proc:
                self.agent_port = None
        code = code if code >= 0 else 128 - code
        log(f"pod {self.key}: agent exited with {code} "
            f"({self.killed_reason or 'by itself'})")
        if self.killed_reason in ("delete", "deadline", "evict", "shutdown"):
            return
        self.terminated(code, "Error" if code else "Completed", None)

    def terminated(self, code, reason, message):
        def f(p):
            st = p["status"]
            pol = (p.get("spec") or {}).get("restartPolicy", "Always")
            st["phase"] = "Succeeded" if code == 0 and pol != "Always" else "Failed"
            cs = st["containerStatuses"][0]
            started = (cs.get("state", {}).get("running") or {}).get(
                "startedAt") or self.started_at or now_ts()
            set_terminated(cs, code, reason, started, message)
            for other in st["containerStatuses"][1:]:
                other["ready"] = False
            self.set_cond(st, "Ready", "False", "PodFailed" if code else
                          "PodCompleted")
            self.set_cond(st, "ContainersReady", "False", "PodFailed" if code
                          else "PodCompleted")
        self.stop.set()
        self.store.update(self.key, f, uid=self.uid)

    def probe_once(self, probe, main):
        hg = probe.get("httpGet")
        ts = probe.get("tcpSocket")
        spec = probe.get("httpGet") or probe.get("tcpSocket")
        if spec is None:
            return True  # exec/grpc probes: assume success
        port = spec.get("port")
        if isinstance(port, str) and not port.isdigit():
            for p in main.get("ports") or []:
                if p.get("name") == port:
                    port = p.get("containerPort")
        try:
            port = int(port)
        except (TypeError, ValueError):
            return False
        with self.lock:
            real = self.agent_port if port == self.container_port else None
        if real is None:
            return False
        if ts is not None:
            try:
                socket.create_connection(("127.0.0.1", real), 1).close()
                return True
            except OSError:
                return False
        import http.client
        try:
            if (hg.get("scheme") or "HTTP").upper() == "HTTPS":
                ctx = ssl._create_unverified_context()
                conn = http.client.HTTPSConnection("127.0.0.1", real,
                                                   timeout=1, context=ctx)
            else:
                conn = http.client.HTTPConnection("127.0.0.1", real, timeout=1)
            hdrs = {h["name"]: h.get("value", "")
                    for h in hg.get("httpHeaders") or [] if h.get("name")}
            hdrs.setdefault("User-Agent", "kube-probe/1.32")
            conn.request("GET", hg.get("path") or "/", headers=hdrs)
            r = conn.getresponse()
            r.read()
            conn.close()
            return 200 <= r.status < 400
        except (OSError, http.client.HTTPException):
            return False

    def set_ready(self, ready):
        def f(p):
            st = p["status"]
            if st.get("phase") != "Running":
                return False
            cs = st["containerStatuses"][0]
            if "running" not in cs.get("state", {}) or cs.get("ready") == ready:
                return False
            cs["ready"] = ready
            names = [c["name"] for c in st["containerStatuses"]
                     if not c.get("ready")]
            if ready:
                self.set_cond(st, "ContainersReady", "True")
                self.set_cond(st, "Ready", "True")
            else:
                msg = "containers with unready status: [" + " ".join(names) + "]"
                self.set_cond(st, "ContainersReady", "False",
                              "ContainersNotReady", msg)
                self.set_cond(st, "Ready", "False", "ContainersNotReady", msg)
        return self.upd(f)

    def probe_loop(self, main):
        probe = main.get("readinessProbe")
        if not probe:
            if self.sleep():
                self.set_ready(True)
            return
        delay = min(float(probe.get("initialDelaySeconds") or 0), 1.0)
        if delay and self.stop.wait(delay):
            return
        threshold = int(probe.get("failureThreshold") or 3)
        ready, fails = False, 0
        while not self.stop.is_set():
            ok = self.probe_once(probe, main)
            if ok:
                fails = 0
                if not ready:
                    ready = True
                    self.set_ready(True)
            else:
                fails += 1
                if ready and fails >= threshold:
                    ready = False
                    self.set_ready(False)
            if self.stop.wait(0.5 if ready else 0.1):
                return

    # -- interventions --
    def kill_agent(self, reason, sig=signal.SIGKILL):
        if self.killed_reason is None or reason in ("shutdown", "delete"):
            self.killed_reason = reason
        with self.lock:
            proc = self.proc
        if proc is not None and proc.poll() is None:
            fakecommon.signal_group(proc, sig)
            return proc
        return None

    def wait_agent(self, proc, timeout):
        if proc is not None:
            fakecommon.reap(proc, timeout, 5)

    def deadline(self):
        p = self.pod()
        if p is None or p["status"].get("phase") in ("Failed", "Succeeded") \
                or p["metadata"].get("deletionTimestamp"):
            return
        self.stop.set()
        proc = self.kill_agent("deadline")
        self.wait_agent(proc, 5)
        self.fail_pod("DeadlineExceeded",
                      "Pod was active on the node longer than the specified "
                      "deadline")

    def evict(self):
        self.stop.set()
        proc = self.kill_agent("evict")
        self.wait_agent(proc, 5)
        self.fail_pod("Evicted",
                      "The node was low on resource: memory. Threshold "
                      "quantity: 100Mi, available: 51200Ki. ",
                      disruption=True)

    def fail_pod(self, reason, message, disruption=False):
        def f(p):
            st = p["status"]
            st["phase"] = "Failed"
            st["reason"] = reason
            st["message"] = message
            for cs in st.get("containerStatuses") or []:
                s = cs.get("state") or {}
                if "terminated" in s:
                    continue
                started = (s.get("running") or {}).get("startedAt")
                set_terminated(cs, 137, "Error", started)
            if disruption:
                self.set_cond(st, "DisruptionTarget", "True",
                              "TerminationByKubelet", message)
            self.set_cond(st, "Ready", "False", "PodFailed")
            self.set_cond(st, "ContainersReady", "False", "PodFailed")
        self.store.update(self.key, f, uid=self.uid)

    def shutdown(self, timeout=3):
        self.stop.set()
        if self.deadline_timer:
            self.deadline_timer.cancel()
        proc = self.kill_agent("shutdown", signal.SIGTERM)
        self.wait_agent(proc, timeout)


# -- the HTTP server ------------------------------------------------------------------


class FakeServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr, ctx, args):
        self.ctx = ctx
        self.dir = os.path.abspath(args.dir)
        self.agent = os.path.abspath(args.agent)
        self.step = max(0.005, args.step_ms / 1000.0)
        self.bookmark_interval = args.bookmark_interval
        self.store = Store(args.history)
        self.runtimes = {}          # uid -> PodRuntime
        self.rt_lock = threading.Lock()
        self.ip_counter = 4
        self.tokens = {}            # token -> {"user","groups","expires_at"}
        self.forbid = []
        self.failures = []
        self.rules_lock = threading.Lock()
        self.requests = []
        self.req_seq = 0
        self.req_lock = threading.Lock()
        self.token_env_ok = None
        self.tables = True
        self.spawner = Spawner()
        super().__init__(addr, Handler)

    def next_ip(self):
        with self.rt_lock:
            self.ip_counter += 1
            n = self.ip_counter
        return f"10.244.{(n // 250) % 250}.{n % 250 + 2}"

    def agent_has_token_env(self):
        if self.token_env_ok is None:
            try:
                r = subprocess.run([self.agent, "--help"], capture_output=True,
                                   text=True, timeout=10)
                self.token_env_ok = "--token-env" in (r.stdout + r.stderr)
            except (OSError, subprocess.TimeoutExpired):
                self.token_env_ok = False
        return self.token_env_ok

    def runtime(self, pod):
        with self.rt_lock:
            return self.runtimes.get(pod["metadata"]["uid"])

    def finish_request(self, request, client_address):
        # TLS handshake in the worker thread, not in the accept loop.
        try:
            # Small writes (headers, chunks) must not wait for the peer's
            # delayed ACK (Nagle): 40 ms per request otherwise.
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            request.settimeout(15)
            tls = self.ctx.wrap_socket(request, server_side=True)
            tls.settimeout(300)
        except (OSError, ssl.SSLError) as e:
            log(f"TLS handshake from {client_address} failed: {e}")
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            try:
                tls.close()
            except OSError:
                pass

    def shutdown_request(self, request):
        try:
            request.close()
        except OSError:
            pass

    def handle_error(self, request, client_address):
        e = sys.exc_info()[1]
        if isinstance(e, (ConnectionError, ssl.SSLError, socket.timeout,
                          BrokenPipeError)):
            return
        log(f"error serving {client_address}:\n{traceback.format_exc()}")

    def record(self, entry):
        with self.req_lock:
            self.req_seq += 1
            entry["seq"] = self.req_seq
            self.requests.append(entry)
            if len(self.requests) > 20000:
                del self.requests[:5000]
        return entry

    def stop_all(self):
        with self.rt_lock:
            rts = list(self.runtimes.values())
        threads = []
        for rt in rts:
            t = threading.Thread(target=rt.shutdown, daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(8)


class ChunkedReader:
    """Reads a chunked request body piece by piece."""

    def __init__(self, rfile):
        self.rfile = rfile
        self.left = 0
        self.done = False

    def read_piece(self, n=65536):
        if self.done:
            return b""
        if self.left == 0:
            line = self.rfile.readline(1024)
            if not line:
                raise ConnectionError("client closed in a chunked body")
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers
                    t = self.rfile.readline(8192)
                    if t in (b"\r\n", b"\n", b""):
                        break
                self.done = True
                return b""
            self.left = size
        data = self.rfile.read1(min(n, self.left))
        if not data:
            raise ConnectionError("client closed in a chunked body")
        self.left -= len(data)
        if self.left == 0:
            self.rfile.readline(16)  # CRLF
        return data


def forbid_rule(b):
    """A /fake/forbid rule from its POST body."""
    return {"verb": b.get("verb", "*"),
            "resource": b.get("resource", "*"),
            "namespace": b.get("namespace"),
            "user": b.get("user"), "count": b.get("count")}


def failure_rule(b):
    """A /fake/failures rule from its POST body (its regexes checked)."""
    try:
        re.compile(b.get("path", ".*"))
    except re.error as e:
        raise bad_request(f"bad path regex: {e}")
    try:
        re.compile(b.get("query") or "")
    except re.error as e:
        raise bad_request(f"bad query regex: {e}")
    return {"method": (b.get("method") or "*").upper(),
            "path": b.get("path", ".*"),
            "query": b.get("query"),
            "code": int(b.get("code", 500)),
            "count": int(b.get("count", 1)),
            "retry_after": b.get("retry_after"),
            "message": b.get("message"),
            "action": b.get("action", "status"),
            "delay": float(b.get("delay", 0)), "hits": 0}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sbx-fake-kube-apiserver"
    sys_version = ""

    def log_message(self, fmt, *args):
        pass

    # every method goes through dispatch
    def do_GET(self):
        self.dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    # -- plumbing --
    def rule_list(self, m, rules, make):
        """A list of control rules: POST appends make(body), DELETE
        clears it (under the server's rules_lock)."""
        srv = self.server
        if m == "POST":
            rule = make(self.body_json())
            with srv.rules_lock:
                rules.append(rule)
            return self.send_json(201, rule)
        with srv.rules_lock:
            rules.clear()
        return self.send_json(200, {"cleared": True})

    def send_json(self, code, obj, headers=None, content_type="application/json"):
        body = json.dumps(obj).encode() + b"\n"
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Audit-Id", str(uuid.uuid4()))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.entry["code"] = code

    def send_error_status(self, err):
        self.send_json(err.code, err.status(), err.headers)

    def read_body(self, limit=64 << 20):
        if self.body_read:
            return self.body
        self.body_read = True
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            r = ChunkedReader(self.rfile)
            parts, total = [], 0
            while True:
                piece = r.read_piece()
                if not piece:
                    break
                total += len(piece)
                if total > limit:
                    self.close_connection = True
                    raise ApiError(413, "RequestEntityTooLarge",
                                   "Request entity too large: limit is 3145728")
                parts.append(piece)
            self.body = b"".join(parts)
        else:
            n = int(self.headers.get("Content-Length") or 0)
            if n > limit:
                self.close_connection = True
                raise ApiError(413, "RequestEntityTooLarge",
                               "Request entity too large: limit is 3145728")
            self.body = self.rfile.read(n) if n else b""
        return self.body

    def body_json(self, required=True):
        raw = self.read_body()
        if not raw.strip():
            if required:
                raise bad_request("the body of the request was in an unknown "
                                  "format - accepted media types include: "
                                  "application/json, application/yaml, "
                                  "application/vnd.kubernetes.protobuf")
            return None
        ctype = (self.headers.get("Content-Type") or "").lower()
        if "protobuf" in ctype:
            # kubectl sends built-in types of other groups as protobuf:
            # the fake decodes the one it serves (SelfSubjectAccessReview).
            doc = decode_k8s_protobuf(raw)
            if doc is None:
                raise ApiError(415, "UnsupportedMediaType",
                               f'the body of the request was in an unknown '
                               f'format - accepted media types include: '
                               f'application/json, application/yaml (the '
                               f'fake decodes protobuf for '
                               f'SelfSubjectAccessReview only)')
            return doc
        try:
            if "yaml" in ctype and yaml is not None:
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, Exception) as e:  # noqa: BLE001
            raise bad_request(f"couldn't get version/kind; json parse error: {e}")

    def authenticate(self):
        """→ (user, groups) or None."""
        auth = self.headers.get("Authorization") or ""
        if auth[:7].lower() == "bearer ":
            tok = auth[7:].strip()
            with self.server.rules_lock:
                t = self.server.tokens.get(tok)
            if t and (t["expires_at"] is None or time.time() < t["expires_at"]):
                return t["user"], t["groups"]
            return None
        try:
            cert = self.connection.getpeercert()
        except (ValueError, AttributeError):
            cert = None
        if cert:
            cn, orgs = None, []
            for rdn in cert.get("subject", ()):
                for k, v in rdn:
                    if k == "commonName":
                        cn = v
                    elif k == "organizationName":
                        orgs.append(v)
            if cn:
                return cn, orgs
        return None

    def check_failure(self):
        path = self.path.split("?", 1)[0]
        with self.server.rules_lock:
            for f in self.server.failures:
                if f["count"] <= 0:
                    continue
                if f["method"] not in ("*", self.command):
                    continue
                if not re.search(f["path"], path):
                    continue
                if f.get("query") and not re.search(f["query"], self.query):
                    continue
                f["count"] -= 1
                f["hits"] += 1
                return dict(f)
        return None

    def forbid_rule(self, verb, resource, ns, consume):
        """The forbid rule that denies verb on resource ("pods/proxy")
        in ns to this user, or None.  `consume` counts a use."""
        user = self.user
        with self.server.rules_lock:
            for r in self.server.forbid:
                if r.get("count") is not None and r["count"] <= 0:
                    continue
                if r["verb"] not in ("*", verb):
                    continue
                if r["resource"] not in ("*", resource):
                    continue
                if r.get("namespace") and r["namespace"] != ns:
                    continue
                if r.get("user") and r["user"] != user:
                    continue
                if consume and r.get("count") is not None:
                    r["count"] -= 1
                return r
        return None

    def check_forbidden(self, verb, resource, ns, name=None, group=""):
        user = self.user
        if self.forbid_rule(verb, resource, ns, True) is None:
            return
        res = resource
        what = f'{resource.split("/")[0]}'
        if name:
            what += f' "{name}"'
        scope = f' in the namespace "{ns}"' if ns else \
            " at the cluster scope"
        details = {"kind": resource.split("/")[0]}
        if name:
            details = {"name": name, "kind": resource.split("/")[0]}
        if group:
            details["group"] = group
        raise ApiError(
            403, "Forbidden",
            f'{what} is forbidden: User "{user}" cannot {verb} '
            f'resource "{res}" in API group "{group}"{scope}',
            details)

    def dispatch(self):
        self.body_read = False
        self.body = b""
        raw_path, _, query = self.path.partition("?")
        self.raw_path = raw_path
        self.query = query
        self.params = urllib.parse.parse_qs(query, keep_blank_values=True)
        self.entry = {"method": self.command, "path": raw_path,
                      "query": query,
                      "params": self.params,
                      "headers": sorted({k.lower() for k in self.headers.keys()}),
                      "user_agent": self.headers.get("User-Agent"),
                      "content_type": self.headers.get("Content-Type"),
                      "user": None, "code": None, "time": time.time()}
        is_fake = raw_path.startswith("/fake/")
        if not is_fake:
            self.server.record(self.entry)
        try:
            self._dispatch(raw_path, is_fake)
        except ApiError as e:
            try:
                if not self.body_read and self.command in ("POST", "PUT", "PATCH"):
                    try:
                        self.read_body()
                    except (ApiError, OSError, ValueError):
                        self.close_connection = True
                self.send_error_status(e)
            except OSError:
                self.close_connection = True
        except (ConnectionError, BrokenPipeError, socket.timeout, ssl.SSLError):
            self.close_connection = True
        except Exception:  # noqa: BLE001
            log(f"handler crashed on {self.command} {self.path}:\n"
                f"{traceback.format_exc()}")
            self.close_connection = True
            try:
                self.send_error_status(ApiError(
                    500, "InternalError",
                    "Internal error occurred: fake apiserver crashed"))
            except OSError:
                pass
        if not is_fake and self.body_read and self.body and \
                "/proxy" not in raw_path:
            raw = self.body[:65536]
            try:
                self.entry["body"] = json.loads(raw)
            except ValueError:
                self.entry["body"] = decode_k8s_protobuf(raw) or \
                    raw.decode(errors="replace")
        log(f"{self.command} {self.path} -> {self.entry.get('code')} "
            f"({self.entry.get('user')})")

    def _dispatch(self, path, is_fake):
        if path in ("/healthz", "/livez", "/readyz") and self.command == "GET":
            body = b"ok"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.entry["code"] = 200
            return
        who = self.authenticate()
        if who is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        self.user, self.groups = who
        self.entry["user"] = self.user
        if is_fake:
            return self.control(path)
        f = self.check_failure()
        if f:
            if f["action"] == "close":
                self.close_connection = True
                self.entry["code"] = "closed"
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            if f["action"] == "delay":
                # A slow server has the request already: it carries it
                # out after the delay even if the client gave up.
                if self.command in ("POST", "PUT", "PATCH", "DELETE"):
                    self.read_body()
                time.sleep(f["delay"])
            else:
                raise injected_error(f["code"], f.get("message"),
                                     f.get("retry_after"))
        parts = [urllib.parse.unquote(p) for p in path.split("/")[1:]]
        if parts and parts[-1] == "" and len(parts) > 1 and \
                "proxy" not in parts:
            parts = parts[:-1]
        m = self.command
        if parts == ["version"] and m == "GET":
            return self.send_json(200, SERVER_VERSION)
        if parts == ["api"] and m == "GET":
            host = self.headers.get("Host") or "127.0.0.1"
            return self.send_json(200, {
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": host}]})
        if parts == ["apis"] and m == "GET":
            return self.send_json(200, {"kind": "APIGroupList",
                                        "apiVersion": "v1",
                                        "groups": [AUTHZ_GROUP]})
        if parts == ["apis", "authorization.k8s.io"] and m == "GET":
            return self.send_json(200, dict(AUTHZ_GROUP, kind="APIGroup",
                                            apiVersion="v1"))
        if parts == ["apis", "authorization.k8s.io", "v1"] and m == "GET":
            return self.send_json(200, AUTHZ_RESOURCES)
        if parts == ["apis", "authorization.k8s.io", "v1",
                     "selfsubjectaccessreviews"]:
            if m != "POST":
                raise method_not_allowed()
            return self.access_review()
        if parts == ["api", "v1"] and m == "GET":
            return self.send_json(200, API_RESOURCES)
        if parts == ["openapi", "v2"] and m == "GET":
            # No schemas (kubectl <= 1.26 then skips client-side
            # validation of the kinds it finds none for): as protobuf
            # (an empty gnostic Document is zero bytes) when asked so.
            acc = self.headers.get("Accept") or ""
            if "protobuf" in acc:
                self.send_response(200)
                # (kube-openapi answers the deprecated "...v2@v1.0+"
                # request with the dotted form)
                self.send_header("Content-Type",
                                 "application/com.github.proto-openapi."
                                 "spec.v2.v1.0+protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()
                self.entry["code"] = 200
                return
            return self.send_json(200, {
                "swagger": "2.0", "info": {"title": "Kubernetes (sbx fake)",
                                           "version": "v1.32.4"},
                "paths": {}, "definitions": {}})
        if parts == ["openapi", "v3"] and m == "GET":
            return self.send_json(200, {"paths": {"api/v1": {
                "serverRelativeURL": "/openapi/v3/api/v1?hash=SBXFAKE1"}}})
        if parts == ["openapi", "v3", "api", "v1"] and m == "GET":
            return self.send_json(200, OPENAPI_V3_CORE)
        if len(parts) >= 2 and parts[:2] == ["api", "v1"]:
            return self.core(parts[2:])
        raise ApiError(404, "NotFound",
                       "the server could not find the requested resource", {})

    # -- authorization.k8s.io --
    def access_review(self):
        """SelfSubjectAccessReview: may the caller do this?  Decided by
        the forbid rules (RBAC as the fake simulates it)."""
        self.check_forbidden("create", "selfsubjectaccessreviews", None,
                             group="authorization.k8s.io")
        b = self.body_json()
        if not isinstance(b, dict) or \
                b.get("kind", "SelfSubjectAccessReview") != \
                "SelfSubjectAccessReview":
            raise bad_request("the body must be a SelfSubjectAccessReview")
        spec = b.get("spec") or {}
        ra, nra = spec.get("resourceAttributes"), \
            spec.get("nonResourceAttributes")
        if (ra is None) == (nra is None):
            raise ApiError(
                422, "Invalid",
                'SelfSubjectAccessReview.authorization.k8s.io "" is '
                'invalid: spec.resourceAttributes: Invalid value: '
                '"null": exactly one of nonResourceAttributes or '
                'resourceAttributes must be specified',
                {"group": "authorization.k8s.io",
                 "kind": "SelfSubjectAccessReview",
                 "causes": [{"reason": "FieldValueInvalid",
                             "message": "Invalid value: \"null\": exactly "
                             "one of nonResourceAttributes or "
                             "resourceAttributes must be specified",
                             "field": "spec.resourceAttributes"}]})
        status = {"allowed": True}
        if ra is not None:
            res = ra.get("resource") or ""
            if ra.get("subresource"):
                res += "/" + ra["subresource"]
            rule = None
            if (ra.get("group") or "") == "":
                rule = self.forbid_rule(ra.get("verb") or "", res,
                                        ra.get("namespace") or None, False)
            if rule is not None:
                status = {"allowed": False}
        out = {"kind": "SelfSubjectAccessReview",
               "apiVersion": "authorization.k8s.io/v1",
               "metadata": {"creationTimestamp": None},
               "spec": spec, "status": status}
        self.send_json(201, out)

    # -- /api/v1 --
    def core(self, rest):
        m = self.command
        if rest == ["pods"]:
            if m != "GET":
                raise method_not_allowed()
            return self.list_or_watch(None)
        if rest[:2] == ["watch", "namespaces"] and len(rest) == 4 and \
                rest[3] == "pods":
            self.params["watch"] = ["true"]
            return self.list_or_watch(rest[2])
        if len(rest) < 3 or rest[0] != "namespaces" or rest[2] != "pods":
            if len(rest) == 2 and rest[0] == "namespaces" and m == "GET":
                ns = rest[1]
                return self.send_json(200, {
                    "kind": "Namespace", "apiVersion": "v1",
                    "metadata": {"name": ns, "uid": str(uuid.uuid5(
                        uuid.NAMESPACE_DNS, ns)), "resourceVersion": "1",
                        "creationTimestamp": "2025-01-01T00:00:00Z",
                        "labels": {"kubernetes.io/metadata.name": ns}},
                    "spec": {"finalizers": ["kubernetes"]},
                    "status": {"phase": "Active"}})
            raise ApiError(404, "NotFound",
                           "the server could not find the requested resource", {})
        ns = rest[1]
        if len(rest) == 3:
            if m == "GET":
                return self.list_or_watch(ns)
            if m == "POST":
                return self.create(ns)
            if m == "DELETE":
                return self.delete_collection(ns)
            raise method_not_allowed()
        name = rest[3]
        sub = rest[4] if len(rest) > 4 else None
        if sub is None and len(rest) == 4:
            if m == "GET":
                self.check_forbidden("get", "pods", ns, name)
                pod = self.server.store.get((ns, name))
                if pod is None:
                    raise not_found(name)
                return self.send_obj(pod)
            if m == "DELETE":
                return self.delete(ns, name)
            if m in ("PATCH", "PUT"):
                return self.update(ns, name)
            raise method_not_allowed()
        if sub == "proxy":
            return self.proxy(ns, name, rest)
        if sub == "status" and len(rest) == 5 and m == "GET":
            self.check_forbidden("get", "pods/status", ns, name)
            pod = self.server.store.get((ns, name))
            if pod is None:
                raise not_found(name)
            return self.send_obj(pod)
        if sub == "log" and len(rest) == 5 and m == "GET":
            return self.pod_log(ns, name)
        if sub in ("exec", "attach", "portforward"):
            self.check_forbidden("create" if m == "POST" else "get",
                                 "pods/" + sub, ns, name)
            if self.server.store.get((ns, name)) is None:
                raise not_found(name)
            raise bad_request(f"Upgrade request required (pods/{sub} is not "
                              f"simulated by the fake API server)")
        raise ApiError(404, "NotFound",
                       "the server could not find the requested resource", {})

    def send_obj(self, pod, code=200):
        pod = copy.deepcopy(pod)
        out = {"kind": "Pod", "apiVersion": "v1"}
        out.update(pod)
        if self.wants_table():
            return self.send_json(code, pod_table(
                [pod], pod["metadata"]["resourceVersion"],
                self.params.get("includeObject", ["Metadata"])[0]))
        return self.send_json(code, out)

    def wants_table(self):
        acc = self.headers.get("Accept") or ""
        return self.server.tables and "as=Table" in acc

    def list_or_watch(self, ns):
        watch = self.params.get("watch", ["false"])[0].lower() in ("true", "1")
        self.check_forbidden("watch" if watch else "list", "pods", ns)
        lsel = parse_label_selector(self.params.get("labelSelector", [None])[0])
        fsel = parse_field_selector(self.params.get("fieldSelector", [None])[0])

        def match(p):
            if ns is not None and p["metadata"]["namespace"] != ns:
                return False
            return labels_match(lsel, p["metadata"].get("labels")) and \
                fields_match(fsel, p)
        if watch:
            return self.watch(match)
        store = self.server.store
        limit = self.params.get("limit", ["0"])[0]
        try:
            limit = int(limit or 0)
        except ValueError:
            raise bad_request(f'invalid limit "{limit}"')
        cont = self.params.get("continue", [""])[0]
        start = ""
        with store.lock:
            list_rv = store.rv
            if cont:
                try:
                    tok = json.loads(base64.urlsafe_b64decode(
                        cont + "=" * (-len(cont) % 4)))
                    start, list_rv = tok["start"], int(tok["rv"])
                except (ValueError, KeyError, TypeError):
                    raise bad_request("invalid continue token")
                if list_rv < store.compacted:
                    raise ApiError(
                        410, "Expired",
                        "The provided continue parameter is too old to "
                        "display a consistent list result. You can start a "
                        "new list without the continue parameter, or use the "
                        "continue token in this response to retrieve the "
                        "remainder of the results. Continuing with the "
                        "provided token results in an inconsistent list - "
                        "objects that were created, modified, or deleted "
                        "between the time the first chunk was returned and "
                        "now may show up in the list.", {})
            keys = sorted(k for k in store.pods
                          if f"{k[0]}/{k[1]}" > start or not start)
            items = [copy.deepcopy(store.pods[k]) for k in keys
                     if match(store.pods[k])]
        next_tok, remaining = None, None
        if limit > 0 and len(items) > limit:
            last = items[limit - 1]["metadata"]
            remaining = len(items) - limit
            items = items[:limit]
            next_tok = base64.urlsafe_b64encode(json.dumps(
                {"v": "meta.k8s.io/v1", "rv": list_rv,
                 "start": f"{last['namespace']}/{last['name']}"}).encode()
            ).decode().rstrip("=")
            if lsel or fsel:
                remaining = None
        if self.wants_table():
            return self.send_json(200, pod_table(
                items, list_rv, self.params.get("includeObject", ["Metadata"])[0],
                next_tok, remaining))
        md = {"resourceVersion": str(list_rv)}
        if next_tok:
            md["continue"] = next_tok
            if remaining is not None:
                md["remainingItemCount"] = remaining
        self.send_json(200, {"kind": "PodList", "apiVersion": "v1",
                             "metadata": md, "items": items})

    # -- watch --
    def start_chunked(self, content_type="application/json"):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Audit-Id", str(uuid.uuid4()))
        self.end_headers()
        self.entry["code"] = 200

    def write_chunk(self, data):
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def end_chunked(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def watch(self, match):
        store = self.server.store
        p = self.params
        rv_param = p.get("resourceVersion", [""])[0]
        try:
            timeout = float(p.get("timeoutSeconds", ["1800"])[0] or 1800)
        except ValueError:
            raise bad_request("invalid timeoutSeconds")
        bookmarks = p.get("allowWatchBookmarks", ["false"])[0].lower() in ("true", "1")
        initial = p.get("sendInitialEvents", ["false"])[0].lower() in ("true", "1")
        table = self.wants_table()
        include = p.get("includeObject", ["Metadata"])[0]
        deadline = time.monotonic() + timeout
        self.start_chunked()
        first_table = [True]

        def emit(etype, obj):
            if table and etype in ("ADDED", "MODIFIED", "DELETED"):
                t = pod_table([obj], obj["metadata"]["resourceVersion"], include)
                if not first_table[0]:
                    t["columnDefinitions"] = []
                first_table[0] = False
                obj = t
            elif etype in ("ADDED", "MODIFIED", "DELETED"):
                o = {"kind": "Pod", "apiVersion": "v1"}
                o.update(obj)
                obj = o
            self.write_chunk(json.dumps({"type": etype, "object": obj}).encode()
                             + b"\n")

        def bookmark(rv, initial_end=False):
            md = {"resourceVersion": str(rv)}
            if initial_end:
                md["annotations"] = {"k8s.io/initial-events-end": "true"}
            self.write_chunk(json.dumps({"type": "BOOKMARK", "object": {
                "kind": "Pod", "apiVersion": "v1", "metadata": md}}).encode()
                + b"\n")

        with store.lock:
            if rv_param in ("", "0") or initial:
                last = store.rv
                snapshot = [copy.deepcopy(store.pods[k])
                            for k in sorted(store.pods) if match(store.pods[k])]
                expired = None
            else:
                try:
                    last = int(rv_param)
                except ValueError:
                    last = -1
                expired = None
                if last < 0:
                    expired = status_obj(400, "BadRequest",
                                         f'invalid resource version "{rv_param}"')
                elif last < store.compacted:
                    expired = status_obj(
                        410, "Expired", f"too old resource version: {last} "
                        f"({store.compacted + 1})")
                snapshot = []
        if expired:
            self.write_chunk(json.dumps({"type": "ERROR", "object": expired})
                             .encode() + b"\n")
            self.end_chunked()
            return
        for obj in snapshot:
            emit("ADDED", obj)
        if initial and bookmarks:
            bookmark(last, initial_end=True)
        last_bookmark = time.monotonic()
        while True:
            if SHUTDOWN.is_set():
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with store.lock:
                if last < store.compacted:
                    expired = status_obj(
                        410, "Expired", f"too old resource version: {last} "
                        f"({store.compacted + 1})")
                    events = []
                else:
                    events = [e for e in store.history if e[0] > last]
                    if not events:
                        store.cond.wait(min(left, 0.5))
                        events = [e for e in store.history if e[0] > last]
            if expired:
                self.write_chunk(json.dumps({"type": "ERROR", "object": expired})
                                 .encode() + b"\n")
                break
            for rv, etype, obj, prev in events:
                last = rv
                now_m, was_m = match(obj), prev is not None and match(prev)
                if etype == "ADDED" and now_m:
                    emit("ADDED", obj)
                elif etype == "DELETED" and (was_m or now_m):
                    emit("DELETED", obj)
                elif etype == "MODIFIED":
                    if now_m and was_m:
                        emit("MODIFIED", obj)
                    elif now_m:
                        emit("ADDED", obj)
                    elif was_m:
                        emit("DELETED", obj)
            if bookmarks and time.monotonic() - last_bookmark >= \
                    self.server.bookmark_interval:
                with store.lock:
                    if not any(e[0] > last for e in store.history):
                        last = max(last, store.rv)
                bookmark(last)
                last_bookmark = time.monotonic()
        self.end_chunked()

    # -- create / update / delete --
    def create(self, ns):
        self.check_forbidden("create", "pods", ns)
        pod = self.body_json()
        if not isinstance(pod, dict):
            raise bad_request("the body of the request was in an unknown format")
        kind, av = pod.get("kind"), pod.get("apiVersion")
        if kind not in (None, "Pod") or av not in (None, "v1"):
            raise bad_request(f"the API version in the data ({av}) does not "
                              f"match the expected API version (v1)"
                              if av not in (None, "v1") else
                              f"{kind} in version \"v1\" cannot be handled as "
                              f"a Pod: no kind \"{kind}\" is registered for "
                              f"version \"v1\"")
        received = copy.deepcopy(pod)
        md = pod.setdefault("metadata", {}) or {}
        pod["metadata"] = md
        if md.get("namespace") and md["namespace"] != ns:
            raise bad_request("the namespace of the provided object does not "
                              "match the namespace sent on the request")
        if not md.get("name") and md.get("generateName"):
            md["name"] = (md["generateName"] + random_suffix())[:63]
        causes = validate_pod(pod)
        if causes:
            raise invalid_error(md.get("name"), causes)
        name = md["name"]
        md["namespace"] = ns
        md["uid"] = str(uuid.uuid4())
        md["creationTimestamp"] = now_ts()
        for k in ("resourceVersion", "deletionTimestamp", "selfLink",
                  "deletionGracePeriodSeconds", "generation"):
            md.pop(k, None)
        pod.pop("kind", None)
        pod.pop("apiVersion", None)
        pod["status"] = {"phase": "Pending", "qosClass": qos_class(pod["spec"])}
        dry = "All" in self.params.get("dryRun", [])
        store = self.server.store
        with store.lock:
            if (ns, name) in store.pods:
                raise ApiError(409, "AlreadyExists",
                               f'pods "{name}" already exists',
                               {"name": name, "kind": "pods"})
            if dry:
                pod["metadata"]["resourceVersion"] = str(store.rv)
                return self.send_obj(pod, 201)
            rt = PodRuntime(self.server, (ns, name), md["uid"])
            rt.received = received
            with self.server.rt_lock:
                self.server.runtimes[md["uid"]] = rt
            created = store.add(pod)
        rt.start()
        self.send_obj(created, 201)

    def update(self, ns, name):
        verb = "patch" if self.command == "PATCH" else "update"
        self.check_forbidden(verb, "pods", ns, name)
        body = self.body_json()
        if not isinstance(body, dict):
            raise bad_request("patch body must be a JSON object")
        ctype = (self.headers.get("Content-Type") or "").lower()
        if "json-patch" in ctype:
            raise ApiError(415, "UnsupportedMediaType",
                           "json-patch is not supported by the fake")

        def merge(dst, src):
            for k, v in src.items():
                if v is None:
                    dst.pop(k, None)
                elif isinstance(v, dict) and isinstance(dst.get(k), dict):
                    merge(dst[k], v)
                else:
                    dst[k] = copy.deepcopy(v)

        def f(p):
            if verb == "patch":
                md = body.get("metadata") or {}
                for k in ("labels", "annotations", "finalizers"):
                    if k in md:
                        if isinstance(md[k], dict):
                            p["metadata"].setdefault(k, {})
                            merge(p["metadata"][k], md[k])
                        else:
                            p["metadata"][k] = md[k]
                if "spec" in body and isinstance(body["spec"], dict):
                    if "activeDeadlineSeconds" in body["spec"]:
                        p["spec"]["activeDeadlineSeconds"] = \
                            body["spec"]["activeDeadlineSeconds"]
            else:
                md = body.get("metadata") or {}
                want = md.get("resourceVersion")
                if want and want != p["metadata"]["resourceVersion"]:
                    raise ApiError(
                        409, "Conflict",
                        f'Operation cannot be fulfilled on pods "{name}": the '
                        f'object has been modified; please apply your changes '
                        f'to the latest version and try again',
                        {"name": name, "kind": "pods"})
                for k in ("labels", "annotations"):
                    if k in md:
                        p["metadata"][k] = md[k]
        new = self.server.store.update((ns, name), f)
        if new is None:
            raise not_found(name)
        self.send_obj(new)

    def delete_options(self):
        opts = {}
        body = self.read_body()
        if body.strip():
            try:
                opts = json.loads(body)
            except ValueError:
                raise bad_request("invalid DeleteOptions body")
        grace = self.params.get("gracePeriodSeconds", [None])[0]
        if grace is not None:
            opts["gracePeriodSeconds"] = int(grace)
        return opts or {}

    def delete(self, ns, name):
        self.check_forbidden("delete", "pods", ns, name)
        opts = self.delete_options()
        pod = self.do_delete(ns, name, opts)
        if pod is None:
            raise not_found(name)
        self.send_obj(pod)

    def do_delete(self, ns, name, opts):
        store = self.server.store
        pod = store.get((ns, name))
        if pod is None:
            return None
        pre = opts.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != pod["metadata"]["uid"]:
            raise ApiError(409, "Conflict",
                           f'Precondition failed: UID in precondition: '
                           f'{pre["uid"]}, UID in object meta: '
                           f'{pod["metadata"]["uid"]}',
                           {"name": name, "kind": "pods"})
        if pod["metadata"].get("deletionTimestamp"):
            return pod
        grace = opts.get("gracePeriodSeconds")
        if grace is None:
            grace = pod.get("spec", {}).get("terminationGracePeriodSeconds", 30)
        grace = max(0, int(grace))
        if not pod.get("spec", {}).get("nodeName") or \
                pod.get("status", {}).get("phase") in ("Failed", "Succeeded"):
            grace = 0
        uid = pod["metadata"]["uid"]
        rt = self.server.runtime(pod)

        def mark(p):
            p["metadata"]["deletionTimestamp"] = now_ts(time.time() + grace)
            p["metadata"]["deletionGracePeriodSeconds"] = grace
        marked = store.update((ns, name), mark, uid=uid)
        if marked is None:
            return None
        if rt is not None:
            rt.stop.set()
            if rt.deadline_timer:
                rt.deadline_timer.cancel()
        wait = min(grace, 1.0)

        def finish():
            proc = None
            if rt is not None:
                proc = rt.kill_agent("delete", signal.SIGTERM)
            if wait:
                time.sleep(wait)
            if rt is not None:
                proc = rt.kill_agent("delete", signal.SIGKILL) or proc
                rt.wait_agent(proc, 5)
            store.remove((ns, name), uid=uid)
            with self.server.rt_lock:
                self.server.runtimes.pop(uid, None)
        if wait == 0:
            finish()
        else:
            threading.Thread(target=finish, daemon=True,
                             name=f"delete-{name}").start()
        return marked

    def delete_collection(self, ns):
        self.check_forbidden("deletecollection", "pods", ns)
        lsel = parse_label_selector(self.params.get("labelSelector", [None])[0])
        fsel = parse_field_selector(self.params.get("fieldSelector", [None])[0])
        opts = self.delete_options()
        store = self.server.store
        with store.lock:
            keys = [k for k, p in store.pods.items() if k[0] == ns and
                    labels_match(lsel, p["metadata"].get("labels")) and
                    fields_match(fsel, p)]
        items = []
        for k in sorted(keys):
            p = self.do_delete(k[0], k[1], opts)
            if p:
                items.append(p)
        self.send_json(200, {"kind": "PodList", "apiVersion": "v1",
                             "metadata": {"resourceVersion": str(store.rv)},
                             "items": items})

    def pod_log(self, ns, name):
        """As the API server relays the kubelet: container= (required
        when the pod has several containers), tailLines=, previous=."""
        self.check_forbidden("get", "pods/log", ns, name)
        pod = self.server.store.get((ns, name))
        if pod is None:
            raise not_found(name)
        spec = pod.get("spec") or {}
        mains = [c.get("name") for c in spec.get("containers") or []]
        inits = [c.get("name") for c in spec.get("initContainers") or []]
        want = self.params.get("container", [None])[0]
        if not want:
            if len(mains) != 1:
                raise bad_request(
                    f"a container name must be specified for pod {name}, "
                    f"choose one of: [{' '.join(mains)}] or one of the "
                    f"init containers: [{' '.join(inits)}]")
            want = mains[0]
        if want not in mains and want not in inits:
            raise bad_request(f"container {want} is not valid for pod "
                              f"{name}")
        st = pod.get("status") or {}
        statuses = (st.get("containerStatuses") or []) + \
            (st.get("initContainerStatuses") or [])
        cs = next((c for c in statuses if c.get("name") == want), None)
        if self.params.get("previous", ["false"])[0] in ("true", "1"):
            if not cs or not (cs.get("lastState") or {}).get("terminated"):
                raise bad_request(f'previous terminated container "{want}" '
                                  f'in pod "{name}" not found')
        waiting = ((cs or {}).get("state") or {}).get("waiting")
        if cs is None or waiting:
            raise bad_request(
                f'container "{want}" in pod "{name}" is waiting to start: '
                f'{(waiting or {}).get("reason") or "ContainerCreating"}')
        rt = self.server.runtime(pod)
        data = b""
        if rt is not None and want == mains[0]:
            try:
                with open(rt.log_path, "rb") as f:
                    data = f.read()
            except OSError:
                pass
        tail = self.params.get("tailLines", [None])[0]
        if tail is not None:
            try:
                n = int(tail)
            except ValueError:
                raise bad_request(f'invalid tailLines "{tail}"')
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-n:]) if n > 0 else b""
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.entry["code"] = 200

    # -- the proxy subresource --
    def proxy(self, ns, name_port, rest):
        verb = {"GET": "get", "HEAD": "get", "POST": "create",
                "PUT": "update", "PATCH": "patch",
                "DELETE": "delete", "OPTIONS": "get"}.get(self.command, "get")
        bits = name_port.split(":")
        scheme = None
        if len(bits) == 3:
            scheme, name, port = bits
        elif len(bits) == 2:
            name, port = bits
        else:
            name, port = bits[0], ""
        self.check_forbidden(verb, "pods/proxy", ns, name)
        if scheme not in (None, "", "http"):
            raise bad_request(f"unsupported scheme {scheme!r} (the fake's "
                              f"agents speak http)")
        pod = self.server.store.get((ns, name))
        if pod is None:
            raise not_found(name)
        # the raw remainder after .../proxy, undecoded
        idx = self.raw_path.find("/proxy", self.raw_path.find("/pods/"))
        remainder = self.raw_path[idx + len("/proxy"):]
        if remainder == "" and self.command == "GET":
            loc = self.raw_path + "/" + ("?" + self.query if self.query else "")
            body = f'<a href="{loc}">Moved Permanently</a>.\n\n'.encode()
            self.send_response(301)
            self.send_header("Location", loc)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.entry["code"] = 301
            return
        if remainder == "":
            remainder = "/"
        rt = self.server.runtime(pod)
        containers = (pod.get("spec") or {}).get("containers") or []
        cport = None
        if port:
            if port.isdigit():
                cport = int(port)
            else:
                for c in containers:
                    for pp in c.get("ports") or []:
                        if pp.get("name") == port:
                            cport = pp.get("containerPort")
                if cport is None:
                    raise ApiError(503, "ServiceUnavailable",
                                   f"no port named {port!r} in pod {name}")
        else:
            for c in containers:
                for pp in c.get("ports") or []:
                    if cport is None and pp.get("containerPort"):
                        cport = pp["containerPort"]
            if cport is None and rt is not None:
                cport = rt.container_port
            if cport is None:
                cport = 80
        ip = rt.ip if rt is not None else "10.244.0.1"
        real = None
        if rt is not None and not pod["metadata"].get("deletionTimestamp"):
            with rt.lock:
                if rt.container_port == cport and rt.proc is not None and \
                        rt.proc.poll() is None:
                    real = rt.agent_port
        refused = ApiError(
            503, "ServiceUnavailable",
            f"error trying to reach service: dial tcp {ip}:{cport}: "
            f"connect: connection refused")
        if real is None:
            raise refused
        try:
            up = socket.create_connection(("127.0.0.1", real), timeout=5)
            up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except ConnectionRefusedError:
            raise refused
        except OSError as e:
            raise ApiError(503, "ServiceUnavailable",
                           f"error trying to reach service: dial tcp "
                           f"{ip}:{cport}: i/o timeout ({e})")
        try:
            self.relay(up, f"{ip}:{cport}", remainder)
        finally:
            try:
                up.close()
            except OSError:
                pass

    def relay(self, up, host, remainder):
        target = remainder + ("?" + self.query if self.query else "")
        sent = []
        lines = [f"{self.command} {target} HTTP/1.1", f"Host: {host}"]
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        chunked_in = "chunked" in te
        clen = self.headers.get("Content-Length")
        for k, v in self.headers.items():
            lk = k.lower()
            if lk in HOP_BY_HOP or lk in ("host", "authorization",
                                          "content-length") or \
                    lk.startswith("impersonate-") or lk.startswith("x-remote-"):
                continue
            if lk == "x-forwarded-for":
                continue
            lines.append(f"{k}: {v}")
            sent.append(lk)
        lines.append(f"X-Forwarded-For: {self.client_address[0]}")
        sent.append("x-forwarded-for")
        has_body = chunked_in or (clen is not None and clen.strip() != "")
        if chunked_in:
            lines.append("Transfer-Encoding: chunked")
            sent.append("transfer-encoding")
        elif has_body:
            lines.append(f"Content-Length: {int(clen)}")
            sent.append("content-length")
        lines.append("Connection: close")
        self.entry["upstream_headers"] = sorted(set(sent))
        up.settimeout(None)
        up.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        self.body_read = True  # the body goes upstream, never parsed here
        pump_done = threading.Event()
        pump_err = []

        def pump():
            try:
                if chunked_in:
                    r = ChunkedReader(self.rfile)
                    while True:
                        piece = r.read_piece()
                        if not piece:
                            up.sendall(b"0\r\n\r\n")
                            break
                        up.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                elif has_body:
                    left = int(clen)
                    while left > 0:
                        piece = self.rfile.read1(min(65536, left))
                        if not piece:
                            raise ConnectionError("client closed the body")
                        up.sendall(piece)
                        left -= len(piece)
            except (OSError, ValueError) as e:
                pump_err.append(e)
            finally:
                pump_done.set()
        if has_body:
            threading.Thread(target=pump, daemon=True, name="proxy-pump").start()
        else:
            pump_done.set()
        rf = up.makefile("rb", buffering=65536)
        try:
            while True:
                status_line = rf.readline(65537)
                if not status_line:
                    pump_done.wait(1)
                    self.close_connection = True
                    raise ApiError(
                        503, "ServiceUnavailable",
                        f"error trying to reach service: read tcp "
                        f"{HOST_IP}:0->{host}: read: connection reset by peer")
                bits = status_line.decode("latin-1").split(" ", 2)
                code = int(bits[1])
                reason = bits[2].strip() if len(bits) > 2 else ""
                hdrs = []
                while True:
                    h = rf.readline(65537)
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    hdrs.append((k.strip(), v.strip()))
                if 100 <= code < 200 and code != 101:
                    continue
                break
            lower = {k.lower(): v for k, v in hdrs}
            up_chunked = "chunked" in lower.get("transfer-encoding", "").lower()
            up_len = lower.get("content-length")
            no_body = self.command == "HEAD" or code in (204, 304)
            self.send_response_only(code, reason or None)
            self.send_header("Date", self.date_time_string())
            for k, v in hdrs:
                if k.lower() in HOP_BY_HOP or k.lower() in ("content-length",
                                                             "date"):
                    continue
                self.send_header(k, v)
            if no_body:
                if up_len is not None:
                    self.send_header("Content-Length", up_len)
            elif up_len is not None and not up_chunked:
                self.send_header("Content-Length", up_len)
            else:
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.entry["code"] = code
            if no_body:
                pass
            elif up_chunked:
                while True:
                    line = rf.readline(1024)
                    if not line:
                        raise ConnectionError("agent closed in a chunk")
                    size = int(line.split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while rf.readline(8192) not in (b"\r\n", b"\n", b""):
                            pass
                        break
                    while size > 0:
                        data = rf.read1(min(size, 65536))
                        if not data:
                            raise ConnectionError("agent closed in a chunk")
                        size -= len(data)
                        self.write_chunk(data)
                    rf.readline(16)
                self.end_chunked()
            elif up_len is not None:
                left = int(up_len)
                while left > 0:
                    data = rf.read1(min(left, 65536))
                    if not data:
                        raise ConnectionError("agent closed early")
                    self.wfile.write(data)
                    left -= len(data)
                self.wfile.flush()
            else:
                while True:
                    data = rf.read1(65536)
                    if not data:
                        break
                    self.write_chunk(data)
                self.end_chunked()
        except ConnectionError:
            self.close_connection = True
            raise
        finally:
            if not pump_done.wait(0.5):
                self.close_connection = True
            elif pump_err:
                self.close_connection = True
            try:
                rf.close()
            except OSError:
                pass

    # -- the control API --
    def control(self, path):
        srv = self.server
        m = self.command
        parts = [urllib.parse.unquote(p) for p in path.split("/")[2:] if p != ""]
        if parts == ["state"] and m == "GET":
            with srv.rules_lock:
                return self.send_json(200, {
                    "tokens": [{"token": t, **v} for t, v in srv.tokens.items()],
                    "forbid": srv.forbid, "failures": srv.failures,
                    "resourceVersion": srv.store.rv,
                    "compacted": srv.store.compacted,
                    "pods": [f"{k[0]}/{k[1]}" for k in srv.store.pods]})
        if parts == ["tokens"] and m == "POST":
            b = self.body_json(required=False) or {}
            tok = b.get("token") or secrets.token_hex(16)
            exp = b.get("expires_in")
            entry = {"user": b.get("user", "sbx-test"),
                     "groups": b.get("groups", ["system:authenticated"]),
                     "expires_at": time.time() + float(exp) if exp is not None
                     else None}
            with srv.rules_lock:
                srv.tokens[tok] = entry
            return self.send_json(201, {"token": tok, **entry})
        if len(parts) == 2 and parts[0] == "tokens" and m == "DELETE":
            with srv.rules_lock:
                gone = srv.tokens.pop(parts[1], None)
            if gone is None:
                raise ApiError(404, "NotFound", "no such token")
            return self.send_json(200, {"revoked": True})
        if len(parts) == 3 and parts[0] == "tokens" and parts[2] == "expire" \
                and m == "POST":
            with srv.rules_lock:
                t = srv.tokens.get(parts[1])
                if t is None:
                    raise ApiError(404, "NotFound", "no such token")
                t["expires_at"] = time.time() - 1
            return self.send_json(200, {"expired": True})
        if parts == ["forbid"] and m in ("POST", "DELETE"):
            return self.rule_list(m, srv.forbid, forbid_rule)
        if parts == ["failures"] and m in ("POST", "DELETE"):
            return self.rule_list(m, srv.failures, failure_rule)
        if parts == ["requests"]:
            if m == "GET":
                since = int(self.params.get("since", ["0"])[0] or 0)
                with srv.req_lock:
                    items = [dict(e) for e in srv.requests if e["seq"] > since]
                return self.send_json(200, {"items": items,
                                            "last": srv.req_seq})
            if m == "DELETE":
                with srv.req_lock:
                    srv.requests.clear()
                return self.send_json(200, {"cleared": True,
                                            "last": srv.req_seq})
        if parts == ["config"] and m == "POST":
            b = self.body_json()
            if "tables" in b:
                srv.tables = bool(b["tables"])
            if "step_ms" in b:
                srv.step = max(0.005, float(b["step_ms"]) / 1000.0)
            if "bookmark_interval" in b:
                srv.bookmark_interval = float(b["bookmark_interval"])
            return self.send_json(200, {"tables": srv.tables,
                                        "step_ms": srv.step * 1000,
                                        "bookmark_interval":
                                            srv.bookmark_interval})
        if parts == ["compact"] and m == "POST":
            srv.store.compact()
            return self.send_json(200, {"compacted": srv.store.compacted})
        if len(parts) >= 3 and parts[0] == "pods":
            ns, name = parts[1], parts[2]
            pod = srv.store.get((ns, name))
            if pod is None:
                raise not_found(name)
            rt = srv.runtime(pod)
            if rt is None:
                raise ApiError(409, "Conflict", "pod has no runtime")
            if len(parts) == 3 and m == "GET":
                return self.send_json(200, rt.info())
            if len(parts) == 4 and parts[3] == "kill" and m == "POST":
                proc = rt.kill_agent("kill")
                rt.wait_agent(proc, 5)
                return self.send_json(200, {"killed": proc is not None})
            if len(parts) == 4 and parts[3] == "evict" and m == "POST":
                rt.evict()
                return self.send_json(200, {"evicted": True})
        raise ApiError(404, "NotFound", f"no control route {m} {path}")


def method_not_allowed():
    return ApiError(405, "MethodNotAllowed",
                    "the server does not allow this method on the requested "
                    "resource", {})


AUTHZ_GROUP = {
    "name": "authorization.k8s.io",
    "versions": [{"groupVersion": "authorization.k8s.io/v1", "version": "v1"}],
    "preferredVersion": {"groupVersion": "authorization.k8s.io/v1",
                         "version": "v1"},
}

AUTHZ_RESOURCES = {
    "kind": "APIResourceList", "apiVersion": "v1",
    "groupVersion": "authorization.k8s.io/v1",
    "resources": [
        {"name": "selfsubjectaccessreviews", "singularName":
         "selfsubjectaccessreview", "namespaced": False,
         "kind": "SelfSubjectAccessReview", "verbs": ["create"]},
    ],
}

API_RESOURCES = {
    "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1",
    "resources": [
        {"name": "namespaces", "singularName": "namespace",
         "namespaced": False, "kind": "Namespace", "verbs": ["get"],
         "shortNames": ["ns"]},
        {"name": "pods", "singularName": "pod", "namespaced": True,
         "kind": "Pod",
         "verbs": ["create", "delete", "deletecollection", "get", "list",
                   "patch", "update", "watch"],
         "shortNames": ["po"], "categories": ["all"],
         "storageVersionHash": "xPOwRZ+Yhw8="},
        {"name": "pods/exec", "singularName": "", "namespaced": True,
         "kind": "PodExecOptions", "verbs": ["create", "get"]},
        {"name": "pods/log", "singularName": "", "namespaced": True,
         "kind": "Pod", "verbs": ["get"]},
        {"name": "pods/proxy", "singularName": "", "namespaced": True,
         "kind": "PodProxyOptions",
         "verbs": ["create", "delete", "get", "patch", "update"]},
        {"name": "pods/status", "singularName": "", "namespaced": True,
         "kind": "Pod", "verbs": ["get", "patch", "update"]},
    ],
}


# Just enough OpenAPI v3 for kubectl's field-validation probe (a PATCH
# operation on pods with x-kubernetes-group-version-kind and the
# fieldValidation query parameter): kubectl then validates server-side
# (fieldValidation=Strict) instead of downloading schemas.
OPENAPI_V3_CORE = {
    "openapi": "3.0.0",
    "info": {"title": "Kubernetes (sbx fake)", "version": "v1.32.4"},
    "paths": {
        "/api/v1/namespaces/{namespace}/pods": {
            "post": {
                "operationId": "createCoreV1NamespacedPod",
                "parameters": [{"name": "fieldValidation", "in": "query",
                                "schema": {"type": "string",
                                           "uniqueItems": True}}],
                "x-kubernetes-action": "post",
                "x-kubernetes-group-version-kind": {
                    "group": "", "version": "v1", "kind": "Pod"},
            },
        },
        "/api/v1/namespaces/{namespace}/pods/{name}": {
            "patch": {
                "operationId": "patchCoreV1NamespacedPod",
                "parameters": [{"name": "fieldValidation", "in": "query",
                                "schema": {"type": "string",
                                           "uniqueItems": True}}],
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {
                    "group": "", "version": "v1", "kind": "Pod"},
            },
        },
    },
    "components": {"schemas": {}},
}


# -- main ---------------------------------------------------------------------------


def main(argv=None):
    ap = fakecommon.arg_parser("fake Kubernetes API server for the sbx "
                               "tests (see the module docstring)")
    ap.add_argument("--step-ms", type=float, default=60)
    ap.add_argument("--history", type=int, default=10000,
                    help="watch events kept for resourceVersion replay")
    ap.add_argument("--bookmark-interval", type=float, default=1.0)
    args = ap.parse_args(argv)
    d = os.path.abspath(args.dir)
    err = fakecommon.prepare_dir(d, ["pods"], log, args.agent,
                                 "kube_apiserver")
    if err:
        sys.stderr.write(err)
        return 2
    make_certs(d)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.path.join(d, "server.crt"),
                        os.path.join(d, "server.key"))
    ctx.load_verify_locations(os.path.join(d, "ca.crt"))
    ctx.verify_mode = ssl.CERT_OPTIONAL
    ctx.set_alpn_protocols(["http/1.1"])
    host, _, port = args.listen.rpartition(":")
    srv = FakeServer((host.strip("[]") or "127.0.0.1", int(port)), ctx, args)
    port = srv.server_address[1]
    url = f"https://127.0.0.1:{port}"
    tok_path = os.path.join(d, "token")
    token = None
    if os.path.exists(tok_path):
        token = open(tok_path).read().strip() or None
    token = token or secrets.token_hex(24)
    fakecommon.write_atomic(tok_path, token + "\n", 0o600)
    srv.tokens[token] = {"user": "sbx-test",
                         "groups": ["system:masters", "system:authenticated"],
                         "expires_at": None}
    write_kubeconfig(d, url, token)

    def on_signal(signum, frame):
        if not SHUTDOWN.is_set():
            SHUTDOWN.set()
            threading.Thread(target=srv.shutdown, daemon=True).start()
    def thread_excepthook(a):
        if not issubclass(a.exc_type, (ConnectionError, ssl.SSLError,
                                       socket.timeout)):
            log(f"thread {a.thread.name if a.thread else '?'} crashed:\n" +
                "".join(traceback.format_exception(
                    a.exc_type, a.exc_value, a.exc_traceback)))
    threading.excepthook = thread_excepthook
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ppid = os.getppid()

    def watchdog():
        while not SHUTDOWN.wait(1):
            if os.getppid() != ppid:
                log("parent died: shutting down")
                on_signal(signal.SIGTERM, None)
    threading.Thread(target=watchdog, daemon=True).start()
    ready = {"port": port, "pid": os.getpid(), "url": url,
             "kubeconfig": os.path.join(d, "kubeconfig"), "token": tok_path}
    fakecommon.write_atomic(os.path.join(d, "ready"), json.dumps(ready))
    log(f"listening on {url} (pid {os.getpid()})")
    try:
        srv.serve_forever(poll_interval=0.2)
    finally:
        SHUTDOWN.set()
        srv.stop_all()
        srv.server_close()
        fakecommon.unlink_quiet(os.path.join(d, "ready"))
        log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
