"""Tests of the fake Kubernetes API server (tests/fakes/kube_apiserver.py).

No FUSE, no cluster: the fake runs on loopback with TLS, is checked over
HTTP with the standard library and with the real kubectl (/usr/bin/kubectl:
Debian's kubernetes-client, which scripts/install-deps.sh installs; skipped
when missing, except under CI=true where a missing kubectl fails the
cross-check), and runs real sbx-agent processes for agent pods.

    /usr/bin/python3 -m pytest tests/integration/test_kubefake.py \\
        --build-dir=build -v

Fixtures defined here (reusable by other test files that import them):
    kube_fake      one fake API server for the module (KubeFake)
    kube_ns        a fresh namespace name per test (isolation on one fake)
"""

import base64
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import time
import urllib.parse
import uuid
from pathlib import Path

import pytest
from testenv.fakeproc import start_logged, wait_ready

pytestmark = pytest.mark.nofuse

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "fakes" / "kube_apiserver.py"
PYTHON = "/usr/bin/python3"
# SBX_TEST_KUBECTL picks another kubectl (e.g. Debian's 1.20 next to a
# newer one from elsewhere).
KUBECTL = os.environ.get("SBX_TEST_KUBECTL") or \
    shutil.which("kubectl", path="/usr/bin") or shutil.which("kubectl")
AGENT_TOKEN = "agent-secret-token"


# -- the fake, as a process -----------------------------------------------------


class KubeFakeError(AssertionError):
    pass


class KubeFake:
    """Starts tests/fakes/kube_apiserver.py and talks to it."""

    def __init__(self, workdir, agent, step_ms=40):
        self.dir = Path(workdir)
        self.agent = str(agent)
        self.step_ms = step_ms
        self.proc = None
        self.home = self.dir.parent / (self.dir.name + "-home")
        self.home.mkdir(parents=True, exist_ok=True)

    def start(self, timeout=30):
        self.out_path = self.dir.parent / (self.dir.name + ".out")
        self.proc = start_logged(FAKE, self.dir, self.agent,
                                 ["--listen", "127.0.0.1:0", "--step-ms",
                                  str(self.step_ms)], self.out_path)
        self.ready = wait_ready(self.proc, self.dir, timeout, self.output,
                                self.stop, KubeFakeError)
        self.port = self.ready["port"]
        self.url = self.ready["url"]
        self.token = (self.dir / "token").read_text().strip()
        self.kubeconfig = self.dir / "kubeconfig"
        self.ctx = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
        return self

    def stop(self, timeout=15):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise KubeFakeError("the fake did not stop on SIGTERM")

    def agent_pids(self):
        """Agents of this fake still running (their --root is under dir)."""
        r = subprocess.run(["pgrep", "-f", "--", f"--root {self.dir}/pods/"],
                           capture_output=True, text=True)
        return [int(p) for p in r.stdout.split()]

    def output(self):
        try:
            return self.out_path.read_text()[-3000:]
        except OSError:
            return ""

    def log_tail(self):
        try:
            return (self.dir / "fake.log").read_text()[-3000:]
        except OSError:
            return ""

    # -- HTTP --
    def conn(self, timeout=10, cert=False):
        ctx = self.ctx
        if cert:
            ctx = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
            ctx.load_cert_chain(str(self.dir / "client.crt"),
                                str(self.dir / "client.key"))
        return http.client.HTTPSConnection("127.0.0.1", self.port,
                                           timeout=timeout, context=ctx)

    def request(self, method, path, body=None, headers=None, token=True,
                cert=False, timeout=10):
        """→ (status, headers {lower: value}, body bytes)."""
        h = dict(headers or {})
        if token is True:
            h["Authorization"] = f"Bearer {self.token}"
        elif token:
            h["Authorization"] = f"Bearer {token}"
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
            h.setdefault("Content-Type", "application/json")
        c = self.conn(timeout, cert=cert)
        try:
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()

    def json(self, method, path, body=None, expect=200, **kw):
        st, hdrs, data = self.request(method, path, body, **kw)
        try:
            doc = json.loads(data) if data else None
        except ValueError:
            doc = data
        if expect is not None and st != expect:
            raise KubeFakeError(f"{method} {path}: HTTP {st} (wanted {expect}):"
                                f" {data[:500]!r}")
        return doc

    def status(self, method, path, body=None, expect=None, **kw):
        """An error answer: checks it is a Status with the HTTP code."""
        st, hdrs, data = self.request(method, path, body, **kw)
        doc = json.loads(data)
        assert doc["kind"] == "Status" and doc["apiVersion"] == "v1", doc
        assert doc["status"] == "Failure" and doc["code"] == st, doc
        assert hdrs["content-type"] == "application/json"
        if expect is not None:
            assert st == expect, (st, doc)
        return doc, hdrs

    def pods_path(self, ns, name=None):
        p = f"/api/v1/namespaces/{ns}/pods"
        return p + ("/" + name if name else "")

    def create_pod(self, ns, pod, expect=201):
        return self.json("POST", self.pods_path(ns), pod, expect=expect)

    def get_pod(self, ns, name):
        st, _, data = self.request("GET", self.pods_path(ns, name))
        if st == 404:
            return None
        assert st == 200, (st, data)
        return json.loads(data)

    def wait_pod(self, ns, name, pred, timeout=10, what="condition"):
        deadline = time.monotonic() + timeout
        pod = None
        while time.monotonic() < deadline:
            pod = self.get_pod(ns, name)
            if pred(pod):
                return pod
            time.sleep(0.05)
        raise KubeFakeError(f"pod {ns}/{name}: no {what} after {timeout}s; "
                            f"last: {json.dumps(pod and pod.get('status'))}")

    def wait_ready(self, ns, name, timeout=10):
        return self.wait_pod(ns, name, is_ready, timeout, "Ready")

    def control(self, method, route, body=None, expect=None):
        return self.json(method, "/fake/" + route, body, expect=expect)

    def requests_since(self, seq):
        return self.control("GET", f"requests?since={seq}")["items"]

    def last_seq(self):
        return self.control("GET", "requests?since=999999999")["last"]

    # -- kubectl --
    def kubectl(self, *args, context=None, check=True, timeout=40):
        need_kubectl()
        argv = [KUBECTL, "--kubeconfig", str(self.kubeconfig),
                "--cache-dir", str(self.home / "cache")]
        if context:
            argv += ["--context", context]
        env = dict(os.environ, HOME=str(self.home))
        env.pop("KUBECONFIG", None)
        r = subprocess.run(argv + list(args), capture_output=True, text=True,
                           timeout=timeout, env=env)
        if check and r.returncode != 0:
            raise KubeFakeError(f"kubectl {' '.join(args)}: exit "
                                f"{r.returncode}\n{r.stdout}\n{r.stderr}")
        return r


