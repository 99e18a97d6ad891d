"""The fake Modal server (tests/fakes/modal_server.py) for the modal
provider's tests: start/stop, its control surface, and an agent bundle."""

import json
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
FAKE = ROOT / "tests" / "fakes" / "modal_server.py"


class ModalFakeServer:
    def __init__(self, d, agent):
        self.dir = Path(d)
        self.agent = agent
        self.proc = None

    def start(self, timeout=60):
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["/usr/bin/python3", str(FAKE), "--dir", str(self.dir),
             "--agent", str(self.agent)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not (self.dir / "ready").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the fake Modal server did not start:\n"
                                   + self.log_tail())
            time.sleep(0.05)
        self.ready = json.loads((self.dir / "ready").read_text())
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


class ModalSandbox:
    """A session of the modal provider on the fake: its "worktree" is the
    sandbox's directory in the fake, which tests may change directly (as a
    command in the sandbox would)."""

    @classmethod
    def up(cls, env, name, fake, repo=None):
        from .env import Sandbox, SbxError
        configure(env, fake, fake.bundle)
        r = env.sbx("up", name, "--provider", "modal", timeout=180)
        if r.rc != 0:
            raise SbxError(f"sbx up --provider modal failed:\n{r}\n"
                           f"{env.log_tail(name)}\n--- fake ---\n"
                           f"{fake.log_tail()}")
        sb = Sandbox(env, name, Path(r.out.strip().splitlines()[-1]), repo)
        sb.__class__ = type("ModalSandbox", (cls, Sandbox), {})
        sb.provider = "modal"
        sb.fake = fake
        sid = env.status(name)["sandbox_id"]
        sb.root = fake.sandbox_root(sid)
        sb.wait_mounted()
        if repo is not None:
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

    def down(self, timeout=120):
        return self.env.sbx("down", self.name, "--force", timeout=timeout)

    def __repr__(self):
        return f"ModalSandbox({self.name!r}, mnt={str(self.mnt)!r})"
