"""Session lifecycle through the `sbx` command, and every bad input.

Exit codes (docs/cli.md): 0 ok, 1 failure, 2 usage, 3 not found,
4 refused, 5 config, 6 create.  A bad input must give a non-zero exit, a
message saying what failed and what to do, and change nothing.
"""

import datetime
import errno
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from testenv import (is_mounted, mounts_at, mounts_under, pid_alive,
                     sbx_mount_at, stat_errno, wait_for_mount,
                     wait_for_unmount)

EXIT_FAIL, EXIT_USAGE, EXIT_NOTFOUND, EXIT_REFUSED, EXIT_CONFIG, \
    EXIT_CREATE = 1, 2, 3, 4, 5, 6

STATUS_KEYS = {"session", "provider", "sandbox_id", "state", "remote",
               "mountpoint", "workdir", "created_at", "isolation", "mounted",
               "pid"}


# -- helpers ----------------------------------------------------------------


def branches(env, repo):
    r = env.git("for-each-ref", "--format=%(refname)", cwd=repo)
    return sorted(r.out.split())


def world(env, repo, *dirs):
    """Everything a failed command must leave as it was."""
    files = []
    if env.home.exists():
        for root, ds, fs in os.walk(env.home):
            for n in fs:
                if not n.endswith(".lock"):  # lock files are harmless
                    files.append(os.path.relpath(os.path.join(root, n),
                                                 env.home))
    wt = env.home / "worktrees"
    return {
        "state files": sorted(files),
        "worktrees": sorted(os.listdir(wt)) if wt.exists() else [],
        "refs": branches(env, repo) if repo else None,
        "git worktrees": env.git("worktree", "list", "--porcelain",
                                 cwd=repo).out if repo else None,
        "mounts": sorted(m.mountpoint for m in mounts_under(env.root)),
        "mount root": sorted(os.listdir(env.mount_root)),
        "dirs": {str(d): sorted(os.listdir(d)) if os.path.isdir(d) else None
                 for d in dirs},
    }


def assert_refused(r, code=None, mentions=()):
    """Non-zero exit, a message on stderr naming what is wrong."""
    assert r.rc != 0, f"expected failure:\n{r}"
    if code is not None:
        assert r.rc == code, f"exit {r.rc}, want {code}:\n{r}"
    msg = r.err.strip()
    assert msg, f"no error message:\n{r}"
    assert "Traceback" not in msg and "Segmentation" not in msg
    for m in mentions:
        assert m.lower() in msg.lower(), f"message does not mention {m!r}:\n{r}"


def refused_unchanged(env, repo, args, code=None, mentions=(), dirs=()):
    """`sbx ARGS` is refused (assert_refused) and leaves the world of repo
    and `dirs` as it was; returns the run."""
    before = world(env, repo, *dirs)
    r = env.sbx(*args)
    assert_refused(r, code, mentions)
    assert world(env, repo, *dirs) == before
    return r


def parse_time(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))


def ls_json(env):
    data = env.sbx_ok("ls", "--json").json()
    if isinstance(data, dict):
        data = data.get("sessions", [])
    return {s["session"]: s for s in data}


# -- up, ls, status ---------------------------------------------------------------


def test_up_prints_mountpoint_and_mounts(sbx_env, repo):
    r = sbx_env.sbx_ok("up", "s1", "--repo", repo)
    mnt = sbx_env.mount_root / "s1"
    assert r.out.strip() == str(mnt)
    wait_for_mount(mnt)
    m = sbx_mount_at(mnt)
    assert m is not None, mounts_at(mnt)
    assert m.fstype == "fuse.sbx" and m.source == "sbx:s1", m
    assert (mnt / "README.md").read_text() == "# sample\n"
    wt = sbx_env.worktree("s1")
    assert (wt / "README.md").read_text() == "# sample\n"
    assert "refs/heads/sbx/s1" in branches(sbx_env, repo)
    head = sbx_env.git("rev-parse", "HEAD", cwd=repo).out
    assert sbx_env.git("rev-parse", "sbx/s1", cwd=repo).out == head
    # state file 0600, directories 0700
    st = os.stat(sbx_env.state_file("s1"))
    assert st.st_mode & 0o777 == 0o600
    assert os.stat(sbx_env.home).st_mode & 0o777 == 0o700
    # the source checkout is untouched
    assert sbx_env.git("status", "--porcelain", cwd=repo).out == ""
    assert sbx_env.git("branch", "--show-current", cwd=repo).out.strip() == "main"


