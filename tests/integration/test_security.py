"""Security and multi-user: isolation, the repository's git directory,
shared mounts, owners of new files, umask of commands.

    isolation (--isolate)   a command under bubblewrap has no capability,
                            no_new_privs, its own user namespace, and cannot
                            remount, mknod, write /proc/sys or the host's
                            files, signal or ptrace host processes, reach the
                            host's mounts, or nest user namespaces; run with
                            sbx as root and as an unprivileged user (setpriv)
    git directory           with isolation, the source repository's config,
                            hooks, info, refs and the worktree's pointers
                            are read-only; commits on sbx/NAME still work
    allow_other             --allow-other / mount.allow_other share the mount
                            with other users, default_permissions kept
    owners                  a file made through a shared mount by another
                            uid belongs to that uid (local and remote)
    umask                   commands run with the caller's umask

Tests that act as a second user need root (they use setpriv to uid 65534).
Escape probes run inside the sandbox as a Python script that tries each
system call and reports the errno; where it is safe, the same probe is first
shown to succeed without isolation, so a failure inside means isolation.
"""

import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from exec_util import have, path_with, run_bytes, shim, shim_dir
from testenv import SbxEnv, lstat_facts, mounts

NOBODY = 65534
GIT_ID = {"SBX_EXEC_ENV": "GIT_AUTHOR_NAME,GIT_AUTHOR_EMAIL,"
                          "GIT_COMMITTER_NAME GIT_COMMITTER_EMAIL"}

need_root = pytest.mark.skipif(os.geteuid() != 0,
                               reason="acts as a second user (needs root)")
need_bwrap = pytest.mark.skipif(not have("bwrap"),
                                reason="bubblewrap not installed")


def as_user(args, uid=NOBODY, cwd=None):
    """setpriv to `uid`; `cwd` is entered as that user (root may not
    enter another user's FUSE mount)."""
    pre = ["env", "-C", str(cwd)] if cwd is not None else []
    return ["setpriv", "--reuid", str(uid), "--regid", str(uid),
            "--clear-groups", *pre, *map(str, args)]


def run_as(args, uid=NOBODY, **kw):
    return subprocess.run(as_user(args, uid), capture_output=True, text=True,
                          timeout=kw.pop("timeout", 60), **kw)


def sx(sb, *args, cwd=None, **kw):
    return run_bytes(sb.env, [shim(sb.env), *args], cwd=cwd or sb.mnt, **kw)