def need_kubectl():
    """The cross-check with the real kubectl runs in CI: there a missing
    kubectl is a failure, not a skip."""
    if KUBECTL:
        return
    msg = ("kubectl is not installed (Debian 12: apt-get install "
           "kubernetes-client, as scripts/install-deps.sh does)")
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(msg + "; CI=true requires the kubectl cross-check",
                    pytrace=False)
    pytest.skip(msg)


def is_ready(pod):
    if not pod or pod["status"].get("phase") != "Running":
        return False
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod["status"].get("conditions", []))


def cond(pod, ctype):
    for c in pod["status"].get("conditions", []):
        if c["type"] == ctype:
            return c
    return None


def main_state(pod):
    css = pod["status"].get("containerStatuses") or []
    return css[0]["state"] if css else {}


def simple_pod(name=None, labels=None, image="busybox:1.36", generate=None,
               **spec):
    md = {"labels": labels or {}}
    if name:
        md["name"] = name
    if generate:
        md["generateName"] = generate
    s = {"restartPolicy": "Never",
         "containers": [{"name": "main", "image": image,
                         "command": ["sleep", "infinity"]}]}
    s.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": s}


def agent_pod(name, **spec):
    s = {
        "restartPolicy": "Never",
        "serviceAccountName": "sbx",
        "runtimeClassName": "gvisor",
        "imagePullSecrets": [{"name": "regcred"}],
        "tolerations": [{"key": "sbx", "operator": "Exists"}],
        "initContainers": [{
            "name": "install-agent", "image": "ghcr.io/sbx/agent:0.1",
            "command": ["cp", "/sbx-agent", "/sbx/sbx-agent"],
            "volumeMounts": [{"name": "sbx", "mountPath": "/sbx"}]}],
        "containers": [{
            "name": "sandbox", "image": "python:3.12",
            "command": ["/sbx/sbx-agent", "serve", "--root", "/workspace",
                        "--listen", "0.0.0.0:7070", "--token-env",
                        "SBX_AGENT_TOKEN"],
            "env": [{"name": "SBX_AGENT_TOKEN", "value": AGENT_TOKEN},
                    {"name": "SBX_POD", "valueFrom": {
                        "fieldRef": {"fieldPath": "metadata.name"}}}],
            "ports": [{"name": "agent", "containerPort": 7070}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            "readinessProbe": {"httpGet": {"path": "/v1/health",
                                           "port": 7070},
                               "periodSeconds": 1},
            "volumeMounts": [{"name": "sbx", "mountPath": "/sbx"}]}],
        "volumes": [{"name": "sbx", "emptyDir": {}}],
    }
    s.update(spec)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {
                "app.kubernetes.io/managed-by": "sbx",
                "sbx.dev/session": name}},
            "spec": s}


def read_events(resp, n=None, until=None, timeout=10):
    """Reads watch events (one JSON per line) from an http.client
    response; stops after n events, when until(event) is true, or at the
    end of the stream."""
    events = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = resp.readline()
        if not line:
            break
        assert line.endswith(b"\n"), line
        ev = json.loads(line)
        assert set(ev) == {"type", "object"}, ev
        events.append(ev)
        if n is not None and len(events) >= n:
            break
        if until is not None and until(ev):
            break
    return events


def open_stream(fake, path, headers=None, timeout=10):
    c = fake.conn(timeout)
    h = {"Authorization": f"Bearer {fake.token}"}
    h.update(headers or {})
    c.request("GET", path, headers=h)
    return c, c.getresponse()


# -- fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kube_fake(build_dir, tmp_path_factory):
    agent = Path(build_dir) / "agent" / "sbx-agent"
    if not agent.exists():
        pytest.fail(f"{agent} is not built", pytrace=False)
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed")
    fake = KubeFake(tmp_path_factory.mktemp("kubefake") / "fake", agent)
    fake.start()
    yield fake
    code = fake.stop()
    left = fake.agent_pids()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert code == 0, f"the fake exited with {code}:\n{fake.log_tail()}"
    assert not left, f"agents left running after SIGTERM: {left}"


@pytest.fixture
def kube_ns(request):
    base = request.node.name.lower().replace("_", "-")
    base = "".join(ch for ch in base if ch.isalnum() or ch == "-")[:40]
    return f"{base.strip('-')}-{uuid.uuid4().hex[:5]}"


# -- start-up files --------------------------------------------------------------


def test_startup_files(kube_fake):
    import yaml
    d = kube_fake.dir
    ready = json.loads((d / "ready").read_text())
    assert ready["port"] == kube_fake.port
    assert ready["pid"] == kube_fake.proc.pid
    assert ready["url"] == f"https://127.0.0.1:{kube_fake.port}"
    cfg = yaml.safe_load((d / "kubeconfig").read_text())
    assert cfg["current-context"] == "token"
    ctxs = {c["name"]: c["context"] for c in cfg["contexts"]}
    assert set(ctxs) == {"token", "cert", "insecure"}
    assert all(c["namespace"] == "sbx-test" for c in ctxs.values())
    users = {u["name"]: u["user"] for u in cfg["users"]}
    clusters = {c["name"]: c["cluster"] for c in cfg["clusters"]}
    assert users[ctxs["token"]["user"]]["token"] == kube_fake.token
    assert "client-certificate-data" in users[ctxs["cert"]["user"]]
    assert clusters[ctxs["insecure"]["cluster"]]["insecure-skip-tls-verify"]
    ca = base64.b64decode(clusters[ctxs["token"]["cluster"]]
                          ["certificate-authority-data"])
    assert ca == (d / "ca.crt").read_bytes()
    # the server certificate is valid for 127.0.0.1 and localhost
    for host in ("127.0.0.1", "localhost"):
        ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
        with socket.create_connection(("127.0.0.1", kube_fake.port), 5) as s:
            with ctx.wrap_socket(s, server_hostname=host) as t:
                assert t.version()
    out = subprocess.run(["openssl", "x509", "-noout", "-subject", "-in",
                          str(d / "client.crt")], capture_output=True,
                         text=True).stdout
    assert "CN = sbx-test" in out and "O = system:masters" in out


# -- kubectl ------------------------------------------------------------------------


def test_kubectl_contexts(kube_fake, kube_ns):
    for ctx in ("token", "cert", "insecure"):
        r = kube_fake.kubectl("get", "pods", "-n", kube_ns, "-o", "json",
                              context=ctx)
        doc = json.loads(r.stdout)
        assert doc["items"] == [], (ctx, doc)
    seq = kube_fake.last_seq()
    kube_fake.kubectl("get", "pods", "-o", "json", context="cert")
    users = {e["user"] for e in kube_fake.requests_since(seq)}
    assert users == {"sbx-test"}
    # the default namespace comes from the context
    assert any(e["path"] == "/api/v1/namespaces/sbx-test/pods"
               for e in kube_fake.requests_since(seq))