def test_up_json_shape(sbx_env, repo):
    r = sbx_env.sbx_ok("up", "js", "--repo", repo, "--json")
    s = r.json()
    assert STATUS_KEYS <= set(s), f"missing: {STATUS_KEYS - set(s)}"
    assert s["session"] == "js"
    assert s["provider"] == "local"
    assert s["state"] == "ready"
    assert s["remote"] is False
    assert s["mounted"] is True
    assert s["mountpoint"] == str(sbx_env.mount_root / "js")
    assert os.path.samefile(s["workdir"], sbx_env.worktree("js"))
    assert isinstance(s["sandbox_id"], str) and s["sandbox_id"]
    assert pid_alive(s["pid"])
    t = parse_time(s["created_at"])
    now = datetime.datetime.now(datetime.timezone.utc)
    assert abs((now - t).total_seconds()) < 300
    assert s.get("error") in (None, {}), s
    assert isinstance(s["isolation"], str)
    # status --json reports the same object
    s2 = sbx_env.status("js")
    for k in STATUS_KEYS:
        assert s2[k] == s[k], k


def test_up_is_idempotent(sbx_env, repo):
    s1 = sbx_env.sbx_ok("up", "idem", "--repo", repo, "--json").json()
    (sbx_env.mount_root / "idem" / "work.txt").write_text("keep me")
    r = sbx_env.sbx_ok("up", "idem", "--repo", repo)
    assert r.out.strip() == s1["mountpoint"]
    s2 = sbx_env.status("idem")
    assert s2["pid"] == s1["pid"], "a second daemon was started"
    assert s2["sandbox_id"] == s1["sandbox_id"]
    assert s2["created_at"] == s1["created_at"]
    assert len(mounts_at(s1["mountpoint"])) == 1
    assert (Path(s1["mountpoint"]) / "work.txt").read_text() == "keep me"
    # `up NAME` alone finds the existing session too
    r = sbx_env.sbx_ok("up", "idem")
    assert r.out.strip() == s1["mountpoint"]


