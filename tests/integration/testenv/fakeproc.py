"""What the fixture helpers of the fake servers (kube.py, modal.py) share:
starting a fake of tests/fakes/ and waiting for its ready file, stopping
it, its log; and the steps of a provider session on a fake that do not
depend on the provider."""

import json
import signal
import subprocess
import time
from pathlib import Path


class FakeProcess:
    """A fake server of tests/fakes/ (`script`) run with --dir and --agent;
    `what` names it in errors.  start() returns self once the fake wrote
    its ready file, whose content is then in self.ready."""

    script = None
    what = "the fake server"

    def __init__(self, d, agent):
        self.dir = Path(d)
        self.agent = agent
        self.proc = None
        self.ready = None

    def start(self, timeout=30):
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["/usr/bin/python3", str(self.script), "--dir", str(self.dir),
             "--agent", str(self.agent)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not (self.dir / "ready").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.what} did not start:\n"
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


class FakeSandbox:
    """What KubeSandbox and ModalSandbox share: a session of a provider on
    a fake whose "worktree" is the directory the fake's agent serves
    (self.root), which tests may change directly (as a command in the
    sandbox would)."""

    @classmethod
    def started(cls, env, name, fake, repo, provider, r):
        """The Sandbox of a successful `sbx up` (its CompletedRun `r`), as
        an instance of `cls` mixed with testenv's Sandbox; raises SbxError
        with the daemon's and the fake's logs when it failed."""
        from .env import Sandbox, SbxError
        if r.rc != 0:
            raise SbxError(f"sbx up --provider {provider} failed:\n{r}\n"
                           f"{env.log_tail(name)}\n--- fake ---\n"
                           f"{fake.log_tail()}")
        sb = Sandbox(env, name, Path(r.out.strip().splitlines()[-1]), repo)
        sb.__class__ = type(cls.__name__, (cls, Sandbox), {})
        sb.provider = provider
        sb.fake = fake
        return sb

    def settle(self, root, repo):
        """The sandbox's root is `root`: wait for the mount, then (with a
        repo) seed it as the image or a first command would."""
        self.root = root
        self.wait_mounted()
        if repo is not None:
            seed_repo(self.env, self, repo)
        return self

    @property
    def worktree(self):
        return self.root

    def down(self, timeout=120):
        return self.sbx("down", self.name, "--force", timeout=timeout)

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r}, mnt={str(self.mnt)!r})"


def seed_repo(env, sb, repo):
    """Clone `repo` into the sandbox's root behind the mount, as if the
    image (or a first command) brought the code, and wait until it shows
    through the mount."""
    from .env import SbxError
    env.git("clone", "-q", "--no-hardlinks", str(repo), str(sb.root))
    env.git("checkout", "-q", "-b", f"sbx/{sb.name}", cwd=sb.root)
    deadline = time.monotonic() + 10
    while not (sb.mnt / ".git").exists():
        if time.monotonic() > deadline:
            raise SbxError("the cloned repository did not show through "
                           "the mount")
        time.sleep(0.05)


def start_logged(script, d, agent, args, out_path):
    """Start the fake `script` on directory d with its stdout and stderr in
    out_path (for the tests of the fakes themselves, which read it)."""
    with open(out_path, "wb") as out:
        return subprocess.Popen(
            ["/usr/bin/python3", str(script), "--dir", str(d), "--agent",
             str(agent)] + list(args),
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)


def wait_ready(proc, d, timeout, output, stop, error):
    """The content of d/ready once the fake `proc` wrote it.  Raises
    error(message) with output() when the fake exits first, and after
    stop() when `timeout` seconds pass."""
    ready = Path(d) / "ready"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise error(f"the fake exited with {proc.returncode}:\n"
                        f"{output()}")
        if ready.exists():
            return json.loads(ready.read_text())
        time.sleep(0.05)
    stop()
    raise error(f"no {ready} after {timeout}s:\n{output()}")
