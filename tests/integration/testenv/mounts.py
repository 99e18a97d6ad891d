"""Mount table helpers: read /proc/self/mountinfo, wait for a mount, clean up.

Nothing here stats a path inside a FUSE mount before it knows the mount is
there, so a hung or dead daemon cannot hang the helpers themselves.
"""

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class MountEntry:
    mountpoint: str
    fstype: str
    source: str
    options: str


def _unescape(s):
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 4 <= len(s) and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def all_mounts():
    """All mounts of this mount namespace, in mount order."""
    res = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.rstrip("\n").partition(" - ")
            fields = pre.split(" ")
            fstype, source, opts = (post.split(" ") + ["", "", ""])[:3]
            res.append(MountEntry(_unescape(fields[4]), fstype,
                                  _unescape(source), opts))
    return res


def mounts_at(path):
    path = os.path.abspath(str(path))
    return [m for m in all_mounts() if m.mountpoint == path]


def mounts_under(root):
    root = os.path.abspath(str(root))
    return [m for m in all_mounts()
            if m.mountpoint == root or m.mountpoint.startswith(root + "/")]


def is_mounted(path):
    return bool(mounts_at(path))


def sbx_mount_at(path):
    """The fuse.sbx mount entry at path, or None."""
    for m in reversed(mounts_at(path)):
        if m.fstype == "fuse.sbx" or m.source.startswith("sbx:"):
            return m
    return None


def pid_alive(pid):
    """True when pid exists and is not a zombie."""
    if not pid:
        return False
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return False


class MountError(AssertionError):
    pass


def wait_for_mount(path, pid=None, timeout=10.0, log=None, proc=None):
    """Poll until a FUSE mount is at `path` and answers a stat().

    Fails early when the daemon (`pid`, or the Popen `proc`) has died.
    `log` (a path) is quoted in the failure message.
    """
    deadline = time.monotonic() + timeout
    why = "no mount appeared"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            why = f"daemon process exited with status {proc.returncode}"
            break
        if pid is not None and not pid_alive(pid):
            why = f"daemon pid {pid} died"
            break
        if is_mounted(path):
            try:
                os.stat(path)
                return
            except OSError as e:
                why = f"mounted but stat failed: {e}"
        time.sleep(0.02)
    msg = f"wait_for_mount({path}): {why}"
    if log and os.path.exists(log):
        msg += f"\n--- {log} ---\n" + Path(log).read_text(errors="replace")[-4000:]
    raise MountError(msg)


def wait_for_unmount(path, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_mounted(path):
            return True
        time.sleep(0.02)
    return False


def lazy_unmount(path):
    """fusermount3 -u -z, falling back to umount -l.  Returns True if gone."""
    path = str(path)
    for cmd in (["fusermount3", "-u", "-z", path], ["umount", "-l", path]):
        if not shutil.which(cmd[0]):
            continue
        subprocess.run(cmd, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=30)
        if not is_mounted(path):
            return True
    return not is_mounted(path)


def unmount_all_under(root):
    """Lazily unmount every mount at or below root, innermost first."""
    left = []
    for m in reversed(mounts_under(root)):
        if not lazy_unmount(m.mountpoint):
            left.append(m.mountpoint)
    return left


def processes_with_env(key, value):
    """Pids (not ours) whose environment has key=value."""
    needle = f"{key}={value}".encode()
    me = os.getpid()
    res = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if needle in env and pid_alive(int(d)):
            res.append(int(d))
    return res


def kill_pids(pids, grace=3.0):
    """SIGTERM, wait up to `grace` seconds, then SIGKILL what is left."""
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    for p in pids:
        if pid_alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def stat_errno(path):
    """0 when stat(path) works, else the errno (ENOTCONN for a dead mount)."""
    try:
        os.stat(path)
        return 0
    except OSError as e:
        return e.errno



def cleanup_stale_runs(tmpdir=None):
    """Unmount what crashed test runs left below pytest's temp roots.

    Only trees (marked by an owner.pid file) whose owner pytest process is
    gone are touched, so concurrent test runs on this machine are left
    alone.  Returns the mountpoints it unmounted.
    """
    import glob
    import tempfile

    done = []
    tmpdir = tmpdir or tempfile.gettempdir()
    for owner in glob.glob(os.path.join(tmpdir, "pytest-of-*", "pytest-*",
                                        "*", "*", "owner.pid")):
        root = os.path.dirname(owner)
        try:
            pid = int(Path(owner).read_text())
        except (OSError, ValueError):
            continue
        if pid_alive(pid):
            continue
        for m in mounts_under(root):
            done.append(m.mountpoint)
        unmount_all_under(root)
        kill_pids(processes_with_env("SBX_HOME", os.path.join(root, "state")))
    return done