def test_kubectl_create_get_delete(kube_fake, kube_ns, tmp_path):
    k = kube_fake.kubectl
    assert json.loads(k("get", "pods", "-n", kube_ns, "-o",
                        "json").stdout)["items"] == []
    r = k("get", "pods", "-n", kube_ns, check=False)
    assert r.returncode == 0
    assert f"No resources found in {kube_ns} namespace." in r.stderr
    pod_file = tmp_path / "pod.json"
    pod_file.write_text(json.dumps(simple_pod("web-1", {"app": "web"})))
    r = k("create", "-f", str(pod_file), "-n", kube_ns)
    assert "pod/web-1 created" in r.stdout
    # the same name again: AlreadyExists as kubectl prints it
    r = k("create", "-f", str(pod_file), "-n", kube_ns, check=False)
    assert r.returncode != 0
    assert 'Error from server (AlreadyExists): error when creating' in r.stderr
    assert 'pods "web-1" already exists' in r.stderr
    doc = json.loads(k("get", "pods", "-n", kube_ns, "-o", "json").stdout)
    assert [p["metadata"]["name"] for p in doc["items"]] == ["web-1"]
    kube_fake.wait_ready(kube_ns, "web-1")
    out = k("get", "pods", "-n", kube_ns).stdout.splitlines()
    assert out[0].split()[:5] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert out[1].split()[:4] == ["web-1", "1/1", "Running", "0"]
    out = k("get", "pods", "-n", kube_ns, "-o", "wide").stdout
    assert "10.244." in out and "sbx-fake-node" in out
    out = k("get", "pod", "web-1", "-n", kube_ns, "-o",
            "jsonpath={.status.phase}").stdout
    assert out == "Running"
    assert "web-1" in k("get", "pods", "-n", kube_ns, "-l", "app=web").stdout
    r = k("get", "pods", "-n", kube_ns, "-l", "app=other", check=False)
    assert "No resources found" in r.stderr
    # a server without Table support: kubectl prints the PodList itself
    kube_fake.control("POST", "config", {"tables": False}, expect=200)
    try:
        out = k("get", "pods", "-n", kube_ns).stdout.splitlines()
    finally:
        kube_fake.control("POST", "config", {"tables": True}, expect=200)
    assert out[0].split() == ["NAME", "AGE"] and out[1].split()[0] == "web-1"
    r = k("get", "pod", "missing", "-n", kube_ns, check=False)
    assert r.returncode == 1
    assert r.stderr.strip() == \
        'Error from server (NotFound): pods "missing" not found'
    # delete without waiting: returns at once, the pod goes within ~1 s
    t0 = time.monotonic()
    r = k("delete", "pod", "web-1", "-n", kube_ns, "--wait=false")
    assert 'pod "web-1" deleted' in r.stdout
    kube_fake.wait_pod(kube_ns, "web-1", lambda p: p is None, 5, "deletion")
    # delete waiting for the deletion (kubectl watches for DELETED)
    k("create", "-f", str(pod_file), "-n", kube_ns)
    kube_fake.wait_ready(kube_ns, "web-1")
    t0 = time.monotonic()
    r = k("delete", "pod", "web-1", "-n", kube_ns, "--timeout=20s")
    assert 'pod "web-1" deleted' in r.stdout
    assert time.monotonic() - t0 < 15
    assert kube_fake.get_pod(kube_ns, "web-1") is None
    r = k("delete", "pod", "web-1", "-n", kube_ns, check=False)
    assert 'pods "web-1" not found' in r.stderr


# -- pods over HTTP ----------------------------------------------------------------


def test_create_get_list_delete(kube_fake, kube_ns):
    f = kube_fake
    pod = f.create_pod(kube_ns, simple_pod(generate="gen-", labels={"a": "1"}))
    name = pod["metadata"]["name"]
    assert name.startswith("gen-") and len(name) == 9
    assert pod["kind"] == "Pod" and pod["apiVersion"] == "v1"
    md = pod["metadata"]
    assert md["namespace"] == kube_ns and md["uid"] and md["creationTimestamp"]
    assert int(md["resourceVersion"]) > 0
    assert pod["status"]["phase"] == "Pending"
    assert "conditions" not in pod["status"]
    got = f.json("GET", f.pods_path(kube_ns, name))
    assert got["metadata"]["uid"] == md["uid"]
    # 409
    dup = simple_pod(name)
    doc, _ = f.status("POST", f.pods_path(kube_ns), dup, expect=409)
    assert doc["reason"] == "AlreadyExists"
    assert doc["message"] == f'pods "{name}" already exists'
    assert doc["details"] == {"name": name, "kind": "pods"}
    # 404
    doc, _ = f.status("GET", f.pods_path(kube_ns, "nope"), expect=404)
    assert doc == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                   "status": "Failure", "message": 'pods "nope" not found',
                   "reason": "NotFound",
                   "details": {"name": "nope", "kind": "pods"}, "code": 404}
    # list: resourceVersion on the list and on items, no kind on items
    lst = f.json("GET", f.pods_path(kube_ns))
    assert lst["kind"] == "PodList" and lst["apiVersion"] == "v1"
    assert int(lst["metadata"]["resourceVersion"]) >= \
        int(md["resourceVersion"])
    assert [p["metadata"]["name"] for p in lst["items"]] == [name]
    assert "resourceVersion" in lst["items"][0]["metadata"]
    # delete: 200 with deletionTimestamp, then gone, then 404
    f.wait_ready(kube_ns, name)
    deleted = f.json("DELETE", f.pods_path(kube_ns, name),
                     {"gracePeriodSeconds": 5,
                      "propagationPolicy": "Background"})
    assert deleted["metadata"]["deletionTimestamp"]
    assert deleted["metadata"]["deletionGracePeriodSeconds"] == 5
    t0 = time.monotonic()
    f.wait_pod(kube_ns, name, lambda p: p is None, 5, "deletion")
    assert time.monotonic() - t0 < 2.5
    doc, _ = f.status("DELETE", f.pods_path(kube_ns, name), expect=404)
    assert doc["reason"] == "NotFound"