def test_up_concurrent_same_name(sbx_env, repo):
    procs = [subprocess.Popen([sbx_env.bin("sbx"), "up", "race", "--repo",
                               repo], env=sbx_env.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.strip() == str(sbx_env.mount_root / "race")
    assert len(mounts_at(sbx_env.mount_root / "race")) == 1
    assert sbx_env.session_names() == ["race"]
    assert branches(sbx_env, repo).count("refs/heads/sbx/race") == 1


def test_up_with_ref_and_mount_dir(sbx_env, repo):
    first = sbx_env.git("rev-parse", "HEAD", cwd=repo).out.strip()
    (repo / "later.txt").write_text("later")
    sbx_env.git("add", "later.txt", cwd=repo)
    sbx_env.git("commit", "-qm", "later", cwd=repo)
    mnt = sbx_env.root / "custom-mnt"
    mnt.mkdir()
    r = sbx_env.sbx_ok("up", "old", "--repo", repo, "--ref", first,
                       "--mount", mnt)
    assert r.out.strip() == str(mnt)
    wait_for_mount(mnt)
    assert not (mnt / "later.txt").exists()
    assert sbx_env.git("rev-parse", "sbx/old", cwd=repo).out.strip() == first
    # default ref: HEAD of the repository
    sb = sbx_env.up("new", repo)
    assert (sb.mnt / "later.txt").read_text() == "later"


def test_up_default_repo_is_cwd(sbx_env, repo):
    (repo / "sub").mkdir()
    r = sbx_env.sbx("up", "cwd", cwd=repo / "sub")
    assert r.rc == 0, str(r)
    mnt = Path(r.out.strip())
    wait_for_mount(mnt)
    assert (mnt / "README.md").exists()
    assert "refs/heads/sbx/cwd" in branches(sbx_env, repo)


def test_up_without_name(sbx_env, repo):
    r = sbx_env.sbx("up", cwd=repo)
    assert r.rc == 0, str(r)
    names = sbx_env.session_names()
    assert len(names) == 1 and names[0].startswith("repo-"), names
    assert names[0] in r.err, "the generated name is printed to stderr"
    mnt = Path(r.out.strip())
    wait_for_mount(mnt)
    assert mnt == sbx_env.mount_root / names[0]


def test_ls_and_status(sbx_env, repo):
    a = sbx_env.up("alpha", repo)
    sbx_env.up("beta", repo)
    sessions = ls_json(sbx_env)
    assert set(sessions) == {"alpha", "beta"}
    for name, s in sessions.items():
        assert s["mounted"] is True and s["state"] == "ready"
        assert s["mountpoint"] == str(sbx_env.mount_root / name)
    r = sbx_env.sbx_ok("ls")
    assert "alpha" in r.out and "beta" in r.out
    r = sbx_env.sbx_ok("status", "alpha")
    assert "alpha" in r.out and str(a.mnt) in r.out
    # empty list after both are down
    sbx_env.sbx_ok("down", "alpha")
    sbx_env.sbx_ok("down", "beta")
    assert ls_json(sbx_env) == {}


def test_version_and_help(sbx_env):
    r = sbx_env.sbx_ok("--version")
    assert "0." in r.out or "1." in r.out
    r = sbx_env.sbx_ok("help")
    for cmd in ("up", "down", "ls", "status", "mount", "umount", "snapshot",
                "snapshots", "restore"):
        assert cmd in r.out, cmd
    r = sbx_env.sbx_ok("help", "up")
    assert "--carry-changes" in r.out and "--mount" in r.out
    assert_refused(sbx_env.sbx("frobnicate"), EXIT_USAGE, ["frobnicate"])
    assert_refused(sbx_env.sbx("up", "--no-such-option"), EXIT_USAGE)


# -- umount, mount, crashes ----------------------------------------------------------


def test_umount_and_mount_reattach(sbx_env, repo):
    sb = sbx_env.up("re", repo)
    (sb.mnt / "data.txt").write_text("survives umount")
    pid = sb.daemon_pid()
    sbx_env.sbx_ok("umount", "re")
    assert not is_mounted(sb.mnt)
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid), "daemon still running after umount"
    s = sb.status()
    assert s["mounted"] is False
    assert (sb.worktree / "data.txt").read_text() == "survives umount"
    assert sbx_env.sbx("umount", "re").rc in (0, EXIT_FAIL, EXIT_REFUSED)

    sbx_env.sbx_ok("mount", "re")
    wait_for_mount(sb.mnt)
    assert (sb.mnt / "data.txt").read_text() == "survives umount"
    assert sb.status()["mounted"] is True

    # re-attach somewhere else
    sbx_env.sbx_ok("umount", "re")
    other = sbx_env.root / "elsewhere"
    other.mkdir()
    sbx_env.sbx_ok("mount", "re", other)
    wait_for_mount(other)
    assert (other / "data.txt").read_text() == "survives umount"
    assert sb.status()["mountpoint"] == str(other)
    sbx_env.sbx_ok("umount", "re")
    assert not is_mounted(other)


def test_umount_busy_refused_then_force(sbx_env, repo):
    sb = sbx_env.up("busy", repo)
    p = subprocess.Popen(["sleep", "60"], cwd=sb.mnt)
    try:
        r = sbx_env.sbx("umount", "busy")
        assert_refused(r, EXIT_REFUSED, ["--force"])
        assert is_mounted(sb.mnt) and sb.status()["mounted"] is True
        sbx_env.sbx_ok("umount", "busy", "--force")
        assert not is_mounted(sb.mnt)
    finally:
        p.kill()
        p.wait()
    sbx_env.sbx_ok("mount", "busy")
    wait_for_mount(sb.mnt)



@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
def test_umount_force_healthy_daemon_exits(sbx_env, repo, busy):
    """`sbx umount --force` of a healthy session: the daemon exits by
    itself right after the (lazy) unmount, also while a process still has
    its working directory in the detached mount, so the CLI never has to
    say it "did not exit after unmount" and kill it."""
    sb = sbx_env.up("hf", repo)
    pid = sb.daemon_pid()
    p = subprocess.Popen(["sleep", "60"], cwd=sb.mnt) if busy else None
    try:
        t0 = time.monotonic()
        r = sbx_env.sbx_ok("umount", "hf", "--force")
        took = time.monotonic() - t0
        assert "did not exit" not in r.err, r
        assert "terminating" not in r.err, r
        assert took < 4, f"umount --force took {took:.1f} s"
        assert not pid_alive(pid)
        assert not is_mounted(sb.mnt)
    finally:
        if p is not None:
            p.kill()
            p.wait()
    log = sb.log.read_text()
    assert "FUSE loop ended" not in log and "failed to unmount" not in log, log
    sbx_env.sbx_ok("mount", "hf")
    wait_for_mount(sb.mnt)
    assert (sb.mnt / "README.md").read_text() == "# sample\n"

def test_mount_foreground(sbx_env, repo):
    sb = sbx_env.up("fg", repo)
    sbx_env.sbx_ok("umount", "fg")
    p = subprocess.Popen([sbx_env.bin("sbx"), "mount", "fg", "-f"],
                         env=sbx_env.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        wait_for_mount(sb.mnt, proc=p, log=sb.log)
        assert (sb.mnt / "README.md").exists()
        assert sb.status()["pid"] == p.pid
        sbx_env.sbx_ok("umount", "fg")
        assert p.wait(timeout=15) == 0
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=15)
    # SIGTERM also ends a foreground daemon cleanly
    p = subprocess.Popen([sbx_env.bin("sbx"), "mount", "fg", "-f"],
                         env=sbx_env.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    wait_for_mount(sb.mnt, proc=p, log=sb.log)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=15) == 0
    assert wait_for_unmount(sb.mnt, 5)


def test_kill9_then_mount_keeps_fsynced_data(sbx_env, repo):
    sb = sbx_env.up("crash", repo)
    want = {}
    for i in range(20):
        data = os.urandom(1000 + i * 4096)
        p = sb.mnt / f"f{i:02d}.bin"
        fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        want[p.name] = data
    big = os.urandom(16 << 20)
    with open(sb.mnt / "big.bin", "wb") as fh:
        fh.write(big)
        fh.flush()
        os.fsync(fh.fileno())
    want["big.bin"] = big
    with open(sb.mnt / "README.md", "r+b") as fh:  # overwrite a tracked file
        fh.write(b"# CHANGED")  # as long as "# sample\n"
        os.fsync(fh.fileno())
    want["README.md"] = b"# CHANGED"
    # the last write is fsynced while the file is still open
    fd = os.open(sb.mnt / "open.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"open at crash")
    os.fsync(fd)
    want["open.bin"] = b"open at crash"

    sb.kill_daemon(signal.SIGKILL)
    os.close(fd)  # ENOTCONN territory; the data was already fsynced
    # ENOTCONN / ECONNABORTED from the dead connection, or already gone
    assert stat_errno(sb.mnt) in (0, errno.ENOTCONN, errno.ECONNABORTED)
    s = sb.status()
    assert s["mounted"] is False or s["state"] == "error", s

    r = sbx_env.sbx("mount", "crash")
    assert r.rc == 0, f"{r}\n{sb.env.log_tail('crash')}"
    wait_for_mount(sb.mnt, log=sb.log)
    for name, data in want.items():
        assert (sb.mnt / name).read_bytes() == data, name
        assert (sb.worktree / name).read_bytes() == data, name
    assert sb.status()["mounted"] is True
    assert len(mounts_at(sb.mnt)) == 1


def test_dead_daemon_is_reported(sbx_env, repo):
    sb = sbx_env.up("dead", repo)
    sb.kill_daemon(signal.SIGKILL)
    s = sb.status()
    assert s["mounted"] is False or s["state"] == "error", s
    err = s.get("error") or {}
    r = sbx_env.sbx("status", "dead")
    text = r.out + r.err
    assert "sbx mount" in text or "sbx mount" in (err.get("message") or ""), \
        f"status does not say what to do:\n{r}\n{s}"
    # the list still shows the session
    assert "dead" in ls_json(sbx_env)
    # umount of a dead mount cleans the stale mount point
    r = sbx_env.sbx("umount", "dead")
    assert r.rc == 0, str(r)
    assert not is_mounted(sb.mnt)
    assert stat_errno(sb.mnt) == 0



def test_stuck_daemon_is_reported(sbx_env, repo):
    """A daemon that does not answer (stopped or stuck) shows as state
    error within a few seconds, with what to do; the advice works."""
    sb = sbx_env.up("stuck", repo)
    pid = sb.daemon_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = sbx_env.sbx("status", "stuck", "--json", timeout=30)
        took = time.monotonic() - t0
        assert r.rc == 0, str(r)
        assert took < 5.5, f"sbx status took {took:.1f} s"
        s = r.json()
        assert s["state"] == "error", s
        msg = s["error"]["message"]
        for want in ("does not answer", "sbx umount --force stuck",
                     "sbx mount stuck"):
            assert want in msg, s
        r = sbx_env.sbx("status", "stuck", timeout=30)
        assert r.rc == 0 and "does not answer" in r.out, str(r)
    finally:
        os.kill(pid, signal.SIGCONT)
    s = sb.status()
    assert s["state"] == "ready" and "error" not in s, s
    assert (sb.mnt / "README.md").read_text() == "# sample\n"

    # the advice: umount --force, then mount
    os.kill(pid, signal.SIGSTOP)
    try:
        r = sbx_env.sbx("umount", "--force", "stuck", timeout=60)
        assert r.rc == 0, str(r)
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGCONT)
    assert not pid_alive(pid)
    sbx_env.sbx_ok("mount", "stuck")
    wait_for_mount(sb.mnt, log=sb.log)
    assert (sb.mnt / "README.md").read_text() == "# sample\n"
    assert sb.status()["state"] == "ready"

def test_up_after_dead_daemon_reattaches(sbx_env, repo):
    sb = sbx_env.up("revive", repo)
    (sb.mnt / "x").write_text("x")
    sb.kill_daemon(signal.SIGKILL)
    r = sbx_env.sbx("up", "revive")
    assert r.rc == 0, str(r)
    wait_for_mount(sb.mnt, log=sb.log)
    assert (sb.mnt / "x").read_text() == "x"
    assert len(mounts_at(sb.mnt)) == 1


def test_daemon_sigterm_unmounts(sbx_env, repo):
    sb = sbx_env.up("term", repo)
    sb.kill_daemon(signal.SIGTERM)
    assert wait_for_unmount(sb.mnt, 5), "SIGTERM left the mount behind"


# -- snapshots ---------------------------------------------------------------------------


def snapshots(env, name):
    return env.sbx_ok("snapshots", name, "--json").json()


def test_snapshot_and_restore(sbx_env, repo):
    sb = sbx_env.up("snap", repo)
    m, w = sb.mnt, sb.worktree
    (m / "README.md").write_text("# at snapshot\n")
    (m / "untracked.txt").write_text("untracked at snapshot\n")
    (m / "staged.txt").write_text("staged\n")
    sbx_env.git("add", "staged.txt", cwd=w)
    (m / "junk.o").write_text("ignored")
    head = sbx_env.git("rev-parse", "HEAD", cwd=w).out
    status = sbx_env.git("status", "--porcelain", cwd=w).out

    r = sbx_env.sbx_ok("snapshot", "snap", "-m", "first snapshot")
    sid = r.out.strip().splitlines()[-1]
    assert sid
    # nothing moved: HEAD, branch, index, working files
    assert sbx_env.git("rev-parse", "HEAD", cwd=w).out == head
    assert sbx_env.git("status", "--porcelain", cwd=w).out == status
    refs = [x for x in branches(sbx_env, repo)
            if x.startswith("refs/sbx/snapshots/snap/")]
    assert len(refs) == 1, branches(sbx_env, repo)
    snaps = snapshots(sbx_env, "snap")
    assert [s["message"] for s in snaps] == ["first snapshot"]
    assert snaps[0]["id"] == sid or sid in snaps[0]["id"] or \
        snaps[0]["id"] in sid
    r = sbx_env.sbx_ok("snapshots", "snap")
    assert "first snapshot" in r.out
    # the snapshot commit holds the whole state, ignored files excluded
    tree = sbx_env.git("ls-tree", "-r", "--name-only", refs[0],
                       cwd=repo).out.split()
    assert {"README.md", "untracked.txt", "staged.txt"} <= set(tree)
    assert "junk.o" not in tree

    # change everything, then restore
    (m / "README.md").write_text("# after\n")
    os.unlink(m / "untracked.txt")
    (m / "later.txt").write_text("created after the snapshot\n")
    r = sbx_env.sbx_ok("restore", "snap", sid)
    saved = r.out.strip()
    for p in (m, w):  # the mount shows it too (within the visibility rule)
        deadline = time.monotonic() + 1.0
        while (p / "README.md").read_text() != "# at snapshot\n" and \
                time.monotonic() < deadline:
            time.sleep(0.02)
        assert (p / "README.md").read_text() == "# at snapshot\n"
        assert (p / "untracked.txt").read_text() == "untracked at snapshot\n"
        assert (p / "staged.txt").read_text() == "staged\n"
        assert not (p / "later.txt").exists()
    assert sbx_env.git("rev-parse", "HEAD", cwd=w).out == head

    # the pre-restore state was saved: restoring it brings "later" back
    snaps = snapshots(sbx_env, "snap")
    assert len(snaps) == 2, snaps
    other = [s["id"] for s in snaps if s["id"] != sid and sid not in s["id"]]
    assert other, snaps
    if saved:
        assert saved in other[0] or other[0] in saved
    sbx_env.sbx_ok("restore", "snap", other[0])
    assert (w / "later.txt").read_text() == "created after the snapshot\n"
    assert (w / "README.md").read_text() == "# after\n"
    assert not (w / "untracked.txt").exists()


def test_restore_unknown_snapshot(sbx_env, repo):
    sb = sbx_env.up("rs", repo)
    (sb.mnt / "keep.txt").write_text("keep")
    before = world(sbx_env, repo, sb.worktree)
    r = sbx_env.sbx("restore", "rs", "no-such-snapshot")
    assert_refused(r, EXIT_NOTFOUND, ["no-such-snapshot"])
    after = world(sbx_env, repo, sb.worktree)
    assert after == before
    assert (sb.mnt / "keep.txt").read_text() == "keep"


# -- down ---------------------------------------------------------------------------------


def test_down_clean(sbx_env, repo):
    sb = sbx_env.up("bye", repo)
    sbx_env.git("commit", "--allow-empty", "-qm", "agent work", cwd=sb.mnt)
    pid = sb.daemon_pid()
    sbx_env.sbx_ok("down", "bye")
    assert not is_mounted(sb.mnt)
    assert not sb.worktree.exists()
    assert not sbx_env.state_file("bye").exists()
    assert not pid_alive(pid)
    # the branch is kept, with the agent's commit
    r = sbx_env.git("log", "--format=%s", "-1", "sbx/bye", cwd=repo)
    assert r.out.strip() == "agent work"
    assert "bye" not in sbx_env.git("worktree", "list", cwd=repo).out
    assert not sb.mnt.exists(), "the mountpoint sbx created is left behind"
    # a second down says the session is gone (docs/cli.md: exit 3)
    refused_unchanged(sbx_env, repo, ["down", "bye"], EXIT_NOTFOUND, ["bye"])


def test_down_dirty_refuses_then_force(sbx_env, repo):
    sb = sbx_env.up("dirty", repo)
    (sb.mnt / "README.md").write_text("uncommitted\n")
    (sb.mnt / "new.txt").write_text("untracked\n")
    before = world(sbx_env, repo, sb.worktree)
    r = sbx_env.sbx("down", "dirty")
    assert_refused(r, EXIT_REFUSED, ["--force"])
    assert is_mounted(sb.mnt)
    assert (sb.worktree / "README.md").read_text() == "uncommitted\n"
    assert world(sbx_env, repo, sb.worktree) == before
    assert sb.status()["mounted"] is True

    sbx_env.sbx_ok("down", "dirty", "--force")
    assert not is_mounted(sb.mnt)
    assert not sb.worktree.exists()
    assert "refs/heads/sbx/dirty" in branches(sbx_env, repo)


def test_down_untracked_only_refuses(sbx_env, repo):
    sb = sbx_env.up("untr", repo)
    (sb.mnt / "only-untracked.txt").write_text("x\n")
    r = sbx_env.sbx("down", "untr")
    assert_refused(r, EXIT_REFUSED, ["--force"])
    assert (sb.worktree / "only-untracked.txt").exists()


def test_down_keep_sandbox(sbx_env, repo):
    sb = sbx_env.up("keep", repo)
    (sb.mnt / "wip.txt").write_text("wip\n")   # dirty is fine: nothing lost
    sbx_env.sbx_ok("down", "keep", "--keep-sandbox")
    assert not is_mounted(sb.mnt)
    assert (sb.worktree / "wip.txt").read_text() == "wip\n"
    s = sb.status()
    assert s["mounted"] is False
    sbx_env.sbx_ok("up", "keep")
    wait_for_mount(sb.mnt)
    assert (sb.mnt / "wip.txt").read_text() == "wip\n"


def test_down_delete_branch(sbx_env, repo):
    sbx_env.up("delbr", repo)
    sbx_env.sbx_ok("down", "delbr", "--delete-branch")
    assert "refs/heads/sbx/delbr" not in branches(sbx_env, repo)
    assert not sbx_env.worktree("delbr").exists()
    # the source checkout is untouched
    assert sbx_env.git("branch", "--show-current", cwd=repo).out.strip() == "main"


def test_down_force_on_dead_daemon(sbx_env, repo):
    sb = sbx_env.up("deaddown", repo)
    sb.kill_daemon(signal.SIGKILL)
    r = sbx_env.sbx("down", "deaddown", "--force")
    assert r.rc == 0, str(r)
    assert not is_mounted(sb.mnt)
    assert not sb.worktree.exists()


# -- carry changes -------------------------------------------------------------------------


def test_carry_changes(sbx_env, repo):
    (repo / "README.md").write_text("# unstaged edit\n")
    (repo / "docs" / "notes.txt").write_text("staged edit\n")
    sbx_env.git("add", "docs/notes.txt", cwd=repo)
    (repo / "src" / "new.c").write_text("/* untracked */\n")
    (repo / "build").mkdir()
    (repo / "build" / "out.bin").write_text("ignored")
    (repo / "x.o").write_text("ignored")
    os.unlink(repo / "src" / "util.h")  # a deletion
    src_status = sbx_env.git("status", "--porcelain", cwd=repo).out

    sb = sbx_env.up("carry", repo, "--carry-changes")
    w = sb.worktree
    assert (sb.mnt / "README.md").read_text() == "# unstaged edit\n"
    assert (w / "docs" / "notes.txt").read_text() == "staged edit\n"
    assert (w / "src" / "new.c").read_text() == "/* untracked */\n"
    assert not (w / "src" / "util.h").exists()
    assert not (w / "build").exists() and not (w / "x.o").exists()
    # the source checkout still has its changes, untouched
    assert sbx_env.git("status", "--porcelain", cwd=repo).out == src_status
    # without --carry-changes: a clean checkout of HEAD
    sb2 = sbx_env.up("nocarry", repo)
    assert (sb2.mnt / "README.md").read_text() == "# sample\n"
    assert (sb2.mnt / "src" / "util.h").exists()
    assert not (sb2.mnt / "src" / "new.c").exists()


# -- bad inputs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["status", "nosuch"], ["status", "nosuch", "--json"],
    ["mount", "nosuch"], ["umount", "nosuch"], ["snapshot", "nosuch"],
    ["snapshots", "nosuch"], ["restore", "nosuch", "abc"],
])
def test_unknown_session(sbx_env, repo, args):
    before = world(sbx_env, repo)
    r = sbx_env.sbx(*args)
    assert_refused(r, EXIT_NOTFOUND, ["nosuch"])
    assert "sbx ls" in r.err or "sbx up" in r.err, \
        f"the message should say what to do:\n{r}"
    assert world(sbx_env, repo) == before


