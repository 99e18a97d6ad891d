"""The fake Kubernetes API server (tests/fakes/kube_apiserver.py) as a
fixture helper, shared by test_kubernetes.py and the `sandbox` fixture's
kubernetes provider."""

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

from .fakeproc import FakeProcess, FakeSandbox

FAKE = Path(__file__).resolve().parents[2] / "fakes" / "kube_apiserver.py"
NS = "sbx-test"


class KubeFakeServer(FakeProcess):
    script = FAKE
    what = "the fake API server"

    def start(self, timeout=30):
        super().start(timeout)
        self.url = self.ready["url"]
        self.kubeconfig = self.dir / "kubeconfig"
        self.token = (self.dir / "token").read_text().strip()
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE
        return self

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


class KubeSandbox(FakeSandbox):
    """A session of the kubernetes provider on the fake: its "worktree" is
    the directory the pod's agent serves."""

    @classmethod
    def up(cls, env, name, fake, repo=None):
        cfg = write_config(env, fake)
        r = env.sbx("--config", str(cfg), "up", name, "--provider",
                    "kubernetes", timeout=120)
        sb = cls.started(env, name, fake, repo, "kubernetes", r)
        sb.config = cfg
        return sb.settle(fake.pod_root(name), repo)

    def sbx(self, *args, **kw):
        return self.env.sbx("--config", str(self.config), *args, **kw)
