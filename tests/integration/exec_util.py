"""Helpers for the exec-shim tests (test_exec.py).

    shim(env)                 path of the built sbx-exec
    run_bytes(env, args, ...) subprocess.run with bytes in/out, sbx env
    shim_dir(env)             a directory of shim symlinks (sbx shim install)
    tmux                      a detached tmux server private to one test
"""

import hashlib
import os
import shutil
import subprocess
import time
import uuid


def shim(env):
    return str(env.bin("sbx-exec"))


def run_bytes(env, args, *, cwd=None, input=None, timeout=120, extra_env=None):
    e = dict(env.env)
    if extra_env:
        e.update(extra_env)
    return subprocess.run([str(a) for a in args], cwd=cwd, env=e, input=input,
                          capture_output=True, timeout=timeout)


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def shim_dir(env, cmds=()):
    d = env.root / "shims"
    r = env.sbx("shim", "install", d, *cmds, timeout=30)
    assert r.rc == 0, str(r)
    return d


def path_with(d, env):
    return f"{d}:{env.env.get('PATH', '/usr/bin:/bin')}"


def wait_for(pred, timeout=10.0, step=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


class Tmux:
    """A private tmux server (-L) with one window of a given size."""

    def __init__(self, env):
        self.sock = "sbxtest-" + uuid.uuid4().hex[:8]
        self.env = dict(env.env)
        self.env.pop("TMUX", None)
        self.env["TERM"] = "xterm-256color"

    def tmux(self, *args, check=True):
        p = subprocess.run(["tmux", "-L", self.sock, *map(str, args)],
                           env=self.env, capture_output=True, text=True,
                           timeout=30)
        if check and p.returncode != 0:
            raise AssertionError(f"tmux {args}: {p.stderr}")
        return p

    def start(self, cmd, cwd, cols=80, rows=24):
        self.tmux("-f", "/dev/null", "new-session", "-d", "-s", "t",
                  "-x", cols, "-y", rows, "-c", cwd, cmd)
        self.tmux("set-option", "-g", "remain-on-exit", "on", check=False)
        self.tmux("set-option", "-g", "window-size", "manual", check=False)

    def keys(self, *keys):
        self.tmux("send-keys", "-t", "t", *keys)

    def capture(self):
        return self.tmux("capture-pane", "-p", "-t", "t").stdout

    def wait_text(self, text, timeout=10.0):
        ok = wait_for(lambda: text in self.capture(), timeout)
        assert ok, f"{text!r} not on screen:\n{self.capture()}"

    def kill(self):
        self.tmux("kill-server", check=False)


def have(prog):
    return shutil.which(prog) is not None


def pid_children_gone(pid):
    return not os.path.exists(f"/proc/{pid}")