@pytest.mark.parametrize("name", ["a/b", "..", "../x", "x/../y", "/abs",
                                  ".hidden", "-dash", "", "a" * 200,
                                  "sp ace", "new\nline"])
def test_bad_names(sbx_env, repo, name):
    before = world(sbx_env, repo)
    for args in (["up", name, "--repo", str(repo)], ["status", name],
                 ["down", name, "--force"], ["mount", name]):
        r = sbx_env.sbx(*args)
        assert_refused(r, EXIT_USAGE)
        if not name.startswith("-"):  # else it reads as an unknown option
            assert "name" in r.err.lower(), \
                f"message should explain names:\n{r}"
    assert world(sbx_env, repo) == before


def test_repo_not_a_git_repository(sbx_env, repo):
    plain = sbx_env.root / "not-a-repo"
    plain.mkdir()
    (plain / "file").write_text("x")
    before = world(sbx_env, repo, plain)
    r = sbx_env.sbx("up", "ng", "--repo", plain)
    assert_refused(r, EXIT_CONFIG, [str(plain)])
    assert "git" in r.err.lower()
    assert world(sbx_env, repo, plain) == before
    r = sbx_env.sbx("up", "ng2", "--repo", sbx_env.root / "does-not-exist")
    assert_refused(r)
    assert r.rc in (EXIT_CONFIG, EXIT_NOTFOUND, EXIT_USAGE)
    # no repository around the working directory either
    r = sbx_env.sbx("up", "ng3", cwd=plain)
    assert_refused(r, EXIT_CONFIG)
    assert world(sbx_env, repo, plain) == before