@pytest.fixture
def shared_dir():
    """A directory every user can traverse (tmp_path is private to root),
    for mountpoints and plain-directory comparisons."""
    d = Path(tempfile.mkdtemp(prefix="sbx-sec-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    for m in mounts.mounts_under(d):
        mounts.lazy_unmount(m.mountpoint)
    shutil.rmtree(d, ignore_errors=True)


# -- escape probes ---------------------------------------------------------------

PROBE = r'''
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                        ctypes.c_void_p]
host_pid, target, hidden = int(sys.argv[1]), sys.argv[2], sys.argv[3]
which, sock_path = sys.argv[4].split(","), sys.argv[5]
MS_REMOUNT, MS_BIND = 32, 4096
res = {}

def name(e):
    return errno.errorcode.get(e, str(e))

def c(key, fn):
    if key not in which:
        return
    r = fn()
    res[key] = "ok" if r >= 0 else name(ctypes.get_errno())

def py(key, fn):
    if key not in which:
        return
    try:
        fn()
        res[key] = "ok"
    except OSError as e:
        res[key] = name(e.errno)

def write_host():
    with open(target, "w") as f:
        f.write("escaped\n")

def proc_sys():
    p = "/proc/sys/vm/swappiness"
    v = open(p).read()
    with open(p, "w") as f:
        f.write(v)

def ptrace():
    if libc.ptrace(16, host_pid, None, None) < 0:   # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), "ptrace")
    os.waitpid(host_pid, os.WUNTRACED | 0x40000000)   # __WALL
    libc.ptrace(17, host_pid, None, None)             # PTRACE_DETACH

def mknod():
    os.mknod("sbx-probe-null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.unlink("sbx-probe-null")

import stat
c("remount", lambda: libc.mount(b"none", b"/", None, MS_REMOUNT | MS_BIND,
                               None))
c("remount_proc_sys", lambda: libc.mount(None, b"/proc/sys", None,
                                         MS_REMOUNT | MS_BIND, None))
c("mount_tmpfs", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
py("write_host", write_host)
py("mknod", mknod)
py("proc_sys", proc_sys)
py("kill", lambda: os.kill(host_pid, 0))
py("ptrace", ptrace)
py("host_root", lambda: open(f"/proc/{host_pid}/root{target}.2", "w"))

def sysrq():
    with open("/proc/sysrq-trigger", "w") as f:
        f.write("h")          # help: harmless if it ever got through

def run_socket():
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sock_path)
    finally:
        s.close()

py("sysrq", sysrq)
py("run_socket", run_socket)
c("userns", lambda: libc.unshare(0x10000000))       # CLONE_NEWUSER
status = dict(l.split(":", 1) for l in open("/proc/self/status")
              if ":" in l)
for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh", "NoNewPrivs"):
    res[k] = status[k].strip()
res["uid"] = os.getuid()
res["gid"] = os.getgid()
res["hidden_visible"] = os.path.exists(hidden)
print(json.dumps(res))
'''

ALL_PROBES = ("remount", "remount_proc_sys", "mount_tmpfs", "write_host",
              "mknod", "proc_sys", "kill", "ptrace", "host_root", "userns",
              "sysrq", "run_socket")
# What may run without isolation: nothing that changes the host's mounts
# or pokes the kernel (sysrq).
SAFE_PROBES = ("write_host", "mknod", "proc_sys", "kill", "ptrace",
               "run_socket")


def probe(sb, host_pid, target, hidden, sock, which=ALL_PROBES, uid=None):
    args = [shim(sb.env), "/usr/bin/python3", "-c", PROBE, str(host_pid),
            str(target), str(hidden), ",".join(which), str(sock)]
    if uid is not None:
        r = run_bytes(sb.env, as_user(args, uid, cwd=sb.mnt), timeout=60)
    else:
        r = run_bytes(sb.env, args, cwd=sb.mnt, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def assert_confined(res, uid):
    """Every escape failed, with the errno that says why."""
    assert res["remount"] == "EPERM", res
    assert res["remount_proc_sys"] == "EPERM", res
    assert res["mount_tmpfs"] == "EPERM", res
    assert res["write_host"] == "EROFS", res
    assert res["mknod"] == "EPERM", res
    assert res["proc_sys"] in ("EROFS", "EACCES", "EPERM"), res
    # Host processes do not exist in the sandbox's pid namespace.
    assert res["kill"] == "ESRCH", res
    assert res["ptrace"] == "ESRCH", res
    assert res["host_root"] == "ENOENT", res
    # --disable-userns: ENOSPC (max_user_namespaces 0); EPERM elsewhere.
    assert res["userns"] in ("ENOSPC", "EPERM"), res
    # Read-only /proc: the kernel's knobs belong to root outside.
    assert res["sysrq"] in ("EROFS", "ENOENT", "EACCES"), res
    # A private /run: the system's and the session's sockets are gone.
    assert res["run_socket"] == "ENOENT", res
    for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"):
        assert int(res[k], 16) == 0, (k, res)
    assert res["NoNewPrivs"] == "1", res
    assert res["uid"] == uid and res["gid"] == uid, res
    assert res["hidden_visible"] is False, res


@pytest.fixture
def host_sleeper():
    """A host process the sandbox must not reach (same uid as sbx)."""
    p = subprocess.Popen(["sleep", "300"])
    yield p
    p.kill()
    p.wait()


@pytest.fixture
def run_socket():
    """A unix socket in /run that anyone may connect to (as D-Bus's,
    systemd's or a container engine's are)."""
    import socket
    path = f"/run/sbx-test-{uuid.uuid4().hex[:8]}.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    os.chmod(path, 0o777)
    s.listen(16)
    yield path
    s.close()
    os.unlink(path)


@pytest.fixture
def escape_target():
    t = Path("/var/tmp") / f"sbx-escape-{uuid.uuid4().hex[:8]}"
    yield t
    for p in (t, Path(str(t) + ".2")):
        if p.exists():
            p.unlink()


@need_root
def test_probes_work_without_isolation(sandbox, host_sleeper, escape_target,
                                       run_socket):
    """The probes are real: as root without isolation they succeed."""
    res = probe(sandbox, host_sleeper.pid, escape_target,
                sandbox.env.home / "run", run_socket, SAFE_PROBES)
    for k in SAFE_PROBES:
        assert res[k] == "ok", (k, res)
    assert escape_target.read_text() == "escaped\n"
    assert int(res["CapEff"], 16) != 0


@need_root
@need_bwrap
def test_isolation_as_root_confines(sbx_env, repo, host_sleeper,
                                    escape_target, run_socket):
    sb = sbx_env.up("iso", repo, "--isolate")
    res = probe(sb, host_sleeper.pid, escape_target, sbx_env.home / "run",
                run_socket)
    assert_confined(res, NOBODY)
    assert not escape_target.exists()
    assert not Path(str(escape_target) + ".2").exists()
    assert host_sleeper.poll() is None


@need_root
@need_bwrap
def test_isolated_root_writes_worktree_and_commits(sbx_env, repo):
    """The user namespace maps the worktree's owner (root) to the command's
    uid: make-like builds and git commit still work."""
    sb = sbx_env.up("iso", repo, "--isolate")
    build = ("set -e; mkdir -p build/obj; for i in 1 2 3; do "
             "echo $i > build/obj/$i.o; done; cat build/obj/*.o > build/app; "
             "chmod +x build/app; mv build/obj build/old; rm -r build/old; "
             "echo edit >> README.md; id -u")
    r = sx(sb, "sh", "-c", build)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{NOBODY}\n".encode()
    app = sb.worktree / "build" / "app"
    assert app.read_text() == "1\n2\n3\n"
    assert os.stat(app).st_uid == 0   # root outside
    assert (sb.mnt / "build" / "app").read_text() == "1\n2\n3\n"
    r = run_bytes(sbx_env, [shim(sbx_env), "sh", "-c",
                            "git add -A && git commit -qm built && "
                            "git log -1 --format=%s"],
                  cwd=sb.mnt, extra_env=GIT_ID)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"built\n"
    head = sbx_env.git("rev-parse", "sbx/iso", cwd=repo).out.strip()
    assert sbx_env.git("log", "-1", "--format=%s", head,
                       cwd=repo).out == "built\n"


@pytest.fixture
def var_env(build_dir):
    """An SbxEnv outside /tmp (which the sandbox replaces anyway), to see
    what of $SBX_HOME an isolated command sees."""
    root = Path(tempfile.mkdtemp(prefix="sbx-sec-", dir="/var/tmp"))
    env = SbxEnv(root, build_dir)
    yield env
    notes = env.cleanup()
    left = mounts.mounts_under(root)
    shutil.rmtree(root, ignore_errors=True)
    assert not left, f"mounts left behind: {left}; {notes}"


@need_bwrap
def test_isolation_hides_sbx_home(var_env):
    env = var_env
    repo = env.make_repo()
    other = env.up("other", repo)             # not isolated
    sb = env.up("iso", repo, "--isolate")
    sock = env.home / "run" / "other.sock"
    assert sock.exists()
    r = sx(sb, "sh", "-c", f'ls -A "{env.home}"; ls -A "{env.home}/worktrees";'
           f' test -e "{sock}" && echo SOCKET; ls "{repo}"')
    assert r.returncode == 0, r.stderr
    # Only this worktree (and the repository, read-only) are there.
    assert r.stdout.decode().split() == ["worktrees", "iso", "README.md",
                                         "docs", "src"], r.stdout


# -- the same as an unprivileged user ---------------------------------------------


class UserEnv(SbxEnv):
    """An SbxEnv whose commands run as `uid` (setpriv)."""

    def __init__(self, root, build_dir, uid):
        self.uid = uid
        super().__init__(root, build_dir)

    def run(self, args, **kw):
        return super().run(as_user(args, self.uid), **kw)

    def up(self, name, repo, *extra, wait=True):
        # Root may not stat another user's FUSE mount: wait as the user.
        sb = super().up(name, repo, *extra, wait=False)
        for _ in range(500):
            if mounts.is_mounted(sb.mnt) and \
                    run_as(["stat", sb.mnt], self.uid).returncode == 0:
                return sb
            time.sleep(0.02)
        raise AssertionError(f"{sb.mnt} not mounted\n{self.log_tail(name)}")


@pytest.fixture
def user_env(build_dir):
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    root = Path(tempfile.mkdtemp(prefix="sbx-sec-user-", dir="/tmp"))
    root.chmod(0o755)
    fuse_mode = os.stat("/dev/fuse").st_mode
    if run_as(["test", "-r", "/dev/fuse", "-a", "-w", "/dev/fuse"]
              ).returncode != 0:
        # Distributions make it 0666 (udev); this machine did not.
        os.chmod("/dev/fuse", 0o666)
    env = UserEnv(root / "env", build_dir, NOBODY)
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(root)],
                   check=True)
    if run_as(["bwrap", "--unshare-user", "--ro-bind", "/", "/", "true"]
              ).returncode != 0:
        pytest.skip("unprivileged user namespaces are not available")
    yield env
    notes = env.cleanup()
    os.chmod("/dev/fuse", stat.S_IMODE(fuse_mode))
    left = mounts.mounts_under(root)
    shutil.rmtree(root, ignore_errors=True)
    assert not left, f"mounts left behind: {left}; {notes}"


def user_repo(env):
    repo = env.root / "repo"
    env.git("init", "-q", "-b", "main", str(repo))
    env.run(["sh", "-c", "echo '# sample' > README.md && git add -A && "
             "git commit -qm initial"], cwd=repo, check=True)
    return repo


@need_bwrap
def test_isolation_as_user_confines(user_env, escape_target, run_socket):
    env = user_env
    repo = user_repo(env)
    sb = env.up("iso", repo, "--isolate")
    sleeper = subprocess.Popen(as_user(["sleep", "300"]))
    try:
        res = probe(sb, sleeper.pid, escape_target, env.home / "run",
                    run_socket, uid=NOBODY)
        assert_confined(res, NOBODY)
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not escape_target.exists()
    r = run_bytes(env, as_user([shim(env), "sh", "-c",
                                "echo x > f && git add f && "
                                "git commit -qm user && git log -1 "
                                "--format=%s"], cwd=sb.mnt),
                  extra_env=GIT_ID)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"user\n"


# -- the repository's git directory (item 2) ------------------------------------


@need_bwrap
def test_isolated_sandbox_cannot_change_repository_config(sbx_env, repo):
    sb = sbx_env.up("g", repo, "--isolate")
    gitdir = repo / ".git"
    priv = gitdir / "worktrees" / "sbx-g"
    marker = sbx_env.root / "fsmonitor-ran"
    hooks_before = sorted(p.name for p in (gitdir / "hooks").iterdir())
    config_before = (gitdir / "config").read_text()
    main_before = sbx_env.git("rev-parse", "main", cwd=repo).out
    evil = f"touch {marker}; false"
    attempts = {
        "git config": ["git", "config", "core.fsmonitor", evil],
        "config": ["sh", "-c", f"printf '[core]\\n\\tfsmonitor = {evil}\\n'"
                   f" >> {gitdir}/config"],
        "hook": ["sh", "-c", f"printf '#!/bin/sh\\n{evil}\\n' > "
                 f"{gitdir}/hooks/post-checkout"],
        "info": ["sh", "-c", f"echo '* filter=evil' >> "
                 f"{gitdir}/info/attributes"],
        "main branch": ["git", "update-ref", "refs/heads/main", "HEAD~0^{}"],
        "new branch": ["git", "branch", "evil"],
        "commondir": ["sh", "-c", f"echo /tmp > {priv}/commondir"],
        "config.worktree": ["sh", "-c", f"echo '[core]' > "
                            f"{priv}/config.worktree"],
        "alternates": ["sh", "-c", f"echo /tmp > "
                       f"{gitdir}/objects/info/alternates"],
        "dotgit": ["sh", "-c", "echo 'gitdir: /tmp/x' > .git"],
        "dotgit rename": ["sh", "-c", "mv .git .git.old"],
    }
    for what, args in attempts.items():
        r = sx(sb, *args)
        assert r.returncode != 0, (what, r.stdout, r.stderr)
    assert (gitdir / "config").read_text() == config_before
    assert sorted(p.name for p in (gitdir / "hooks").iterdir()) == \
        hooks_before
    assert not (gitdir / "info" / "attributes").exists() or \
        "evil" not in (gitdir / "info" / "attributes").read_text()
    assert sbx_env.git("rev-parse", "main", cwd=repo).out == main_before
    assert sbx_env.git("branch", "--list", "evil", cwd=repo).out == ""
    assert (priv / "commondir").read_text().strip() != "/tmp"
    assert (sb.worktree / ".git").read_text().startswith("gitdir: ")
    # The user's own git runs nothing of the sandbox's.
    sbx_env.git("status", cwd=repo)
    sbx_env.git("status", cwd=sb.mnt)
    assert not marker.exists()
    # What its own commits need still works: objects, sbx/g, its gitdir.
    (sb.mnt / "new.txt").write_text("new\n")
    r = run_bytes(sbx_env, [shim(sbx_env), "sh", "-c",
                            "git add new.txt && git commit -qm mine"],
                  cwd=sb.mnt, extra_env=GIT_ID)
    assert r.returncode == 0, r.stderr
    assert sbx_env.git("log", "-1", "--format=%s", "sbx/g",
                       cwd=repo).out == "mine\n"
    sbx_env.git("fsck", "--no-dangling", cwd=repo)


# -- umask of commands (item 9) -----------------------------------------------


def mode_of(p):
    return stat.S_IMODE(os.lstat(p).st_mode)


@pytest.mark.parametrize("isolate", [False, True], ids=["plain", "isolated"])
def test_commands_get_the_callers_umask(sbx_env, repo, isolate):
    if isolate and not have("bwrap"):
        pytest.skip("bubblewrap not installed")
    sb = sbx_env.up("um", repo, *(["--isolate"] if isolate else []))
    script = "umask; touch f$U; mkdir d$U"
    old = os.umask(0o027)
    try:
        r = run_bytes(sbx_env, [shim(sbx_env), "sh", "-c", script],
                      cwd=sb.mnt, extra_env={"SBX_EXEC_ENV": "U", "U": "1"})
        os.umask(0o077)
        r2 = run_bytes(sbx_env, [sbx_env.bin("sbx"), "exec", "um", "-e",
                                 "U=2", "--", "sh", "-c", script],
                       cwd=sbx_env.root)
        os.umask(0o002)
        r3 = run_bytes(sbx_env, [shim(sbx_env), "sh", "-c", script],
                       cwd=sb.mnt, extra_env={"SBX_EXEC_ENV": "U", "U": "3",
                                              "SBX_EXEC_FRAMED": "1"})
    finally:
        os.umask(old)
    assert (r.returncode, r.stdout) == (0, b"0027\n"), r.stderr
    assert (r2.returncode, r2.stdout) == (0, b"0077\n"), r2.stderr
    assert (r3.returncode, r3.stdout) == (0, b"0002\n"), r3.stderr
    wt = sb.worktree
    assert (mode_of(wt / "f1"), mode_of(wt / "d1")) == (0o640, 0o750)
    assert (mode_of(wt / "f2"), mode_of(wt / "d2")) == (0o600, 0o700)
    assert (mode_of(wt / "f3"), mode_of(wt / "d3")) == (0o664, 0o775)


@pytest.mark.providers("remote")
@pytest.mark.remote_only("checks the agent's exec")
def test_remote_commands_get_the_callers_umask(sandbox):
    old = os.umask(0o027)
    try:
        r = sx(sandbox, "sh", "-c", "umask; touch f; mkdir d")
    finally:
        os.umask(old)
    assert (r.returncode, r.stdout) == (0, b"0027\n"), r.stderr
    root = sandbox.agent.root
    assert (mode_of(root / "f"), mode_of(root / "d")) == (0o640, 0o750)


# -- shared mounts (item 7) ---------------------------------------------------------


def mount_opts(mnt):
    for m in mounts.mounts_at(mnt):
        return m
    return None


def mountinfo_opts(mnt):
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if parts[4] == str(mnt):
                sep = parts.index("-")
                return set(parts[5].split(",")) | \
                    set(parts[sep + 3].split(","))
    return set()


@need_root
def test_allow_other_shares_the_mount(sbx_env, repo, shared_dir):
    priv = sbx_env.up("p", repo, "--mount", shared_dir / "p")
    opts = mountinfo_opts(priv.mnt)
    assert "default_permissions" in opts and "allow_other" not in opts
    r = run_as(["ls", priv.mnt])
    assert r.returncode != 0 and "Permission denied" in r.stderr, r

    sb = sbx_env.up("s", repo, "--allow-other", "--mount", shared_dir / "s")
    opts = mountinfo_opts(sb.mnt)
    assert {"default_permissions", "allow_other"} <= opts, opts
    r = run_as(["cat", sb.mnt / "README.md"])
    assert (r.returncode, r.stdout) == (0, "# sample\n"), r
    # default_permissions: the kernel still checks the modes.
    r = run_as(["sh", "-c", f"echo x >> {sb.mnt}/README.md"])
    assert r.returncode != 0 and "Permission denied" in r.stderr, r
    r = run_as(["touch", sb.mnt / "new"])
    assert r.returncode != 0 and "Permission denied" in r.stderr, r

    # Remembered by the session; --no-allow-other turns it off.
    sbx_env.sbx_ok("umount", "s")
    assert sbx_env.sbx_ok("mount", "s").out.strip() == str(sb.mnt)
    sb.wait_mounted()
    assert "allow_other" in mountinfo_opts(sb.mnt)
    sbx_env.sbx_ok("umount", "s")
    sbx_env.sbx_ok("mount", "s", "--no-allow-other")
    sb.wait_mounted()
    assert "allow_other" not in mountinfo_opts(sb.mnt)
    sbx_env.sbx_ok("umount", "s")
    sbx_env.sbx_ok("mount", "s", "--allow-other")
    sb.wait_mounted()
    assert "allow_other" in mountinfo_opts(sb.mnt)


@need_root
def test_allow_other_from_configuration(sbx_env, repo, shared_dir):
    cfg = sbx_env.root / "config.json"
    cfg.write_text('{"mount": {"allow_other": "yes"}}\n')
    r = sbx_env.sbx("up", "c", "--repo", repo)
    assert r.rc == 5, str(r)
    assert '"allow_other" must be' in r.err or "allow_other" in r.err, r.err
    cfg.write_text('{"mount": {"allow_other": true}}\n')
    sb = sbx_env.up("c", repo, "--mount", shared_dir / "c")
    assert "allow_other" in mountinfo_opts(sb.mnt)
    r = run_as(["cat", sb.mnt / "README.md"])
    assert r.returncode == 0, r


# -- owners of new files (item 8) -------------------------------------------------


OWNER_SCRIPT = r'''
set -e
cd "$1"
umask 027
touch f
mkdir d
ln -s f l
mkfifo p
chmod 600 f
touch -d "2001-02-03 04:05:06" f
mkdir sg/sub
touch sg/f
umask 0
touch g
mkdir e
'''

OWNER_NAMES = ("f", "d", "l", "p", "sg/sub", "sg/f", "g", "e")


def owner_scenario(d):
    """Prepare `d` as root (a 0777 directory and a set-group-ID one of
    group 100), then create things in it as uid 65534."""
    d.mkdir(mode=0o777)
    d.chmod(0o777)
    (d / "sg").mkdir()
    os.chown(d / "sg", 0, 100)
    (d / "sg").chmod(0o2777)
    r = run_as(["sh", "-c", OWNER_SCRIPT, "sh", d])
    assert r.returncode == 0, r.stderr
    facts = {n: lstat_facts(d / n) for n in OWNER_NAMES}
    for n in ("l",):
        facts[n].pop("size", None)
    facts["f.mtime"] = int(os.lstat(d / "f").st_mtime)
    return facts


@need_root
@pytest.mark.providers("local", "remote")
@pytest.mark.remote_only("the agent must run as root on this machine")
def test_new_files_belong_to_the_caller(request, provider, sbx_env, repo,
                                        shared_dir):
    if provider == "local":
        sb = sbx_env.up("o", repo, "--allow-other", "--mount",
                        shared_dir / "o")
    else:
        from testenv.agent import up_remote
        agent = request.getfixturevalue("agent")
        sb = up_remote(sbx_env, "o", agent, None, "--allow-other", "--mount",
                       shared_dir / "o", repo=repo)
    try:
        plain = owner_scenario(shared_dir / "plain")
        mine = owner_scenario(sb.mnt / "od")
        for n in ("f", "d", "p", "g", "e"):
            assert (plain[n]["uid"], plain[n]["gid"]) == (NOBODY, NOBODY)
        assert plain["sg/f"]["gid"] == 100
        assert mine == plain
    finally:
        if provider != "local":
            sbx_env.sbx("down", "o", "--force", timeout=60)