def test_list_selectors_and_continue(kube_fake, kube_ns):
    f = kube_fake
    specs = {"p-a": {"app": "sbx", "tier": "web", "n": "1"},
             "p-b": {"app": "sbx", "tier": "db", "n": "5"},
             "p-c": {"app": "other", "tier": "web"},
             "p-d": {"app": "sbx"}}
    for n, labels in specs.items():
        f.create_pod(kube_ns, simple_pod(n, labels))

    def names(sel=None, field=None):
        q = {}
        if sel is not None:
            q["labelSelector"] = sel
        if field is not None:
            q["fieldSelector"] = field
        path = f.pods_path(kube_ns) + "?" + urllib.parse.urlencode(q)
        return sorted(p["metadata"]["name"]
                      for p in f.json("GET", path)["items"])
    assert names("app=sbx") == ["p-a", "p-b", "p-d"]
    assert names("app==sbx,tier=web") == ["p-a"]
    assert names("app!=sbx") == ["p-c"]
    assert names("tier in (web,db)") == ["p-a", "p-b", "p-c"]
    assert names("tier notin (web)") == ["p-b", "p-d"]
    assert names("tier") == ["p-a", "p-b", "p-c"]
    assert names("!tier") == ["p-d"]
    assert names("app=sbx,!tier") == ["p-d"]
    assert names("n>2") == ["p-b"]
    assert names(field="metadata.name=p-c") == ["p-c"]
    assert names("app=sbx", "metadata.name!=p-a") == ["p-b", "p-d"]
    doc, _ = f.status("GET", f.pods_path(kube_ns) + "?labelSelector=" +
                      urllib.parse.quote("a in (b"), expect=400)
    assert doc["reason"] == "BadRequest"
    doc, _ = f.status("GET", f.pods_path(kube_ns) +
                      "?fieldSelector=spec.bogus%3Dx", expect=400)
    assert "field label not supported" in doc["message"]
    # limit + continue
    seen, cont, pages = [], None, 0
    while True:
        q = "?limit=3" + (f"&continue={urllib.parse.quote(cont)}" if cont
                          else "")
        lst = f.json("GET", f.pods_path(kube_ns) + q)
        pages += 1
        seen += [p["metadata"]["name"] for p in lst["items"]]
        cont = lst["metadata"].get("continue")
        if pages == 1:
            assert lst["metadata"]["remainingItemCount"] == 1
        if not cont:
            break
    assert pages == 2 and seen == ["p-a", "p-b", "p-c", "p-d"]
    # deletecollection by label
    lst = f.json("DELETE", f.pods_path(kube_ns) + "?labelSelector=app%3Dother")
    assert [p["metadata"]["name"] for p in lst["items"]] == ["p-c"]


def test_validation_422(kube_fake, kube_ns):
    f = kube_fake
    cases = [
        (simple_pod(), "metadata.name", "FieldValueRequired"),
        (simple_pod("Bad_Name"), "metadata.name", "FieldValueInvalid"),
        (simple_pod("x" * 64), "metadata.name", "FieldValueInvalid"),
        (simple_pod("nocontainers", containers=[]), "spec.containers",
         "FieldValueRequired"),
        (simple_pod("noimage", containers=[{"name": "c"}]),
         "spec.containers[0].image", "FieldValueRequired"),
    ]
    for body, field, reason in cases:
        doc, _ = f.status("POST", f.pods_path(kube_ns), body, expect=422)
        assert doc["reason"] == "Invalid"
        assert doc["details"]["kind"] == "Pod"
        causes = doc["details"]["causes"]
        assert any(c["field"] == field and c["reason"] == reason
                   for c in causes), doc
        assert doc["message"].startswith(
            f'Pod "{body["metadata"].get("name", "")}" is invalid: ')
    doc, _ = f.status("POST", f.pods_path(kube_ns), simple_pod("Bad_Name"))
    assert doc["message"] == (
        'Pod "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": '
        "a lowercase RFC 1123 label must consist of lower case alphanumeric "
        "characters or '-', and must start and end with an alphanumeric "
        "character (e.g. 'my-name',  or '123-abc', regex used for "
        "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
    assert f.json("GET", f.pods_path(kube_ns))["items"] == []


# -- auth, forbidden, injected failures ----------------------------------------------


def test_auth_401(kube_fake, kube_ns):
    f = kube_fake
    unauth = {"kind": "Status", "apiVersion": "v1", "metadata": {},
              "status": "Failure", "message": "Unauthorized",
              "reason": "Unauthorized", "code": 401}
    doc, _ = f.status("GET", f.pods_path(kube_ns), token=None, expect=401)
    assert doc == unauth
    doc, _ = f.status("GET", "/version", token="wrong", expect=401)
    assert doc == unauth
    # client certificate alone
    st, _, _ = f.request("GET", f.pods_path(kube_ns), token=None, cert=True)
    assert st == 200
    # an added token works, then expires
    t = f.control("POST", "tokens", {"user": "alice", "expires_in": 2.0},
                  expect=201)
    f.json("GET", f.pods_path(kube_ns), token=t["token"])
    time.sleep(2.05)
    f.status("GET", f.pods_path(kube_ns), token=t["token"], expect=401)
    t = f.control("POST", "tokens", {"user": "bob"}, expect=201)
    f.json("GET", f.pods_path(kube_ns), token=t["token"])
    f.control("POST", f"tokens/{t['token']}/expire", expect=200)
    f.status("GET", f.pods_path(kube_ns), token=t["token"], expect=401)
    t = f.control("POST", "tokens", {"user": "carol"}, expect=201)
    f.control("DELETE", f"tokens/{t['token']}", expect=200)
    f.status("GET", f.pods_path(kube_ns), token=t["token"], expect=401)
    # health endpoints are open
    st, _, body = f.request("GET", "/healthz", token=None)
    assert (st, body) == (200, b"ok")


def test_forbidden_403(kube_fake, kube_ns):
    f = kube_fake
    t = f.control("POST", "tokens", {"user": "x"}, expect=201)["token"]
    f.control("POST", "forbid", {"verb": "create", "resource": "pods",
                                 "user": "x"}, expect=201)
    try:
        doc, _ = f.status("POST", f.pods_path(kube_ns), simple_pod("p"),
                          token=t, expect=403)
        assert doc["reason"] == "Forbidden"
        assert doc["message"] == (
            f'pods is forbidden: User "x" cannot create resource "pods" in '
            f'API group "" in the namespace "{kube_ns}"')
        assert doc["details"] == {"kind": "pods"}
        # other users and other verbs are unaffected
        f.json("GET", f.pods_path(kube_ns), token=t)
        f.create_pod(kube_ns, simple_pod("p"))
        f.control("POST", "forbid", {"verb": "get", "resource": "pods/proxy",
                                     "user": "x"}, expect=201)
        doc, _ = f.status("GET", f.pods_path(kube_ns, "p:7070") +
                          "/proxy/v1/health", token=t, expect=403)
        assert doc["message"] == (
            f'pods "p" is forbidden: User "x" cannot get resource '
            f'"pods/proxy" in API group "" in the namespace "{kube_ns}"')
        if KUBECTL or os.environ.get("CI", "").lower() in ("1", "true",
                                                            "yes"):
            f.control("POST", "forbid", {"verb": "list", "resource": "pods",
                                         "namespace": kube_ns}, expect=201)
            r = f.kubectl("get", "pods", "-n", kube_ns, check=False)
            assert r.returncode == 1
            assert ('Error from server (Forbidden): pods is forbidden: User '
                    f'"sbx-test" cannot list resource "pods" in API group "" '
                    f'in the namespace "{kube_ns}"') in r.stderr
    finally:
        f.control("DELETE", "forbid", expect=200)


def test_injected_failures(kube_fake, kube_ns):
    f = kube_fake
    path = f.pods_path(kube_ns)
    f.control("POST", "failures", {"method": "GET", "path": f"/{kube_ns}/pods$",
                                   "code": 429, "count": 2, "retry_after": 3},
              expect=201)
    try:
        for _ in range(2):
            doc, hdrs = f.status("GET", path, expect=429)
            assert hdrs["retry-after"] == "3"
            assert doc["reason"] == "TooManyRequests"
            assert doc["details"]["retryAfterSeconds"] == 3
        f.json("GET", path)  # the third passes
        f.control("POST", "failures", {"method": "POST", "path": kube_ns,
                                       "code": 500}, expect=201)
        doc, _ = f.status("POST", path, simple_pod("x"), expect=500)
        assert doc["reason"] == "InternalError"
        f.control("POST", "failures", {"method": "*", "path": kube_ns,
                                       "code": 503, "count": 1}, expect=201)
        doc, _ = f.status("GET", path, expect=503)
        assert doc["reason"] == "ServiceUnavailable"
        f.json("GET", path)
        assert f.json("GET", path)["items"] == []  # the POST never created
        if KUBECTL or os.environ.get("CI", "").lower() in ("1", "true",
                                                            "yes"):
            # kubectl retries a 429 with Retry-After
            f.control("POST", "failures", {"method": "GET", "path": kube_ns,
                                           "code": 429, "retry_after": 1},
                      expect=201)
            r = f.kubectl("get", "pods", "-n", kube_ns, "-o", "json")
            assert json.loads(r.stdout)["items"] == []
    finally:
        f.control("DELETE", "failures", expect=200)


# -- watch ---------------------------------------------------------------------------


def test_watch_framing_and_replay(kube_fake, kube_ns):
    f = kube_fake
    lst = f.json("GET", f.pods_path(kube_ns))
    rv0 = lst["metadata"]["resourceVersion"]
    c, r = open_stream(f, f.pods_path(kube_ns) + "?watch=true&fieldSelector="
                       "metadata.name%3Dw1&resourceVersion=" + rv0 +
                       "&timeoutSeconds=20")
    try:
        assert r.status == 200
        assert r.getheader("Transfer-Encoding") == "chunked"
        assert r.getheader("Content-Type") == "application/json"
        f.create_pod(kube_ns, simple_pod("w0"))   # filtered out
        created = f.create_pod(kube_ns, simple_pod("w1"))
        evs = read_events(r, until=lambda e: is_ready(e["object"]))
        assert evs[0]["type"] == "ADDED"
        assert all(e["object"]["metadata"]["name"] == "w1" for e in evs)
        assert all(e["type"] == "MODIFIED" for e in evs[1:]) and len(evs) >= 3
        rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in evs]
        assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)
        assert evs[0]["object"]["kind"] == "Pod"
        # lifecycle order: scheduled before ready
        assert cond(evs[1]["object"], "PodScheduled")["status"] == "True"
        f.json("DELETE", f.pods_path(kube_ns, "w1"))
        evs = read_events(r, until=lambda e: e["type"] == "DELETED")
        assert evs[-1]["type"] == "DELETED"
        assert evs[-1]["object"]["metadata"]["deletionTimestamp"]
    finally:
        c.close()
    # replay: every event after the creation's resourceVersion
    c, r = open_stream(f, f.pods_path(kube_ns) + "?watch=1&resourceVersion=" +
                       created["metadata"]["resourceVersion"] +
                       "&labelSelector=&timeoutSeconds=1")
    try:
        t0 = time.monotonic()
        evs = read_events(r)   # ends at timeoutSeconds
        assert time.monotonic() - t0 < 3
        types = [e["type"] for e in evs]
        assert "w1" in {e["object"]["metadata"]["name"] for e in evs}
        assert types[-1] == "DELETED" and "MODIFIED" in types
        assert "ADDED" not in [e["type"] for e in evs
                               if e["object"]["metadata"]["name"] == "w1"]
    finally:
        c.close()
    # without resourceVersion: the current objects as ADDED; bookmarks
    c, r = open_stream(f, f.pods_path(kube_ns) +
                       "?watch=true&allowWatchBookmarks=true&timeoutSeconds=2")
    try:
        evs = read_events(r, timeout=5)
        assert evs[0]["type"] == "ADDED"
        assert evs[0]["object"]["metadata"]["name"] == "w0"
        marks = [e for e in evs if e["type"] == "BOOKMARK"]
        assert marks and marks[0]["object"]["metadata"]["resourceVersion"]
    finally:
        c.close()