def test_bad_ref(sbx_env, repo):
    refused_unchanged(sbx_env, repo, ["up", "badref", "--repo", repo, "--ref",
                                      "no-such-ref"], mentions=["no-such-ref"])


def test_nonempty_mountpoint(sbx_env, repo):
    mnt = sbx_env.root / "full"
    mnt.mkdir()
    (mnt / "precious.txt").write_text("do not hide me")
    before = world(sbx_env, repo, mnt)
    r = refused_unchanged(sbx_env, repo, ["up", "ne", "--repo", repo,
                                          "--mount", mnt],
                          EXIT_REFUSED, [str(mnt)], [mnt])
    assert "empty" in r.err.lower()
    assert (mnt / "precious.txt").read_text() == "do not hide me"
    # a file, not a directory
    f = sbx_env.root / "afile"
    f.write_text("")
    r = sbx_env.sbx("up", "ne2", "--repo", repo, "--mount", f)
    assert_refused(r)
    assert world(sbx_env, repo, mnt) == before


def test_mountpoint_in_use(sbx_env, repo):
    a = sbx_env.up("first", repo)
    refused_unchanged(sbx_env, repo, ["up", "second", "--repo", repo,
                                      "--mount", a.mnt],
                      EXIT_REFUSED, [str(a.mnt)], [a.worktree])
    assert len(mounts_at(a.mnt)) == 1
    assert os.getxattr(a.mnt, "user.sbx.session") == b"first"
    # mounting an existing session on the other's mountpoint
    b = sbx_env.up("third", repo)
    sbx_env.sbx_ok("umount", "third")
    refused_unchanged(sbx_env, repo, ["mount", "third", a.mnt], EXIT_REFUSED,
                      [str(a.mnt)])
    assert b.status()["mounted"] is False


