"""A real sbx-agent on loopback, for the remote-provider tests.

    a = Agent(env.bin("sbx-agent"), root, workdir).start()
    a.url            http://127.0.0.1:PORT
    a.token_file     the token file (0600) given to --token-file
    a.health()       GET /v1/health as a dict (no token)
    a.info()         GET /v1/info (with the token)
    a.kill()         SIGKILL (a crash); a.stop() SIGTERM then SIGKILL
    a.restart()      start again on the same port (a new boot id)
    a.output()       what the agent printed (stdout+stderr, all runs)

The root is a git repository (make_agent_root()): a clone of the test's
`repo` checked out on branch sbx/NAME, so the git tests of the local
provider find the same files and the same branch name.  Unlike a local
sandbox (a worktree whose .git is a file pointing into the source repo),
the remote root holds its own .git directory, which the mount serves like
any other directory: git through the mount exercises the remote data plane.
"""

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from .env import Sandbox, SbxError



def free_port(host="127.0.0.1"):
    """A port nobody listens on right now (bind 0, read, close)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def make_agent_root(env, repo, root, branch):
    """Clone `repo` into `root` and check out a new `branch` there."""
    env.git("clone", "-q", "--no-hardlinks", str(repo), str(root))
    env.git("checkout", "-q", "-b", branch, cwd=root)
    return Path(root)


class AgentError(AssertionError):
    pass


class Agent:
    def __init__(self, binary, root, workdir, token=None, env=None,
                 host="127.0.0.1", port=None):
        self.binary = str(binary)
        self.root = Path(root)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.port = port
        self.token = token or secrets.token_hex(16)
        self.token_file = self.workdir / "agent.token"
        self.token_file.write_text(self.token + "\n")
        os.chmod(self.token_file, 0o600)
        self.log_path = self.workdir / "agent.log"
        self.env = dict(env if env is not None else os.environ)
        self.proc = None
        self.runs = 0

    # -- life cycle ------------------------------------------------------------

    @property
    def url(self):
        return f"http://{self.host}:{self.port}"

    @property
    def address(self):
        return (self.host, self.port)

    def argv(self):
        return [self.binary, "serve", "--root", str(self.root),
                "--listen", f"{self.host}:{self.port}",
                "--token-file", str(self.token_file)]

    def start(self, timeout=10):
        """Start the agent (on a free port the first time, then on the same
        one) and wait until /v1/health answers."""
        if self.alive():
            raise AgentError("agent already running")
        fixed = self.port is not None
        last = ""
        for _ in range(1 if fixed else 5):
            if not fixed:
                self.port = free_port(self.host)
            ok, last = self._spawn_and_wait(timeout, retry_in_use=fixed)
            if ok:
                self.runs += 1
                return self
            if "in use" not in last.lower():
                break
        raise AgentError(f"sbx-agent did not become healthy on {self.url}:\n"
                         f"{last}")

    def _spawn_and_wait(self, timeout, retry_in_use):
        """Spawn once (again while the port is still in use, when
        retry_in_use: a killed agent's port may linger for a moment)."""
        deadline = time.monotonic() + timeout
        with open(self.log_path, "ab") as log:
            while True:
                log.write(f"--- run {self.runs + 1}: "
                          f"{' '.join(self.argv())}\n".encode())
                log.flush()
                start_len = self.log_path.stat().st_size
                self.proc = subprocess.Popen(
                    self.argv(), stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir)
                while time.monotonic() < deadline and \
                        self.proc.poll() is None:
                    try:
                        self.health(timeout=1)
                        return True, ""
                    except (OSError, AgentError, ValueError):
                        time.sleep(0.02)
                if self.proc.poll() is None:
                    self._terminate()
                    return False, f"(no health after {timeout}s)\n" + \
                        self.output()[start_len:][-4000:]
                out = self.output()[start_len:][-4000:]
                if retry_in_use and "in use" in out.lower() and \
                        time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                return False, f"(exited {self.proc.returncode})\n{out}"

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def pid(self):
        return self.proc.pid if self.alive() else None

    def kill(self, sig=signal.SIGKILL):
        """Kill the agent (default SIGKILL, like a crash) and reap it."""
        if not self.alive():
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def _terminate(self):
        self.kill(signal.SIGTERM)

    def stop(self):
        self._terminate()

    def restart(self, timeout=10):
        self.kill()
        return self.start(timeout)

    def output(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # -- HTTP ----------------------------------------------------------------

    def request(self, method, route, body=None, token=True, timeout=5,
                base=None):
        """One request; returns (status, headers, body bytes)."""
        url = (base or self.url) + route
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        if token:
            req.add_header("X-Sbx-Token",
                           self.token if token is True else token)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def health(self, timeout=2):
        st, _, body = self.request("GET", "/v1/health", token=False,
                                   timeout=timeout)
        if st != 200:
            raise AgentError(f"/v1/health: HTTP {st}: {body[:200]!r}")
        return json.loads(body)

    def info(self):
        st, _, body = self.request("GET", "/v1/info")
        if st != 200:
            raise AgentError(f"/v1/info: HTTP {st}: {body[:200]!r}")
        return json.loads(body)

    def __repr__(self):
        return f"Agent({self.url}, root={str(self.root)!r}, " \
               f"pid={self.pid()})"


def remote_up(env, name, agent_url, token_file, *extra, timeout=120):
    """`sbx up NAME --provider remote --url URL --token-file F`: a Result."""
    return env.sbx("up", name, "--provider", "remote", "--url", agent_url,
                   "--token-file", token_file, *extra, timeout=timeout)


class RemoteSandbox(Sandbox):
    """A session of the remote provider: its "worktree" is the agent root,
    which tests may change directly (as a command in the sandbox would)."""

    def __init__(self, env, name, mnt, agent, proxy=None, repo=None):
        super().__init__(env, name, mnt, repo)
        self.provider = "remote" if proxy is None else "slow_remote"
        self.agent = agent
        self.proxy = proxy

    @property
    def worktree(self):
        return self.agent.root

    @property
    def url(self):
        return self.proxy.url if self.proxy is not None else self.agent.url


def set_remote_config(env, **remote):
    """Write `{"remote": {...}}` into the env's SBX_CONFIG (timeouts)."""
    cfg_path = env.root / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text() or "{}")
    except ValueError:
        cfg = {}
    cfg.setdefault("remote", {}).update(remote)
    cfg_path.write_text(json.dumps(cfg) + "\n")


def up_remote(env, name, agent, proxy=None, *extra, wait=True, repo=None):
    """Mount `agent` (through `proxy` if given) as session NAME."""
    url = proxy.url if proxy is not None else agent.url
    r = remote_up(env, name, url, agent.token_file, *extra)
    if r.rc != 0:
        raise SbxError(f"sbx up --provider remote failed:\n{r}\n"
                       f"{env.log_tail(name)}\n--- agent output ---\n"
                       f"{agent.output()[-3000:]}")
    mnt = Path(r.out.strip().splitlines()[-1])
    sb = RemoteSandbox(env, name, mnt, agent, proxy, repo)
    if wait:
        sb.wait_mounted()
    return sb