def test_watch_410_expired(kube_fake, kube_ns):
    f = kube_fake
    pod = f.create_pod(kube_ns, simple_pod("old"))
    old_rv = pod["metadata"]["resourceVersion"]
    f.wait_ready(kube_ns, "old")
    f.control("POST", "compact", expect=200)
    c, r = open_stream(f, f.pods_path(kube_ns) + "?watch=true&resourceVersion=" +
                       old_rv + "&timeoutSeconds=10")
    try:
        assert r.status == 200
        t0 = time.monotonic()
        evs = read_events(r)
        assert time.monotonic() - t0 < 2   # the stream ends at once
        assert len(evs) == 1 and evs[0]["type"] == "ERROR"
        st = evs[0]["object"]
        assert st["kind"] == "Status" and st["code"] == 410
        assert st["reason"] == "Expired" and st["status"] == "Failure"
        assert st["message"].startswith(f"too old resource version: {old_rv} (")
    finally:
        c.close()
    # a fresh list gives a resourceVersion that can be watched again
    rv = f.json("GET", f.pods_path(kube_ns))["metadata"]["resourceVersion"]
    c, r = open_stream(f, f.pods_path(kube_ns) + "?watch=true&resourceVersion=" +
                       rv + "&timeoutSeconds=1")
    try:
        assert all(e["type"] != "ERROR" for e in read_events(r))
    finally:
        c.close()


# -- lifecycle failure modes ----------------------------------------------------------