def test_commands_on_dead_daemon_say_what_to_do(sbx_env, repo):
    sb = sbx_env.up("zombie", repo)
    sb.kill_daemon(signal.SIGKILL)
    # a dead daemon leaves a mount that answers ENOTCONN; sbx must not hang
    r = sbx_env.sbx("ls", "--json", timeout=20)
    assert r.rc == 0, str(r)
    r = sbx_env.sbx("mount", "zombie", timeout=30)
    assert r.rc == 0, str(r)
    wait_for_mount(sb.mnt, log=sb.log)
    assert (sb.mnt / "README.md").exists()


def test_config_file_errors(sbx_env, repo):
    cfg = Path(sbx_env.env["SBX_CONFIG"])
    cfg.write_text("{ this is not json")
    before = world(sbx_env, repo)
    r = sbx_env.sbx("up", "cfg", "--repo", repo)
    assert_refused(r, EXIT_CONFIG, [str(cfg)])
    assert world(sbx_env, repo) == before
    cfg.write_text(json.dumps({"provider": "no-such-provider"}))
    r = sbx_env.sbx("up", "cfg", "--repo", repo)
    assert_refused(r, EXIT_CONFIG, ["no-such-provider"])
    assert world(sbx_env, repo) == before
    cfg.write_text(json.dumps({"provider": "local",
                               "local": {"isolation": "bogus"}}))
    r = sbx_env.sbx("up", "cfg", "--repo", repo)
    assert_refused(r, EXIT_CONFIG, ["isolation"])
    assert world(sbx_env, repo) == before
    cfg.write_text(json.dumps({"provider": "local"}))
    sbx_env.sbx_ok("up", "cfg", "--repo", repo)


def test_opencode_jsonc_in_repo(sbx_env, repo):
    (repo / "opencode.jsonc").write_text(
        '// comments allowed\n{\n  /* block */ "sandbox": {"provider": '
        '"local"} // trailing\n}\n')
    sbx_env.sbx_ok("up", "oc", "--repo", repo)
    (repo / "opencode.jsonc").write_text('{"sandbox": {"provider": "nope"}}')
    r = sbx_env.sbx("up", "oc2", "--repo", repo)
    assert_refused(r, EXIT_CONFIG, ["nope"])
