"""The fake Modal server (tests/fakes/modal_server.py) for the modal
provider's tests: start/stop, its control surface, and an agent bundle."""

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from .fakeproc import FakeProcess, FakeSandbox

ROOT = Path(__file__).resolve().parents[3]
FAKE = ROOT / "tests" / "fakes" / "modal_server.py"


class ModalFakeServer(FakeProcess):
    script = FAKE
    what = "the fake Modal server"

    def start(self, timeout=60):
        return super().start(timeout)

    def control(self, method, path, body=None):
        req = urllib.request.Request(
            self.ready["control_url"] + path, method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{method} {path}: {e.code} "
                                 f"{e.read()[:500]!r}")

    def calls(self, method=None):
        cs = self.control("GET", "/calls")["calls"]
        return [c for c in cs if method is None or c["method"] == method]

    def sandbox_root(self, sandbox_id, workdir="/workspace"):
        st = self.control("GET", f"/sandboxes/{sandbox_id}")
        fs = Path(st.get("fs") or st["sandbox"]["fs"])
        return fs / workdir.lstrip("/")


def make_bundle(build_dir, out):
    """The agent bundle (contrib/agent/bundle.sh) in `out`."""
    subprocess.run([str(ROOT / "contrib" / "agent" / "bundle.sh"),
                    str(Path(build_dir) / "agent" / "sbx-agent"), str(out)],
                   check=True, capture_output=True)
    return Path(out)


def configure(env, fake, bundle, **extra):
    """Point an SbxEnv at the fake: credentials, CA, bundle."""
    env.env["MODAL_CONFIG_PATH"] = fake.ready["config"]
    cfg_path = env.root / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text() or "{}")
    except (OSError, ValueError):
        cfg = {}
    cfg["modal"] = {"ca_file": fake.ready["ca"],
                    "agent_bundle": str(bundle), "ready_timeout": 30,
                    "request_timeout": 20, **extra}
    cfg_path.write_text(json.dumps(cfg) + "\n")


class ModalSandbox(FakeSandbox):
    """A session of the modal provider on the fake: its "worktree" is the
    sandbox's directory in the fake."""

    @classmethod
    def up(cls, env, name, fake, repo=None):
        configure(env, fake, fake.bundle)
        r = env.sbx("up", name, "--provider", "modal", timeout=180)
        sb = cls.started(env, name, fake, repo, "modal", r)
        sid = env.status(name)["sandbox_id"]
        return sb.settle(fake.sandbox_root(sid), repo)