def test_lifecycle_failure_modes(kube_fake, kube_ns):
    f = kube_fake
    f.create_pod(kube_ns, simple_pod("pull", image="reg/errimagepull:1"))
    f.create_pod(kube_ns, simple_pod("crash", image="reg/crashloop:1"))
    f.create_pod(kube_ns, simple_pod("cfg", image="reg/badconfig:1"))
    f.create_pod(kube_ns, simple_pod("unsched", nodeSelector={
        "sbx.test/unschedulable": "true"}))

    def waiting(reason):
        return lambda p: main_state(p).get("waiting", {}).get("reason") == reason
    p = f.wait_pod(kube_ns, "pull", waiting("ErrImagePull"), 5, "ErrImagePull")
    assert p["status"]["phase"] == "Pending"
    f.wait_pod(kube_ns, "pull", waiting("ImagePullBackOff"), 5,
               "ImagePullBackOff")
    p = f.wait_pod(kube_ns, "crash", waiting("CrashLoopBackOff"), 5,
                   "CrashLoopBackOff")
    cs = p["status"]["containerStatuses"][0]
    assert cs["restartCount"] >= 1
    assert cs["lastState"]["terminated"]["exitCode"] == 1
    f.wait_pod(kube_ns, "cfg", waiting("CreateContainerConfigError"), 5,
               "CreateContainerConfigError")
    p = f.wait_pod(kube_ns, "unsched",
                   lambda p: cond(p, "PodScheduled") is not None, 5,
                   "PodScheduled")
    c = cond(p, "PodScheduled")
    assert c["status"] == "False" and c["reason"] == "Unschedulable"
    assert c["message"].startswith("0/3 nodes are available: ")
    assert p["status"]["phase"] == "Pending"
    time.sleep(0.3)
    assert cond(f.get_pod(kube_ns, "unsched"), "PodScheduled")["status"] == \
        "False"
    # unscheduled pods are deleted at once
    f.json("DELETE", f.pods_path(kube_ns, "unsched"))
    assert f.get_pod(kube_ns, "unsched") is None


# -- a real agent through the proxy ---------------------------------------------------


def read_frame(resp):
    hdr = resp.read(4)
    assert len(hdr) == 4, hdr
    n = struct.unpack(">I", hdr)[0]
    obj = json.loads(resp.read(n))
    if "len" in obj:
        obj["data"] = resp.read(obj["len"])
    return obj


def test_agent_pod_proxy(kube_fake, kube_ns):
    f = kube_fake
    sent = agent_pod("agent1")
    f.create_pod(kube_ns, sent)
    # before the agent runs: 503 connection refused, not the agent's answer
    pod = f.get_pod(kube_ns, "agent1")
    base = f.pods_path(kube_ns, "agent1:7070") + "/proxy"
    if not is_ready(pod):
        doc, hdrs = f.status("GET", base + "/v1/health")
        if doc["code"] == 503:
            assert "x-sbx-agent" not in hdrs
    pod = f.wait_ready(kube_ns, "agent1")
    # the spec is recorded as sent
    for k in ("initContainers", "volumes", "serviceAccountName",
              "runtimeClassName", "imagePullSecrets", "tolerations"):
        assert pod["spec"][k] == sent["spec"][k], k
    assert pod["spec"]["containers"] == sent["spec"]["containers"]
    assert pod["metadata"]["labels"] == sent["metadata"]["labels"]
    assert [s["state"]["terminated"]["reason"] for s in
            pod["status"]["initContainerStatuses"]] == ["Completed"]
    assert pod["status"]["podIP"].startswith("10.244.")
    info = f.control("GET", f"pods/{kube_ns}/agent1", expect=200)
    assert info["received"] == sent
    assert info["container_port"] == 7070 and info["agent_pid"]
    assert info["env"]["SBX_POD"] == "agent1"
    # health through the proxy, marked by the agent
    st, hdrs, body = f.request("GET", base + "/v1/health")
    assert st == 200, body
    assert hdrs["x-sbx-agent"].startswith("sbx-agent/")
    assert json.loads(body)["ok"] is True
    # the default port and a named port
    assert f.request("GET", f.pods_path(kube_ns, "agent1") +
                     "/proxy/v1/health")[0] == 200
    assert f.request("GET", f.pods_path(kube_ns, "agent1:agent") +
                     "/proxy/v1/health")[0] == 200
    # the token (from the env) works; Authorization never reaches the agent
    seq = f.last_seq()
    tok = {"X-Sbx-Token": AGENT_TOKEN, "Impersonate-User": "root",
           "X-Remote-User": "root", "X-Custom": "kept"}
    st, hdrs, body = f.request("GET", base + "/v1/info", headers=tok)
    assert st == 200, body
    root = Path(json.loads(body)["root"])
    assert root == Path(info["fs"]) / "workspace" and root.is_dir()
    entry = [e for e in f.requests_since(seq)
             if e["path"].endswith("/proxy/v1/info")][-1]
    assert "authorization" in entry["headers"]
    up = entry["upstream_headers"]
    assert "authorization" not in up and "impersonate-user" not in up
    assert "x-remote-user" not in up
    assert "x-sbx-token" in up and "x-custom" in up
    st, _, _ = f.request("GET", base + "/v1/info",
                         headers={"X-Sbx-Token": "wrong"})
    assert st == 401
    # request bodies: Content-Length and chunked
    (root / "a.txt").touch()
    (root / "b.txt").touch()
    st, _, body = f.request("PUT", base + "/v1/fs/write?path=a.txt",
                            body=b"hello", headers=tok)
    assert st == 200, body
    c = f.conn()
    try:
        c.putrequest("PUT", base + "/v1/fs/write?path=b.txt")
        c.putheader("Authorization", f"Bearer {f.token}")
        c.putheader("X-Sbx-Token", AGENT_TOKEN)
        c.putheader("Transfer-Encoding", "chunked")
        c.endheaders()
        for piece in (b"chunk-1 ", b"chunk-2"):
            c.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            time.sleep(0.05)
        c.send(b"0\r\n\r\n")
        r = c.getresponse()
        assert r.status == 200, r.read()
        r.read()
    finally:
        c.close()
    assert (root / "a.txt").read_bytes() == b"hello"
    assert (root / "b.txt").read_bytes() == b"chunk-1 chunk-2"
    st, hdrs, body = f.request("GET", base + "/v1/fs/read?path=b.txt",
                               headers=tok)
    assert (st, body) == (200, b"chunk-1 chunk-2")
    assert "x-sbx-size" in hdrs
    st, _, _ = f.request("HEAD", base + "/v1/health")
    assert st in (200, 405)
    # empty path: 301
    st, hdrs, _ = f.request("GET", base)
    assert st == 301 and hdrs["location"].endswith("/proxy/")
    # a port nothing listens on: 503 connection refused
    doc, hdrs = f.status("GET", f.pods_path(kube_ns, "agent1:9999") +
                         "/proxy/v1/health", expect=503)
    assert "x-sbx-agent" not in hdrs
    assert doc["reason"] == "ServiceUnavailable"
    assert doc["message"] == (
        f"error trying to reach service: dial tcp "
        f"{pod['status']['podIP']}:9999: connect: connection refused")
    # unknown pod: 404
    doc, _ = f.status("GET", f.pods_path(kube_ns, "ghost:7070") +
                      "/proxy/v1/health", expect=404)
    assert doc["message"] == 'pods "ghost" not found'
    # streaming: a watch through the proxy sees a file created afterwards
    c, r = open_stream(f, base + "/v1/watch",
                       headers={"X-Sbx-Token": AGENT_TOKEN})
    try:
        assert r.status == 200
        assert r.getheader("X-Sbx-Agent", "").startswith("sbx-agent/")
        hello = read_frame(r)
        assert hello["kind"] == "hello"
        t0 = time.monotonic()
        (root / "new-file.txt").write_text("x")
        deadline = time.monotonic() + 5
        seen = []
        while time.monotonic() < deadline:
            fr = read_frame(r)
            seen.append(fr)
            if fr.get("path") == "new-file.txt":
                break
        assert seen[-1].get("path") == "new-file.txt", seen
        assert time.monotonic() - t0 < 2
    finally:
        c.close()
    # kill: the proxy answers 503 (not the agent), the pod goes Failed
    agent_pid = info["agent_pid"]
    f.control("POST", f"pods/{kube_ns}/agent1/kill", expect=200)
    doc, hdrs = f.status("GET", base + "/v1/health", expect=503)
    assert "x-sbx-agent" not in hdrs
    assert "connect: connection refused" in doc["message"]
    p = f.wait_pod(kube_ns, "agent1",
                   lambda p: p["status"].get("phase") == "Failed", 5, "Failed")
    term = main_state(p)["terminated"]
    assert term["exitCode"] == 137
    assert cond(p, "Ready")["status"] == "False"
    with pytest.raises(ProcessLookupError):
        os.kill(agent_pid, 0)
    # the log subresource has the agent's output
    st, _, body = f.request("GET", f.pods_path(kube_ns, "agent1") + "/log")
    assert st == 200 and b"listening on" in body


