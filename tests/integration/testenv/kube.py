"""The fake Kubernetes API server (tests/fakes/kube_apiserver.py) as a
fixture helper, shared by test_kubernetes.py and the `sandbox` fixture's
kubernetes provider."""

import json
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

FAKE = Path(__file__).resolve().parents[2] / "fakes" / "kube_apiserver.py"
NS = "sbx-test"


class KubeFakeServer:
    def __init__(self, d, agent):
        self.dir = Path(d)
        self.agent = agent
        self.proc = None

    def start(self, timeout=30):
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["/usr/bin/python3", str(FAKE), "--dir", str(self.dir),
             "--agent", str(self.agent)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not (self.dir / "ready").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the fake API server did not start:\n"
                                   + self.log_tail())
            time.sleep(0.05)
        info = json.loads((self.dir / "ready").read_text())
        self.url = info["url"]
        self.kubeconfig = self.dir / "kubeconfig"
        self.token = (self.dir / "token").read_text().strip()
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE
        return self

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, n=4000):
        try:
            return (self.dir / "fake.log").read_text()[-n:]
        except OSError:
            return "(no fake.log)"

    def api(self, method, path, body=None):
        req = urllib.request.Request(
            self.url + path, method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.token}",
                     "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self.ctx,
                                        timeout=30) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def pods(self, ns=NS):
        st, j = self.api("GET", f"/api/v1/namespaces/{ns}/pods")
        assert st == 200, j
        return j["items"]

    def pod(self, session, ns=NS):
        """The pod of an sbx session (by label), or None."""
        ps = [p for p in self.pods(ns)
              if p["metadata"]["labels"].get("sbx.dev/session") == session]
        assert len(ps) <= 1, ps
        return ps[0] if ps else None

    def internals(self, name, ns=NS):
        st, j = self.api("GET", f"/fake/pods/{ns}/{name}")
        assert st == 200, j
        return j

    # -- the fake's control API (tests/fakes/kube_apiserver.py) --
    def last_seq(self):
        st, j = self.api("GET", "/fake/requests?since=999999999")
        assert st == 200, j
        return j["last"]

    def requests(self, since=0):
        """API requests recorded after `since` (see the fake's docstring:
        method, path, query, params, user_agent, body, code, ...)."""
        st, j = self.api("GET", f"/fake/requests?since={since}")
        assert st == 200, j
        return j["items"]

    def inject(self, **rule):
        """POST /fake/failures (method, path, query, code, count, action,
        delay, retry_after, message)."""
        st, j = self.api("POST", "/fake/failures", rule)
        assert st in (200, 201), j
        return j

    def forbid(self, **rule):
        st, j = self.api("POST", "/fake/forbid", rule)
        assert st in (200, 201), j
        return j

    def failures(self):
        st, j = self.api("GET", "/fake/state")
        assert st == 200, j
        return j["failures"]

    def clear(self):
        """No injected failure and no forbid rule is left."""
        self.api("DELETE", "/fake/failures")
        self.api("DELETE", "/fake/forbid")

    def pod_root(self, session, ns=NS):
        """The directory the pod's agent serves (its workdir)."""
        name = self.pod(session, ns)["metadata"]["name"]
        argv = self.internals(name, ns)["argv"]
        return Path(argv[argv.index("--root") + 1])


def write_config(env, fake, **extra):
    """A config file for `sbx --config` pointing at the fake."""
    cfg = {"kubernetes": {"kubeconfig": str(fake.kubeconfig),
                          "ready_timeout": 30, "timeout": 20, **extra}}
    path = env.root / "kube-config.json"
    path.write_text(json.dumps(cfg))
    return path


class KubeSandbox:
    """A session of the kubernetes provider on the fake: its "worktree" is
    the directory the pod's agent serves, which tests may change directly
    (as a command in the pod would)."""

    @classmethod
    def up(cls, env, name, fake, repo=None):
        from .env import Sandbox, SbxError
        cfg = write_config(env, fake)
        r = env.sbx("--config", str(cfg), "up", name, "--provider",
                    "kubernetes", timeout=120)
        if r.rc != 0:
            raise SbxError(f"sbx up --provider kubernetes failed:\n{r}\n"
                           f"{env.log_tail(name)}\n--- fake ---\n"
                           f"{fake.log_tail()}")
        sb = Sandbox(env, name, Path(r.out.strip().splitlines()[-1]), repo)
        sb.__class__ = type("KubeSandbox", (cls, Sandbox), {})
        sb.provider = "kubernetes"
        sb.fake = fake
        sb.config = cfg
        sb.root = fake.pod_root(name)
        sb.wait_mounted()
        if repo is not None:
            # As if the image (or a first command) brought the code.
            env.git("clone", "-q", "--no-hardlinks", str(repo),
                    str(sb.root))
            env.git("checkout", "-q", "-b", f"sbx/{name}", cwd=sb.root)
            deadline = time.monotonic() + 10
            while not (sb.mnt / ".git").exists():
                if time.monotonic() > deadline:
                    raise SbxError("the cloned repository did not show "
                                   "through the mount")
                time.sleep(0.05)
        return sb

    @property
    def worktree(self):
        return self.root

    def sbx(self, *args, **kw):
        return self.env.sbx("--config", str(self.config), *args, **kw)

    def down(self, timeout=120):
        return self.sbx("down", self.name, "--force", timeout=timeout)

    def __repr__(self):
        return f"KubeSandbox({self.name!r}, mnt={str(self.mnt)!r})"