def test_active_deadline_and_evict(kube_fake, kube_ns):
    f = kube_fake
    f.create_pod(kube_ns, agent_pod("deadline", activeDeadlineSeconds=2))
    # the provider's form: the agent behind its bundled dynamic loader
    ev = agent_pod("evicted")
    ev["spec"]["containers"][0]["command"] = [
        "/sbx/lib/ld.so", "--library-path", "/sbx/lib", "/sbx/bin/sbx-agent",
        "serve", "--root", "/home/user/work", "--listen", "0.0.0.0:7070",
        "--token-env", "SBX_AGENT_TOKEN"]
    f.create_pod(kube_ns, ev)
    f.wait_ready(kube_ns, "deadline")
    f.wait_ready(kube_ns, "evicted")
    pids = {n: f.control("GET", f"pods/{kube_ns}/{n}", expect=200)["agent_pid"]
            for n in ("deadline", "evicted")}
    info = f.control("GET", f"pods/{kube_ns}/evicted", expect=200)
    assert info["argv"][1:3] == ["serve", "--root"]
    assert info["argv"][3] == info["fs"] + "/home/user/work"
    f.control("POST", f"pods/{kube_ns}/evicted/evict", expect=200)
    p = f.get_pod(kube_ns, "evicted")
    assert p["status"]["phase"] == "Failed" and p["status"]["reason"] == "Evicted"
    doc, hdrs = f.status("GET", f.pods_path(kube_ns, "evicted:7070") +
                         "/proxy/v1/health", expect=503)
    p = f.wait_pod(kube_ns, "deadline",
                   lambda p: p["status"].get("phase") == "Failed", 6,
                   "DeadlineExceeded")
    assert p["status"]["reason"] == "DeadlineExceeded"
    # the object stays until deleted; the agents are gone
    time.sleep(0.2)
    assert f.get_pod(kube_ns, "deadline") is not None
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    for n in ("deadline", "evicted"):
        f.json("DELETE", f.pods_path(kube_ns, n))
        assert f.get_pod(kube_ns, n) is None   # finished pods go at once


def test_agent_exit_fails_pod(kube_fake, kube_ns):
    """An agent that cannot start (bad --root) terminates the container."""
    f = kube_fake
    pod = agent_pod("badagent")
    pod["spec"]["containers"][0]["command"] += ["--no-such-option"]
    f.create_pod(kube_ns, pod)
    p = f.wait_pod(kube_ns, "badagent",
                   lambda p: p["status"].get("phase") == "Failed", 10, "Failed")
    assert main_state(p)["terminated"]["exitCode"] != 0


# -- issue 12: what the sbx kubernetes tests need of the fake ---------------------


SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


def review(f, ns, verb, resource, sub=None, expect=201, **kw):
    ra = {"namespace": ns, "verb": verb, "group": "", "resource": resource}
    if sub:
        ra["subresource"] = sub
    return f.json("POST", SSAR, {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": ra}}, expect=expect, **kw)


def test_self_subject_access_review(kube_fake, kube_ns):
    """SelfSubjectAccessReview answers by the forbid rules, without using
    them up; discovery lists the group; a malformed review is 422; the
    review itself can be forbidden."""
    f = kube_fake
    groups = f.json("GET", "/apis")["groups"]
    assert any(g["name"] == "authorization.k8s.io" for g in groups)
    res = f.json("GET", "/apis/authorization.k8s.io/v1")["resources"]
    assert res[0]["name"] == "selfsubjectaccessreviews"
    assert res[0]["verbs"] == ["create"]
    doc = review(f, kube_ns, "get", "pods", "proxy")
    assert doc["kind"] == "SelfSubjectAccessReview"
    assert doc["apiVersion"] == "authorization.k8s.io/v1"
    assert doc["status"] == {"allowed": True}
    try:
        f.control("POST", "forbid", {"verb": "get", "resource": "pods/proxy",
                                     "count": 1}, expect=201)
        for _ in range(2):   # a review does not consume the rule
            doc = review(f, kube_ns, "get", "pods", "proxy")
            assert doc["status"] == {"allowed": False}, doc
        assert review(f, kube_ns, "get", "pods")["status"]["allowed"]
        assert review(f, kube_ns, "create", "pods", "proxy")[
            "status"]["allowed"]
        doc, _ = f.status("POST", SSAR, {
            "kind": "SelfSubjectAccessReview", "spec": {}}, expect=422)
        assert doc["reason"] == "Invalid"
        assert doc["details"]["causes"][0]["field"] == \
            "spec.resourceAttributes"
        f.control("POST", "forbid", {"verb": "create",
                                     "resource": "selfsubjectaccessreviews"},
                  expect=201)
        doc, _ = f.status("POST", SSAR, {
            "kind": "SelfSubjectAccessReview", "spec": {
                "resourceAttributes": {"verb": "get", "resource": "pods"}}},
            expect=403)
        assert "selfsubjectaccessreviews" in doc["message"]
        assert doc["details"]["group"] == "authorization.k8s.io"
    finally:
        f.control("DELETE", "forbid", expect=200)


def test_kubectl_auth_can_i(kube_fake, kube_ns):
    """The real kubectl agrees with the fake's reviews."""
    f = kube_fake
    # (kubectl sends the review as protobuf, which the fake decodes)
    r = f.kubectl("auth", "can-i", "get", "pods", "--subresource=proxy",
                  "-n", kube_ns)
    assert r.stdout.strip() == "yes", r
    try:
        f.control("POST", "forbid", {"verb": "get", "resource": "pods/proxy"},
                  expect=201)
        r = f.kubectl("auth", "can-i", "get", "pods", "--subresource=proxy",
                      "-n", kube_ns, check=False)
        assert r.returncode == 1 and r.stdout.strip() == "no", r
        r = f.kubectl("auth", "can-i", "create", "pods", "-n", kube_ns)
        assert r.stdout.strip() == "yes", r
    finally:
        f.control("DELETE", "forbid", expect=200)


def test_container_log_tail_and_termination_message(kube_fake, kube_ns):
    """An agent that crashes at start: terminated with a message, and its
    log served with container= and tailLines= as the kubelet does."""
    f = kube_fake
    pod = agent_pod("crashstart")
    pod["spec"]["containers"][0]["image"] = "example/crashstart:1"
    f.create_pod(kube_ns, pod)
    p = f.wait_pod(kube_ns, "crashstart",
                   lambda p: p["status"].get("phase") == "Failed", 15,
                   "Failed")
    t = main_state(p)["terminated"]
    assert t["exitCode"] == 1 and t["reason"] == "Error", t
    assert "Permission denied" in t["message"], t
    base = f.pods_path(kube_ns, "crashstart") + "/log"
    st, hdrs, data = f.request("GET", base + "?container=sandbox&tailLines=3")
    assert st == 200 and hdrs["content-type"].startswith("text/plain")
    lines = data.decode().splitlines()
    assert len(lines) == 3 and lines[-1].startswith("fatal: "), lines
    assert lines[0] == "boot step 29", lines
    st, _, data = f.request("GET", base)          # one container: default
    assert st == 200 and data.decode().count("\n") == 31
    doc, _ = f.status("GET", base + "?container=nope", expect=400)
    assert doc["message"] == "container nope is not valid for pod crashstart"
    doc, _ = f.status("GET", base + "?container=sandbox&previous=true",
                      expect=400)
    assert "previous terminated container" in doc["message"]
    st, _, data = f.request("GET", base + "?container=install-agent")
    assert st == 200 and data == b""
    f.status("GET", f.pods_path(kube_ns, "nosuchpod") + "/log", expect=404)
    # a container that never started has no log yet
    pull = agent_pod("pullfails")
    pull["spec"]["containers"][0]["image"] = "example/errimagepull:1"
    f.create_pod(kube_ns, pull)
    f.wait_pod(kube_ns, "pullfails", lambda p: main_state(p).get(
        "waiting", {}).get("reason") == "ErrImagePull", 10, "ErrImagePull")
    doc, _ = f.status("GET", f.pods_path(kube_ns, "pullfails") +
                      "/log?container=sandbox", expect=400)
    assert "is waiting to start" in doc["message"], doc
    if KUBECTL or os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        r = f.kubectl("logs", "crashstart", "-n", kube_ns, "--tail", "2")
        assert r.stdout.splitlines()[-1].startswith("fatal: "), r


def test_request_log_bodies_agents_and_query_failures(kube_fake, kube_ns):
    """The request log keeps User-Agent, Content-Type and API bodies (a
    DELETE's DeleteOptions); injected failures can target the query (the
    watch) apart from the list."""
    f = kube_fake
    f.create_pod(kube_ns, simple_pod("logged"))
    seq = f.last_seq()
    f.request("DELETE", f.pods_path(kube_ns, "logged"),
              {"gracePeriodSeconds": 5, "propagationPolicy": "Background"},
              headers={"User-Agent": "sbx/9.9"})
    e = [x for x in f.requests_since(seq) if x["method"] == "DELETE"][0]
    assert e["body"] == {"gracePeriodSeconds": 5,
                         "propagationPolicy": "Background"}, e
    assert e["user_agent"] == "sbx/9.9" and \
        e["content_type"] == "application/json", e
    path = f.pods_path(kube_ns)
    f.control("POST", "failures", {"method": "GET", "path": f"/{kube_ns}/pods$",
                                   "query": "watch=", "code": 503},
              expect=201)
    try:
        assert f.json("GET", path)["items"] is not None   # a list: served
        doc, _ = f.status("GET", path + "?watch=true&timeoutSeconds=1",
                          expect=503)
        assert doc["reason"] == "ServiceUnavailable"
        st, _, _ = f.request("GET", path + "?watch=true&timeoutSeconds=1")
        assert st == 200                                   # count 1: once
    finally:
        f.control("DELETE", "failures", expect=200)


OLD_AGENT = """#!/bin/sh
# An sbx-agent from before --token-env: the fake must fall back to a file.
case "$1" in --help|help) echo "usage: sbx-agent serve --root DIR \
--listen HOST:PORT --token-file FILE"; exit 0;; esac
for a in "$@"; do
  [ "$a" = --token-env ] && { echo "unknown option --token-env" >&2; exit 2; }
done
exec "%s" "$@"
"""


def test_token_env_fallback_and_sigterm(build_dir, tmp_path):
    """An agent without --token-env gets --token-file; SIGTERM stops the
    fake (exit 0) and every agent it started."""
    agent = Path(build_dir) / "agent" / "sbx-agent"
    old = tmp_path / "old-agent"
    old.write_text(OLD_AGENT % agent.resolve())
    old.chmod(0o755)
    fake = KubeFake(tmp_path / "fake2", old).start()
    try:
        fake.create_pod("ns1", agent_pod("a1"))
        fake.wait_ready("ns1", "a1")
        info = fake.control("GET", "pods/ns1/a1", expect=200)
        argv = info["argv"]
        assert "--token-env" not in argv
        tf = Path(argv[argv.index("--token-file") + 1])
        assert tf.read_text().strip() == AGENT_TOKEN
        assert "--listen" in argv and "127.0.0.1:0" in argv
        st, _, body = fake.request(
            "GET", fake.pods_path("ns1", "a1:7070") + "/proxy/v1/info",
            headers={"X-Sbx-Token": AGENT_TOKEN})
        assert st == 200, body
        assert len(fake.agent_pids()) == 1
    finally:
        code = fake.stop()
    assert code == 0, fake.log_tail()
    deadline = time.monotonic() + 5
    while fake.agent_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fake.agent_pids() == []
    assert not (fake.dir / "ready").exists()


def test_sigkill_leaves_no_agent(build_dir, tmp_path):
    """Even a SIGKILLed fake leaves no agent behind (parent-death signal)."""
    agent = Path(build_dir) / "agent" / "sbx-agent"
    fake = KubeFake(tmp_path / "fake3", agent).start()
    try:
        fake.create_pod("ns1", agent_pod("a1"))
        fake.wait_ready("ns1", "a1")
        assert len(fake.agent_pids()) == 1
    finally:
        fake.proc.kill()
        fake.proc.wait(10)
    deadline = time.monotonic() + 5
    while fake.agent_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = fake.agent_pids()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []
