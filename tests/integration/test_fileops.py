"""Every file operation of the mount, checked against a plain directory.

Each scenario runs twice, once in a plain directory on the worktree's file
system and once in the mount (testenv.same_as_plain), and the observations,
errno included, must be equal.  Then come the properties a plain directory
cannot be compared for: virtual xattrs, changes made directly in the worktree,
writes reaching the worktree, concurrent writers.
"""

import errno
import mmap
import os
import stat
import subprocess
import sys
import time

import pytest

from testenv import (attempt, err_of, lstat_facts, read_bytes, same_as_plain,
                     st_facts, tree)
from testenv import syscalls as sc

# Every test here runs on a local sandbox and on a remote one (sbx-agent on
# loopback); those marked slow_remote also through the latency proxy at
# 20 ms RTT (conftest.py: the providers and slow_remote markers).
pytestmark = pytest.mark.providers("local", "remote")

# How long a change made directly in the worktree may take to show through
# the mount (issue 2: "within 1 s").
VISIBLE_WITHIN = float(os.environ.get("SBX_TEST_VISIBLE_WITHIN", "1.0"))
GiB = 1 << 30
MiB = 1 << 20


def run_both(sandbox, plain_dir, scenario, label=None):
    return same_as_plain(plain_dir, sandbox.mnt, scenario, label)


def write_file(p, data, mode=0o644):
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


# -- create, read, write ----------------------------------------------------


@pytest.mark.slow_remote
def test_create_read_write(sandbox, plain_dir):
    def scen(d):
        f = d / "a.txt"
        obs = []
        fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o640)
        obs.append(os.write(fd, b"hello world\n"))
        obs.append(os.pwrite(fd, b"HELLO", 0))
        obs.append(os.pread(fd, 100, 0))
        obs.append(os.lseek(fd, 0, os.SEEK_END))
        obs.append(os.write(fd, b"tail"))
        os.fsync(fd)
        obs.append(st_facts(os.fstat(fd)))
        os.close(fd)
        obs.append(f.read_bytes())
        obs.append(lstat_facts(f))
        # read past EOF, zero-length read and write
        fd = os.open(f, os.O_RDONLY)
        obs.append(os.pread(fd, 10, 1000))
        obs.append(os.read(fd, 0))
        obs.append(err_of(os.write, fd, b"x"))  # EBADF on O_RDONLY
        os.close(fd)
        # O_TRUNC on open
        fd = os.open(f, os.O_WRONLY | os.O_TRUNC)
        os.close(fd)
        obs.append(lstat_facts(f))
        obs.append(attempt(os.open, d / "missing" / "x", os.O_RDONLY))
        obs.append(attempt(os.open, d / "nothere", os.O_RDONLY))
        # a 3 MiB write and read in one call (large max_write paths)
        big = os.urandom(3 * MiB + 17)
        (d / "big").write_bytes(big)
        obs.append((d / "big").read_bytes() == big)
        return obs

    run_both(sandbox, plain_dir, scen)


def test_o_append(sandbox, plain_dir):
    def scen(d):
        f = d / "log"
        f.write_bytes(b"start\n")
        fd = os.open(f, os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"one\n")
        os.lseek(fd, 0, os.SEEK_SET)  # ignored by O_APPEND
        os.write(fd, b"two\n")
        # Linux quirk: pwrite on an O_APPEND descriptor appends too.
        os.pwrite(fd, b"three\n", 0)
        pos = os.lseek(fd, 0, os.SEEK_CUR)
        os.close(fd)
        fd = os.open(f, os.O_RDWR | os.O_APPEND)
        os.write(fd, b"four\n")
        os.close(fd)
        return [pos, f.read_bytes(), lstat_facts(f)]

    obs = run_both(sandbox, plain_dir, scen)
    assert obs[1] == b"start\none\ntwo\nthree\nfour\n"


def test_o_excl(sandbox, plain_dir):
    def scen(d):
        f = d / "x"
        obs = [attempt(lambda: os.close(os.open(
            f, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)) or "created")]
        obs.append(err_of(os.open, f, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        os.symlink("dangling-target", d / "dl")
        # O_EXCL never follows a symlink, even a dangling one
        obs.append(err_of(os.open, d / "dl", os.O_CREAT | os.O_EXCL |
                          os.O_WRONLY))
        obs.append(lstat_facts(d / "dangling-target"))
        # O_CREAT without O_EXCL on a dangling symlink creates the target
        os.close(os.open(d / "dl", os.O_CREAT | os.O_WRONLY, 0o644))
        obs.append(lstat_facts(d / "dangling-target"))
        os.mkdir(d / "sub")
        obs.append(err_of(os.open, d / "sub", os.O_CREAT | os.O_EXCL |
                          os.O_WRONLY))
        obs.append(lstat_facts(f))
        return obs

    obs = run_both(sandbox, plain_dir, scen)
    assert obs[1] == "EEXIST"


def test_truncate_ftruncate(sandbox, plain_dir):
    def scen(d):
        f = d / "t"
        f.write_bytes(b"0123456789")
        obs = []
        os.truncate(f, 4)
        obs.append(f.read_bytes())
        os.truncate(f, 8)
        obs.append(f.read_bytes())
        fd = os.open(f, os.O_RDWR)
        os.ftruncate(fd, 2)
        obs.append(os.pread(fd, 100, 0))
        os.ftruncate(fd, 3 * MiB)
        obs.append(os.fstat(fd).st_size)
        obs.append(os.pread(fd, 4, 3 * MiB - 4))
        os.close(fd)
        fd = os.open(f, os.O_RDONLY)
        obs.append(err_of(os.ftruncate, fd, 0))
        os.close(fd)
        obs.append(err_of(os.truncate, d / "nothere", 0))
        obs.append(err_of(os.truncate, f, -1))
        # Past the largest file (ext4: 16 TiB; the agent's protocol
        # carries sizes up to 2^53): EFBIG, by path and with buffered
        # bytes (said EINVAL through a remote mount), which stay.
        obs.append(err_of(os.truncate, f, 1 << 62))
        fd = os.open(f, os.O_RDWR)
        os.pwrite(fd, b"kept", 0)
        obs.append(err_of(os.ftruncate, fd, 1 << 62))
        os.close(fd)
        obs.append(f.read_bytes()[:8])
        os.mkdir(d / "dir")
        obs.append(err_of(os.truncate, d / "dir", 0))
        obs.append(lstat_facts(f))
        return obs

    run_both(sandbox, plain_dir, scen)


def test_mkdir_rmdir(sandbox, plain_dir):
    def scen(d):
        obs = [attempt(os.mkdir, d / "a", 0o750)]
        obs.append(lstat_facts(d / "a"))
        obs.append(err_of(os.mkdir, d / "a"))
        obs.append(err_of(os.mkdir, d / "no" / "b"))
        (d / "a" / "f").write_text("x")
        obs.append(err_of(os.rmdir, d / "a"))          # ENOTEMPTY
        obs.append(err_of(os.rmdir, d / "a" / "f"))    # ENOTDIR
        obs.append(err_of(os.rmdir, d / "missing"))    # ENOENT
        obs.append(err_of(os.unlink, d / "a"))         # EISDIR
        os.unlink(d / "a" / "f")
        obs.append(err_of(os.rmdir, d / "a"))
        obs.append(lstat_facts(d / "a"))
        os.makedirs(d / "p" / "q" / "r")
        obs.append(lstat_facts(d / "p"))  # nlink counts subdirectories
        obs.append(sorted(os.listdir(d)))
        return obs

    obs = run_both(sandbox, plain_dir, scen)
    assert obs[4] == "ENOTEMPTY"


@pytest.mark.parametrize("how", ["rmdir", "rename_over"])
def test_open_directory_removed(sandbox, plain_dir, how):
    """A directory removed (or replaced by a rename) while a descriptor of
    it is open: fstat says no link and size 0, it lists empty, nothing can
    be made in it, and a new directory under its name is another one.
    Remote sandboxes used to say ENOENT (or ESTALE after the rename)."""
    def scen(d):
        os.mkdir(d / "a", 0o750)
        (d / "a" / "f").write_text("x")
        os.unlink(d / "a" / "f")
        fd = os.open(d / "a", os.O_RDONLY | os.O_DIRECTORY)
        try:
            if how == "rmdir":
                os.rmdir(d / "a")
            else:
                os.mkdir(d / "b", 0o700)
                os.rename(d / "b", d / "a")
            obs = [attempt(lambda: st_facts(os.fstat(fd)))]
            obs.append(attempt(lambda: os.fstat(fd).st_size))
            obs.append(attempt(os.listdir, fd))
            obs.append(err_of(os.open, "f", os.O_CREAT | os.O_WRONLY, 0o600,
                              dir_fd=fd))
            obs.append(err_of(os.mkdir, "g", dir_fd=fd))
            if how == "rmdir":
                os.mkdir(d / "a", 0o700)
            obs.append(lstat_facts(d / "a"))
            obs.append(attempt(lambda: st_facts(os.fstat(fd))))
            obs.append(sorted(os.listdir(d)))
            return obs
        finally:
            os.close(fd)

    obs = run_both(sandbox, plain_dir, scen, how)
    assert obs[0] == ("ok", {"type": stat.S_IFDIR, "mode": 0o750,
                             "size": "dir", "nlink": 0, "uid": 0, "gid": 0})
    assert obs[2] == ("ok", [])


def test_unlink(sandbox, plain_dir):
    def scen(d):
        f = d / "u"
        f.write_bytes(b"still readable")
        fd = os.open(f, os.O_RDWR)
        obs = [attempt(os.unlink, f), lstat_facts(f)]
        # an unlinked but open file stays usable
        obs.append(os.pread(fd, 100, 0))
        os.pwrite(fd, b"S", 0)
        obs.append(os.pread(fd, 100, 0))
        obs.append(os.fstat(fd).st_nlink)
        os.close(fd)
        obs.append(err_of(os.unlink, f))
        obs.append(sorted(os.listdir(d)))
        return obs

    run_both(sandbox, plain_dir, scen)


def test_listing_opened_before_a_change_shows_it(sandbox, plain_dir):
    """A directory opened, then changed through the mount, then read: the
    listing shows the change, later listings too, and a name removed in
    between can be made again with O_CREAT alone.  (Remote, before
    2026-12-07: the listing was the one of opendir; the kernel kept its
    stale entries for every later `ls`, so `git add -A` missed a new file,
    and the removed name came back as a dentry for 600 s: `: > f` said
    ENOENT.  Stress test.)"""
    def scen(d):
        (d / "old").write_bytes(b"o")
        (d / "gone").write_bytes(b"g")
        os.listdir(d)
        os.stat(d / "gone")
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            (d / "new").write_bytes(b"n")
            os.unlink(d / "gone")
            obs = [sorted(os.listdir(fd))]
            obs.append(sorted(os.listdir(d)))
            obs.append(subprocess.run(["ls", str(d)], capture_output=True,
                                      text=True).stdout.split())
            obs.append(os.path.lexists(d / "gone"))
            # O_CREAT without O_EXCL, as a shell's `>` does
            obs.append(attempt(write_file, d / "gone", b"again"))
            obs.append(read_bytes(d / "gone"))
            # rewinddir (os.listdir of the descriptor starts from 0):
            # what changed since the first reading shows
            os.unlink(d / "old")
            (d / "newer").write_bytes(b"m")
            obs.append(sorted(os.listdir(fd)))
        finally:
            os.close(fd)
        return obs

    run_both(sandbox, plain_dir, scen)


def test_long_listing_read_across_removals(sandbox, plain_dir):
    """A listing read in many chunks, names of it removed through the mount
    between two of them: no removed name is left as a dentry (stat says
    ENOENT, a create with O_CREAT alone works), and the next listing is
    exact."""
    # Long names: more than one getdents() of glibc's 32 KiB, so the
    # removals fall between two READDIRs of the listing.
    names = [f"e{i:04d}" + "x" * 120 for i in range(600)]
    gone = names[::7]

    def scen(d):
        for n in names:
            (d / n).write_bytes(b"x")
        # (No listing before: the kernel would serve this one from its
        # listing cache, asking nothing.)
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            it = os.scandir(fd)
            next(it)
            for n in gone:
                os.unlink(d / n)
            # stat as `ls -l` does: the kernel then asks for the next
            # chunks with attributes (readdirplus), which make dentries
            for e in it:
                attempt(os.lstat, d / e.name)
            it.close()
        finally:
            os.close(fd)
        # (indices: the names are long)
        obs = [[names.index(n) for n in gone if os.path.lexists(d / n)]]
        obs.append([names.index(n) for n in gone
                    if err_of(write_file, d / n, b"y") != "ok"])
        obs.append(len(os.listdir(d)))
        return obs

    run_both(sandbox, plain_dir, scen)


def test_unlink_open_file_after_child_exec(sandbox, plain_dir):
    """A child that execs closes its copies of our descriptors (the kernel
    sends FLUSH for them): our descriptor must still keep the file alive."""
    def scen(d):
        f = d / "held"
        f.write_bytes(b"held open")
        fd = os.open(f, os.O_RDWR)      # close-on-exec, as Python opens
        subprocess.run(["true"], check=True)
        os.unlink(f)
        obs = [os.pread(fd, 100, 0)]
        os.pwrite(fd, b"H", 0)
        obs.append(os.pread(fd, 100, 0))
        os.close(fd)
        obs.append(sorted(os.listdir(d)))
        return obs

    obs = run_both(sandbox, plain_dir, scen)
    assert obs[0] == b"held open"


# -- rename -------------------------------------------------------------------


@pytest.mark.slow_remote
def test_rename(sandbox, plain_dir):
    def scen(d):
        obs = []
        (d / "a").write_bytes(b"A")
        (d / "b").write_bytes(b"B")
        os.mkdir(d / "da")
        os.mkdir(d / "db")
        os.mkdir(d / "full")
        (d / "full" / "x").write_bytes(b"x")
        obs.append(attempt(os.rename, d / "a", d / "a2"))
        obs.append([lstat_facts(d / "a"), read_bytes(d / "a2")])
        # overwrite rename: b is replaced by a2's content
        fd_old_b = os.open(d / "b", os.O_RDONLY)
        obs.append(attempt(os.rename, d / "a2", d / "b"))
        obs.append(read_bytes(d / "b"))
        obs.append(os.pread(fd_old_b, 10, 0))  # old b still readable via fd
        os.close(fd_old_b)
        obs.append(err_of(os.rename, d / "missing", d / "z"))
        obs.append(err_of(os.rename, d / "da", d / "full"))    # ENOTEMPTY
        obs.append(err_of(os.rename, d / "b", d / "da"))       # EISDIR
        obs.append(err_of(os.rename, d / "da", d / "b"))       # ENOTDIR
        obs.append(err_of(os.rename, d / "da", d / "da" / "in"))  # EINVAL
        obs.append(attempt(os.rename, d / "da", d / "db"))     # over empty dir
        obs.append(attempt(os.rename, d / "db", d / "full" / "moved"))
        obs.append(attempt(os.rename, d / "b", d / "b"))       # same name
        obs.append(tree(d))
        return obs

    run_both(sandbox, plain_dir, scen)


def test_rename_noreplace_exchange(sandbox, plain_dir):
    def scen(d):
        obs = []
        (d / "x").write_bytes(b"X")
        (d / "y").write_bytes(b"Y")
        os.mkdir(d / "dir")
        (d / "dir" / "inner").write_bytes(b"I")
        obs.append(err_of(sc.renameat2, d / "x", d / "y", sc.RENAME_NOREPLACE))
        obs.append([read_bytes(d / "x"), read_bytes(d / "y")])
        obs.append(err_of(sc.renameat2, d / "x", d / "z", sc.RENAME_NOREPLACE))
        obs.append([lstat_facts(d / "x"), read_bytes(d / "z")])
        obs.append(err_of(sc.renameat2, d / "z", d / "y", sc.RENAME_EXCHANGE))
        obs.append([read_bytes(d / "z"), read_bytes(d / "y")])
        # exchange a file and a directory
        obs.append(err_of(sc.renameat2, d / "y", d / "dir", sc.RENAME_EXCHANGE))
        obs.append([lstat_facts(d / "y"), lstat_facts(d / "dir"),
                    read_bytes(d / "y" / "inner"), read_bytes(d / "dir")])
        obs.append(err_of(sc.renameat2, d / "y", d / "nope",
                          sc.RENAME_EXCHANGE))                     # ENOENT
        obs.append(err_of(sc.renameat2, d / "y", d / "z",
                          sc.RENAME_EXCHANGE | sc.RENAME_NOREPLACE))  # EINVAL
        obs.append(tree(d))
        return obs

    obs = run_both(sandbox, plain_dir, scen)
    assert obs[0] == "EEXIST"
    assert obs[4] == "ok"


# -- links -----------------------------------------------------------------


def test_symlink_readlink(sandbox, plain_dir):
    def scen(d):
        obs = []
        (d / "target").write_text("T")
        obs.append(attempt(os.symlink, "target", d / "rel"))
        obs.append(attempt(os.symlink, "../" + d.name + "/target", d / "up"))
        obs.append(attempt(os.symlink, "nowhere", d / "dangling"))
        obs.append(attempt(os.symlink, "x" * 1000, d / "long"))
        obs.append([os.readlink(d / n) for n in ("rel", "up", "dangling")])
        obs.append(len(os.readlink(d / "long")))
        obs.append([lstat_facts(d / "rel")["type"] == stat.S_IFLNK,
                    lstat_facts(d / "rel")["size"]])
        obs.append(read_bytes(d / "rel"))
        obs.append(read_bytes(d / "up"))
        obs.append(err_of(os.stat, d / "dangling"))
        obs.append(err_of(os.readlink, d / "target"))              # EINVAL
        obs.append(err_of(os.symlink, "t", d / "rel"))             # EEXIST
        obs.append(err_of(os.open, d / "rel", os.O_RDONLY | os.O_NOFOLLOW))
        os.symlink("loop2", d / "loop1")
        os.symlink("loop1", d / "loop2")
        obs.append(err_of(os.stat, d / "loop1"))                   # ELOOP
        os.mkdir(d / "realdir")
        os.symlink("realdir", d / "dirlink")
        (d / "dirlink" / "via").write_text("v")
        obs.append(sorted(os.listdir(d / "realdir")))
        return obs

    run_both(sandbox, plain_dir, scen)


def test_hard_link(sandbox, plain_dir):
    def scen(d):
        obs = []
        (d / "orig").write_bytes(b"one")
        obs.append(attempt(os.link, d / "orig", d / "second"))
        a, b = os.lstat(d / "orig"), os.lstat(d / "second")
        obs.append([a.st_nlink, b.st_nlink, a.st_ino == b.st_ino])
        (d / "second").write_bytes(b"two")
        obs.append(read_bytes(d / "orig"))
        os.mkdir(d / "sub")
        obs.append(attempt(os.link, d / "orig", d / "sub" / "third"))
        obs.append(os.lstat(d / "orig").st_nlink)
        os.unlink(d / "orig")
        obs.append([os.lstat(d / "second").st_nlink,
                    os.lstat(d / "sub" / "third").st_nlink])
        obs.append(err_of(os.link, d / "sub", d / "sublink"))      # EPERM
        obs.append(err_of(os.link, d / "second", d / "sub" / "third"))
        obs.append(err_of(os.link, d / "missing", d / "m2"))
        return obs

    obs = run_both(sandbox, plain_dir, scen)
    assert obs[1] == [2, 2, True]


def test_hard_link_same_inode_after_lookup(sandbox):
    """Both names resolve to one inode in the mount, as in the worktree."""
    d = sandbox.mnt / "hl"
    d.mkdir()
    (d / "a").write_text("a")
    os.link(d / "a", d / "b")
    wt = sandbox.worktree / "hl"
    assert os.stat(d / "a").st_ino == os.stat(d / "b").st_ino
    assert os.stat(wt / "a").st_ino == os.stat(wt / "b").st_ino
    assert os.stat(d / "a").st_nlink == 2


# -- attributes ---------------------------------------------------------------


def test_chmod(sandbox, plain_dir):
    def scen(d):
        obs = []
        f = d / "m"
        f.write_text("m")
        for mode in (0o600, 0o755, 0o4755, 0o2711, 0o000, 0o7777):
            os.chmod(f, mode)
            obs.append(stat.S_IMODE(os.lstat(f).st_mode))
        fd = os.open(f, os.O_RDONLY)
        os.fchmod(fd, 0o640)
        obs.append(stat.S_IMODE(os.fstat(fd).st_mode))
        os.close(fd)
        os.mkdir(d / "sticky")
        os.chmod(d / "sticky", 0o1777)
        obs.append(lstat_facts(d / "sticky"))
        obs.append(err_of(os.chmod, d / "missing", 0o644))
        return obs

    run_both(sandbox, plain_dir, scen)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_chown(sandbox, plain_dir):
    def scen(d):
        obs = []
        f = d / "o"
        f.write_text("o")
        os.chown(f, 1000, 1001)
        obs.append(lstat_facts(f))
        os.chown(f, -1, 1002)
        obs.append(lstat_facts(f))
        os.chmod(f, 0o6755)
        os.chown(f, 1000, -1)        # clears setuid/setgid on a regular file
        obs.append(lstat_facts(f))
        os.symlink("o", d / "l")
        os.lchown(d / "l", 1003, 1003)
        obs.append([lstat_facts(d / "l")["uid"], lstat_facts(f)["uid"]])
        fd = os.open(f, os.O_RDONLY)
        os.fchown(fd, 0, 0)
        obs.append(st_facts(os.fstat(fd)))
        os.close(fd)
        return obs

    run_both(sandbox, plain_dir, scen)


def test_utimens(sandbox, plain_dir):
    def scen(d):
        obs = []
        f = d / "t"
        f.write_text("t")
        os.utime(f, ns=(1_000_000_123, 2_000_000_456))
        st = os.lstat(f)
        obs.append((st.st_atime_ns, st.st_mtime_ns))
        os.utime(f, (1_500_000_000, 1_600_000_000))
        st = os.lstat(f)
        obs.append((st.st_atime_ns, st.st_mtime_ns))
        # UTIME_OMIT keeps one side
        sc.utimensat(f, sc.UTIME_OMIT, (1_700_000_000, 789))
        st = os.lstat(f)
        obs.append((st.st_atime_ns, st.st_mtime_ns))
        # UTIME_NOW / utime(None): close to now
        before = time.time_ns()
        os.utime(f, None)
        st = os.lstat(f)
        obs.append(abs(st.st_mtime_ns - before) < 5 * 10**9)
        # symlink itself (lutimes)
        os.symlink("t", d / "l")
        os.utime(d / "l", ns=(3_000_000_001, 3_000_000_002),
                 follow_symlinks=False)
        obs.append([os.lstat(d / "l").st_mtime_ns,
                    os.lstat(f).st_mtime_ns == 3_000_000_002])
        fd = os.open(f, os.O_RDONLY)
        os.utime(fd, ns=(4_000_000_001, 4_000_000_002))
        obs.append(os.fstat(fd).st_mtime_ns)
        os.close(fd)
        obs.append(err_of(os.utime, d / "missing", None))
        # a write updates mtime
        os.utime(f, ns=(1, 1))
        with open(f, "ab") as fh:
            fh.write(b"more")
        obs.append(os.lstat(f).st_mtime_ns > 10**18)
        return obs

    obs = run_both(sandbox, plain_dir, scen)
    assert obs[0] == (1_000_000_123, 2_000_000_456)


def test_mknod_fifo(sandbox, plain_dir):
    def scen(d):
        obs = [attempt(os.mkfifo, d / "fifo", 0o620)]
        obs.append(lstat_facts(d / "fifo"))
        r = os.open(d / "fifo", os.O_RDONLY | os.O_NONBLOCK)
        w = os.open(d / "fifo", os.O_WRONLY | os.O_NONBLOCK)
        os.write(w, b"through the pipe")
        obs.append(os.read(r, 100))
        os.close(w)
        os.close(r)
        obs.append(err_of(os.mkfifo, d / "fifo"))
        obs.append(attempt(os.mknod, d / "reg", 0o644 | stat.S_IFREG))
        obs.append(lstat_facts(d / "reg"))
        if os.geteuid() == 0:
            obs.append(attempt(os.mknod, d / "null", 0o666 | stat.S_IFCHR,
                               os.makedev(1, 3)))
            st = os.lstat(d / "null")
            obs.append([stat.S_ISCHR(st.st_mode), os.major(st.st_rdev),
                        os.minor(st.st_rdev)])
        return obs

    run_both(sandbox, plain_dir, scen)


def test_statfs(sandbox, plain_dir):
    a = os.statvfs(plain_dir)
    b = os.statvfs(sandbox.mnt)
    assert b.f_bsize > 0 and b.f_frsize > 0
    assert b.f_namemax == a.f_namemax
    # the same file system underneath: same size, free space close
    assert b.f_blocks * b.f_frsize == a.f_blocks * a.f_frsize
    assert abs(b.f_bavail * b.f_frsize - a.f_bavail * a.f_frsize) < 256 * MiB
    assert b.f_files == a.f_files


# -- xattrs -------------------------------------------------------------------


def _user_xattrs(p, follow=True):
    return sorted(n for n in os.listxattr(p, follow_symlinks=follow)
                  if n.startswith("user.") and not n.startswith("user.sbx."))


def test_xattrs(sandbox, plain_dir):
    def scen(d):
        obs = []
        f = d / "x"
        f.write_text("x")
        os.mkdir(d / "dir")
        obs.append(attempt(os.setxattr, f, "user.color", b"blue"))
        obs.append(os.getxattr(f, "user.color"))
        obs.append(attempt(os.setxattr, f, "user.empty", b""))
        obs.append(os.getxattr(f, "user.empty"))
        big = bytes(range(256)) * 8
        obs.append(attempt(os.setxattr, f, "user.big", big))
        obs.append(os.getxattr(f, "user.big") == big)
        obs.append(_user_xattrs(f))
        obs.append(err_of(os.setxattr, f, "user.color", b"red",
                          os.XATTR_CREATE))                       # EEXIST
        obs.append(err_of(os.setxattr, f, "user.new", b"v",
                          os.XATTR_REPLACE))                      # ENODATA
        obs.append(attempt(os.setxattr, f, "user.color", b"red",
                           os.XATTR_REPLACE))
        obs.append(os.getxattr(f, "user.color"))
        obs.append(err_of(os.getxattr, f, "user.none"))           # ENODATA
        obs.append(attempt(os.removexattr, f, "user.color"))
        obs.append(err_of(os.removexattr, f, "user.color"))
        obs.append(_user_xattrs(f))
        obs.append(attempt(os.setxattr, d / "dir", "user.d", b"1"))
        obs.append(_user_xattrs(d / "dir"))
        obs.append(err_of(os.getxattr, d / "missing", "user.a"))
        fd = os.open(f, os.O_RDONLY)
        os.setxattr(fd, "user.viafd", b"fd")
        obs.append(os.getxattr(fd, "user.viafd"))
        os.close(fd)
        return obs

    obs = run_both(sandbox, plain_dir, scen)
    assert obs[1] == b"blue"


def test_virtual_xattrs(sandbox):
    m = sandbox.mnt
    (m / "vdir" / "deeper").mkdir(parents=True)
    (m / "vdir" / "deeper" / "f.txt").write_text("f")
    for rel in ("", "vdir", "vdir/deeper", "vdir/deeper/f.txt", "README.md"):
        p = m / rel if rel else m
        assert os.getxattr(p, "user.sbx.session").decode() == sandbox.name
        spath = os.getxattr(p, "user.sbx.path").decode()
        # The path inside the sandbox: it names the same file.  For the
        # local provider that is the worktree path.
        if rel:
            assert spath.rstrip("/").endswith("/" + rel), (rel, spath)
        if sandbox.provider == "local":
            assert os.path.samefile(spath, sandbox.worktree / rel), (rel,
                                                                      spath)
        ctl = os.getxattr(p, "user.sbx.control").decode()
        assert stat.S_ISSOCK(os.stat(ctl).st_mode), ctl
        for name in ("user.sbx.session", "user.sbx.path", "user.sbx.control"):
            e = err_of(os.setxattr, p, name, b"forged")
            assert e in ("EPERM", "EACCES", "EROFS", "ENOTSUP"), (name, e)
            e = err_of(os.removexattr, p, name)
            assert e in ("EPERM", "EACCES", "EROFS", "ENOTSUP"), (name, e)
        assert os.getxattr(p, "user.sbx.session").decode() == sandbox.name
    # not stored on the real files
    wt = sandbox.worktree / "vdir" / "deeper" / "f.txt"
    assert not [n for n in os.listxattr(wt) if n.startswith("user.sbx.")]


# -- directories ----------------------------------------------------------------


def test_readdir_5000(sandbox, plain_dir):
    def scen(d):
        for i in range(5000):
            os.close(os.open(d / f"file-{i:05d}", os.O_CREAT | os.O_WRONLY,
                             0o644))
        os.mkdir(d / "subdir")
        os.symlink("file-00000", d / "link")
        os.mkfifo(d / "fifo")
        ents = sc.getdents(d)
        names = sorted(n for n, _ in ents)
        types = {n: t for n, t in ents}
        obs = [len(ents), names, types]
        obs.append(sorted(e.name for e in os.scandir(d)))
        # a second read is the same (dir caches)
        obs.append(sorted(n for n, _ in sc.getdents(d)))
        for i in range(0, 5000, 2):
            os.unlink(d / f"file-{i:05d}")
        obs.append(sorted(os.listdir(d)))
        return obs

    obs = run_both(sandbox, plain_dir, scen)
    types = obs[2]
    assert types["."] == "dir" and types["subdir"] == "dir"
    assert types["link"] == "lnk" and types["file-04999"] == "reg"
    assert types["fifo"] == "fifo"
    assert len(obs[5]) == 2500 + 3


@pytest.mark.slow_remote
def test_readdir_during_changes(sandbox, plain_dir):
    """Entries added/removed while a directory stream is open."""
    def scen(d):
        for i in range(300):
            (d / f"e{i:03d}").write_text("")
        it = os.scandir(d)
        first = [next(it).name for _ in range(10)]
        for i in range(300, 310):
            (d / f"e{i:03d}").write_text("")
        rest = [e.name for e in it]
        it.close()
        seen = set(first) | set(rest)
        # every entry that existed all along is seen exactly once
        old = {f"e{i:03d}" for i in range(300)}
        return [old <= seen, len(first) + len(rest) == len(seen)]

    obs = run_both(sandbox, plain_dir, scen)
    assert obs == [True, True]


# -- sparse files, holes, allocation ---------------------------------------------


def test_lseek_data_hole(sandbox, plain_dir):
    def scen(d):
        f = d / "sparse"
        fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
        os.pwrite(fd, b"a" * 4096, 0)
        os.pwrite(fd, b"b" * 4096, MiB)
        os.ftruncate(fd, 4 * MiB)
        os.fsync(fd)
        os.close(fd)
        fd = os.open(f, os.O_RDONLY)
        obs = [
            os.lseek(fd, 0, os.SEEK_DATA),
            os.lseek(fd, 0, os.SEEK_HOLE),
            os.lseek(fd, 4096, os.SEEK_DATA),
            os.lseek(fd, MiB, os.SEEK_HOLE),
            err_of(os.lseek, fd, MiB + 4096, os.SEEK_DATA),     # ENXIO
            os.lseek(fd, 2 * MiB, os.SEEK_HOLE),
            err_of(os.lseek, fd, 5 * MiB, os.SEEK_HOLE),        # ENXIO
            os.lseek(fd, 0, os.SEEK_END),
            os.lseek(fd, -10, os.SEEK_END),
            err_of(os.lseek, fd, -1, os.SEEK_SET),              # EINVAL
        ]
        os.close(fd)
        return obs

    obs = run_both(sandbox, plain_dir, scen)
    assert obs[2] == MiB


def test_fallocate(sandbox, plain_dir):
    def scen(d):
        obs = []
        f = d / "fa"
        fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
        obs.append(attempt(sc.fallocate, fd, 0, 0, 2 * MiB))
        st = os.fstat(fd)
        obs.append([st.st_size, st.st_blocks * 512 >= 2 * MiB])
        obs.append(attempt(sc.fallocate, fd, sc.FALLOC_FL_KEEP_SIZE,
                           2 * MiB, MiB))
        obs.append(os.fstat(fd).st_size)
        os.pwrite(fd, b"z" * (2 * MiB), 0)
        os.fsync(fd)
        obs.append(attempt(sc.fallocate, fd, sc.FALLOC_FL_PUNCH_HOLE |
                           sc.FALLOC_FL_KEEP_SIZE, 64 * 1024, 64 * 1024))
        obs.append(os.pread(fd, 16, 64 * 1024))
        obs.append(os.lseek(fd, 0, os.SEEK_HOLE))
        obs.append(err_of(sc.fallocate, fd, sc.FALLOC_FL_PUNCH_HOLE, 0, 10))
        os.posix_fallocate(fd, 0, 3 * MiB)
        obs.append(os.fstat(fd).st_size)
        os.close(fd)
        return obs

    obs = run_both(sandbox, plain_dir, scen)
    assert obs[0] == ("ok", 0)


def test_copy_file_range(sandbox, plain_dir):
    data = os.urandom(5 * MiB + 123)

    def scen(d):
        (d / "src").write_bytes(data)
        s = os.open(d / "src", os.O_RDONLY)
        t = os.open(d / "dst", os.O_WRONLY | os.O_CREAT, 0o644)
        copied, total = [], 0
        while total < len(data):
            n = os.copy_file_range(s, t, len(data) - total, total, total)
            if n == 0:
                break
            copied.append(n > 0)
            total += n
        # a sub range at an offset
        t2 = os.open(d / "dst2", os.O_WRONLY | os.O_CREAT, 0o644)
        n2 = os.copy_file_range(s, t2, 1000, 4096, 10)
        os.close(s)
        os.close(t)
        os.close(t2)
        return [total, all(copied), read_bytes(d / "dst") == data, n2,
                read_bytes(d / "dst2") == b"\0" * 10 + data[4096:5096]]

    obs = run_both(sandbox, plain_dir, scen)
    assert obs[2] and obs[4]


def test_file_over_4gib_sparse(sandbox, plain_dir):
    off = 5 * GiB

    def scen(d):
        f = d / "huge"
        fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
        obs = [os.pwrite(fd, b"\x7f", off)]
        os.fsync(fd)
        os.close(fd)
        st = os.lstat(f)
        obs.append([st.st_size, st.st_blocks <= 64])
        fd = os.open(f, os.O_RDONLY)
        obs.append(os.pread(fd, 4, off - 1))
        obs.append(os.pread(fd, 8, 4 * GiB + 3))
        obs.append(os.lseek(fd, 0, os.SEEK_HOLE))
        obs.append(os.lseek(fd, 0, os.SEEK_DATA) <= off)
        os.close(fd)
        # append past 4 GiB and truncate back
        with open(f, "ab") as fh:
            fh.write(b"END")
        obs.append(os.lstat(f).st_size)
        os.truncate(f, 4 * GiB + 1)
        obs.append(os.lstat(f).st_size)
        return obs

    obs = run_both(sandbox, plain_dir, scen)
    assert obs[1] == [off + 1, True]
    assert obs[2] == b"\0\x7f"


# -- mmap ---------------------------------------------------------------------------


def test_mmap_read(sandbox, plain_dir):
    data = os.urandom(3 * MiB + 5)

    def scen(d):
        (d / "m").write_bytes(data)
        with open(d / "m", "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
            got = [mm[:100] == data[:100], mm[-5:] == data[-5:],
                   mm[MiB:MiB + 4096] == data[MiB:MiB + 4096], len(mm)]
            mm.close()
        return got

    assert run_both(sandbox, plain_dir, scen) == [True, True, True,
                                                  len(data)]


def test_mmap_shared_write(sandbox, plain_dir):
    def scen(d):
        f = d / "mw"
        f.write_bytes(b"." * (2 * MiB))
        fd = os.open(f, os.O_RDWR)
        mm = mmap.mmap(fd, 2 * MiB, mmap.MAP_SHARED,
                       mmap.PROT_READ | mmap.PROT_WRITE)
        mm[0:5] = b"HELLO"
        mm[MiB:MiB + 5] = b"WORLD"
        mm[-3:] = b"END"
        mm.flush()  # msync(MS_SYNC)
        fresh = os.open(f, os.O_RDONLY)
        obs = [os.pread(fresh, 5, 0), os.pread(fresh, 5, MiB),
               os.pread(fresh, 3, 2 * MiB - 3)]
        os.close(fresh)
        # grow the file, map the new part
        os.ftruncate(fd, 3 * MiB)
        mm2 = mmap.mmap(fd, 3 * MiB, mmap.MAP_SHARED,
                        mmap.PROT_READ | mmap.PROT_WRITE)
        mm2[2 * MiB:2 * MiB + 4] = b"MORE"
        mm2.flush()
        mm2.close()
        mm.close()
        os.close(fd)
        data = f.read_bytes()
        obs.append([len(data), data[:5], data[2 * MiB:2 * MiB + 4]])
        return obs

    obs = run_both(sandbox, plain_dir, scen, label="mmap-shared")
    assert obs[0] == b"HELLO"
    # and the worktree has the data (msync pushed it through)
    data = (sandbox.worktree / "mmap-shared" / "mw").read_bytes()
    assert data[:5] == b"HELLO" and data[MiB:MiB + 5] == b"WORLD"
    assert data[2 * MiB:2 * MiB + 4] == b"MORE"


def test_mmap_write_back_through_an_append_descriptor(sandbox, plain_dir):
    """The kernel writes a mapping's dirty pages back through any writable
    open file of the file, an O_APPEND one too: they belong at their
    offset, not at the end (a remote mount once appended the page: the
    file grew by 4 KiB)."""
    def scen(d):
        f = d / "ma"
        a = os.open(f, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        b = os.open(f, os.O_RDWR | os.O_APPEND)
        try:
            os.write(a, bytes(range(256)) * 120)       # 30720 bytes
            mm = mmap.mmap(b, 30720, mmap.MAP_SHARED,
                           mmap.PROT_READ | mmap.PROT_WRITE)
            mm[64:130] = b"M" * 66
            mm.flush()
            mm.close()
            obs = [os.lseek(b, 29, os.SEEK_END), os.fstat(a).st_size]
            os.write(b, b"tail")                       # a real append
            obs.append(os.fstat(a).st_size)
        finally:
            os.close(a)
            os.close(b)
        data = f.read_bytes()
        obs += [len(data), data[60:134], data[-6:]]
        return obs

    obs = run_both(sandbox, plain_dir, scen, label="mmap-append")
    assert obs[:4] == [30749, 30720, 30724, 30724]


def test_mmap_write_visible_in_worktree_after_msync(sandbox):
    f = sandbox.mnt / "mm.bin"
    f.write_bytes(b"\0" * 65536)
    fd = os.open(f, os.O_RDWR)
    mm = mmap.mmap(fd, 65536, mmap.MAP_SHARED)
    mm[100:110] = b"0123456789"
    mm.flush()
    assert (sandbox.worktree / "mm.bin").read_bytes()[100:110] == b"0123456789"
    mm.close()
    os.close(fd)


# -- concurrency -------------------------------------------------------------------


WRITER = r"""
import os, sys
path, tag, off, n = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3]), int(sys.argv[4])
fd = os.open(path, os.O_WRONLY)
chunk = tag * 4096
for i in range(n):
    os.pwrite(fd, chunk, off + i * 4096)
os.fsync(fd)
os.close(fd)
"""

APPENDER = r"""
import os, sys
path, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
for i in range(n):
    os.write(fd, f"{tag} {i:06d} {'x' * 50}\n".encode())
os.close(fd)
"""


def test_two_writers_disjoint_regions(sandbox):
    f = sandbox.mnt / "shared.bin"
    n = 512  # 2 MiB per writer
    with open(f, "wb") as fh:
        fh.truncate(2 * n * 4096)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(f), tag,
                               str(off), str(n)])
             for tag, off in (("A", 0), ("B", n * 4096))]
    for p in procs:
        assert p.wait(timeout=120) == 0
    data = f.read_bytes()
    assert data == b"A" * (n * 4096) + b"B" * (n * 4096)
    assert (sandbox.worktree / "shared.bin").read_bytes() == data


def test_two_appenders_lose_no_line(sandbox):
    f = sandbox.mnt / "append.log"
    f.write_text("")
    n = 2000
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(f), tag,
                               str(n)]) for tag in ("A", "B")]
    for p in procs:
        assert p.wait(timeout=120) == 0
    lines = f.read_text().splitlines()
    assert len(lines) == 2 * n
    for tag in ("A", "B"):
        mine = [ln for ln in lines if ln.startswith(tag + " ")]
        assert mine == [f"{tag} {i:06d} {'x' * 50}" for i in range(n)]
    assert (sandbox.worktree / "append.log").read_text().splitlines() == lines


# -- the worktree and the mount agree -------------------------------------------------


def poll(fn, want, within=VISIBLE_WITHIN):
    """Call fn until it returns want, at most `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        got = fn()
        if got == want:
            return time.monotonic() - (deadline - within)
        if time.monotonic() > deadline:
            raise AssertionError(f"after {within}s: got {got!r}, want {want!r}")
        time.sleep(0.01)


@pytest.mark.slow_remote
def test_worktree_changes_show_through_mount(sandbox):
    m, w = sandbox.mnt, sandbox.worktree
    (w / "ext").mkdir()
    poll(lambda: (m / "ext").is_dir(), True)

    # new file in a directory already listed
    assert "new.txt" not in os.listdir(m / "ext")
    (w / "ext" / "new.txt").write_text("new")
    poll(lambda: read_bytes(m / "ext" / "new.txt"), b"new")
    poll(lambda: "new.txt" in os.listdir(m / "ext"), True)

    # modified content of an already read (cached) file: same size...
    (w / "ext" / "c.txt").write_text("aaaa")
    poll(lambda: read_bytes(m / "ext" / "c.txt"), b"aaaa")
    for _ in range(3):
        assert read_bytes(m / "ext" / "c.txt") == b"aaaa"  # warm the cache
    with open(w / "ext" / "c.txt", "r+b") as fh:  # in place, same size
        fh.write(b"bbbb")
    poll(lambda: read_bytes(m / "ext" / "c.txt"), b"bbbb")
    # ...and a different size
    (w / "ext" / "c.txt").write_text("a longer content\n")
    poll(lambda: read_bytes(m / "ext" / "c.txt"), b"a longer content\n")
    poll(lambda: os.stat(m / "ext" / "c.txt").st_size, 17)

    # cached through an open descriptor kept open in the mount
    fd = os.open(m / "ext" / "c.txt", os.O_RDONLY)
    assert os.pread(fd, 100, 0) == b"a longer content\n"
    (w / "ext" / "c.txt").write_text("third version!!!!")   # same size
    poll(lambda: read_bytes(m / "ext" / "c.txt"), b"third version!!!!")
    os.close(fd)

    # deleted file
    (w / "ext" / "gone.txt").write_text("x")
    poll(lambda: (m / "ext" / "gone.txt").exists(), True)
    os.unlink(w / "ext" / "gone.txt")
    poll(lambda: (m / "ext" / "gone.txt").exists(), False)
    poll(lambda: "gone.txt" in os.listdir(m / "ext"), False)

    # renamed file
    os.rename(w / "ext" / "new.txt", w / "ext" / "renamed.txt")
    poll(lambda: sorted(os.listdir(m / "ext")), ["c.txt", "renamed.txt"])
    poll(lambda: read_bytes(m / "ext" / "renamed.txt"), b"new")
    poll(lambda: (m / "ext" / "new.txt").exists(), False)

    # attributes changed outside
    os.chmod(w / "ext" / "renamed.txt", 0o600)
    poll(lambda: stat.S_IMODE(os.stat(m / "ext" / "renamed.txt").st_mode),
         0o600)

    # a tracked file replaced by atomic rename (what editors and git do)
    (w / "README.md.tmp").write_text("# replaced\n")
    assert read_bytes(m / "README.md") == b"# sample\n"
    os.replace(w / "README.md.tmp", w / "README.md")
    poll(lambda: read_bytes(m / "README.md"), b"# replaced\n")

    # a whole directory removed
    os.unlink(w / "ext" / "c.txt")
    os.unlink(w / "ext" / "renamed.txt")
    os.rmdir(w / "ext")
    poll(lambda: (m / "ext").exists(), False)


def test_link_counts_follow_links_made_in_the_worktree(sandbox):
    """A link made or removed in the worktree changes the link count of
    the file's other names, which no change event names (inotify tells
    only a watch on the file itself): the mount's count must follow
    anyway, without the new name being looked up first."""
    m, w = sandbox.mnt, sandbox.worktree
    (w / "links").mkdir()
    poll(lambda: (m / "links").is_dir(), True)
    (m / "f").write_text("linked")
    for _ in range(2):                       # attributes cached
        assert os.stat(m / "f").st_nlink == 1

    os.link(w / "f", w / "links" / "g")      # a directory not looked into
    poll(lambda: os.stat(m / "f").st_nlink, 2)
    os.link(w / "f", w / "h")
    poll(lambda: os.stat(m / "f").st_nlink, 3)
    assert os.stat(m / "links" / "g").st_nlink == 3
    assert os.stat(m / "h").st_nlink == 3

    # removals of names the mount knows
    os.unlink(w / "links" / "g")
    poll(lambda: os.stat(m / "f").st_nlink, 2)
    os.unlink(w / "h")
    poll(lambda: os.stat(m / "f").st_nlink, 1)
    assert read_bytes(m / "f") == b"linked"

    # a descriptor on a file removed in the worktree still answers
    # fstat (a local disk says 0 links; remote keeps what it knew)
    fd = os.open(m / "f", os.O_RDONLY)
    try:
        os.unlink(w / "f")
        poll(lambda: (m / "f").exists(), False)
        assert os.fstat(fd).st_nlink in (0, 1)
    finally:
        os.close(fd)
    # ...and so does one on a directory moved away there
    fd = os.open(m / "links", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rename(w / "links", w / "moved")
        poll(lambda: (m / "links").exists(), False)
        assert stat.S_ISDIR(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def test_mount_writes_reach_worktree_at_once(sandbox):
    m, w = sandbox.mnt, sandbox.worktree
    with open(m / "w.txt", "wb") as fh:
        fh.write(b"written through the mount")
    assert (w / "w.txt").read_bytes() == b"written through the mount"
    fd = os.open(m / "w.txt", os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"+fsync")
    os.fsync(fd)
    assert (w / "w.txt").read_bytes().endswith(b"+fsync")
    os.close(fd)
    (m / "d1").mkdir()
    assert (w / "d1").is_dir()
    os.rename(m / "w.txt", m / "d1" / "moved.txt")
    assert not (w / "w.txt").exists() and (w / "d1" / "moved.txt").exists()
    os.chmod(m / "d1" / "moved.txt", 0o700)
    assert stat.S_IMODE(os.stat(w / "d1" / "moved.txt").st_mode) == 0o700
    os.truncate(m / "d1" / "moved.txt", 3)
    assert (w / "d1" / "moved.txt").read_bytes() == b"wri"
    os.symlink("moved.txt", m / "d1" / "ln")
    assert os.readlink(w / "d1" / "ln") == "moved.txt"
    os.unlink(m / "d1" / "moved.txt")
    assert not (w / "d1" / "moved.txt").exists()
    os.setxattr(m / "d1", "user.k", b"v")
    assert os.getxattr(w / "d1", "user.k") == b"v"



def _write_trunc(p, data):
    """What `echo DATA > P` does: open O_WRONLY|O_CREAT|O_TRUNC, write."""
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@pytest.mark.local_only("the local provider's zero-message opens")
def test_worktree_remove_then_write_through_mount(sandbox):
    """A file removed (or renamed) in the worktree, then written through
    the mount with O_TRUNC before the inotify invalidation of its cached
    dentry has arrived: the write lands in a new file of that name, as on
    ext4, never in the removed file (docs/design.md, "Zero-message
    opens")."""
    m, w = sandbox.mnt, sandbox.worktree
    lost = []
    for i in range(20):
        (w / "f").write_text("one\n")
        poll(lambda: read_bytes(m / "f"), b"one\n")
        time.sleep(0.2)
        os.unlink(w / "f")
        _write_trunc(m / "f", b"two\n")
        got = read_bytes(w / "f")   # writes are write-through
        if got != b"two\n":
            lost.append((i, got, read_bytes(m / "f")))
        os.unlink(w / "f")
    assert lost == [], f"{len(lost)} of 20 writes went nowhere: {lost}"

    # renamed away in the worktree: the old name is a new file, the
    # renamed one keeps its content
    for i in range(10):
        (w / "r").write_text("old\n")
        poll(lambda: read_bytes(m / "r"), b"old\n")
        os.rename(w / "r", w / "r~")
        _write_trunc(m / "r", b"new\n")
        assert read_bytes(w / "r~") == b"old\n", i
        assert read_bytes(w / "r") == b"new\n", i
        os.unlink(w / "r")
        os.unlink(w / "r~")


@pytest.mark.local_only("the local provider's zero-message opens")
def test_removed_in_worktree_still_writable_through_open_fd(sandbox):
    """POSIX: a file opened through the mount and then removed in the
    worktree stays usable through that descriptor (write, ftruncate,
    fstat); truncating by its old name says ENOENT; hard-linked files and
    files renamed through the mount still truncate by name."""
    m, w = sandbox.mnt, sandbox.worktree
    (w / "o").write_text("open\n")
    fd = os.open(m / "o", os.O_RDWR)
    try:
        assert os.read(fd, 100) == b"open\n"
        os.unlink(w / "o")
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"still here", 0)
        assert os.pread(fd, 100, 0) == b"still here"
        assert os.fstat(fd).st_nlink == 0
        assert err_of(os.truncate, m / "o", 0) == "ENOENT"
    finally:
        os.close(fd)
    assert not (w / "o").exists()

    # two names of one file: O_TRUNC through either works
    (w / "h1").write_text("linked\n")
    os.link(w / "h1", w / "h2")
    assert read_bytes(m / "h1") == read_bytes(m / "h2") == b"linked\n"
    _write_trunc(m / "h2", b"via h2\n")
    _write_trunc(m / "h1", b"via h1\n")
    assert read_bytes(w / "h2") == b"via h1\n"

    # renamed through the mount, then truncated by its new name
    (m / "a").write_text("a\n")
    os.rename(m / "a", m / "b")
    _write_trunc(m / "b", b"b\n")
    os.truncate(m / "b", 1)
    assert read_bytes(w / "b") == b"b"

@pytest.mark.slow_remote
def test_mount_shows_repository_files(sandbox):
    names = sorted(os.listdir(sandbox.mnt))
    assert {"README.md", "src", "docs", ".gitignore", ".git"} <= set(names)
    assert (sandbox.mnt / "src" / "main.c").read_text() == \
        "int main(void) { return 0; }\n"
    assert tree(sandbox.mnt / "src") == tree(sandbox.worktree / "src")


# -- names, depth, inode lifetime, parallel churn -----------------------------------


def test_odd_names(sandbox, plain_dir):
    names = ["with space", "tab\tname", "new\nline", "ünïcødé-✓", "a" * 255,
             "-dash", ".hidden", "semi;colon", "back\\slash", "q'uo\"te",
             "\x01ctrl", "*glob?[x]"]

    def scen(d):
        obs = []
        for n in names:
            (d / n).write_text(n)
        obs.append(sorted(os.listdir(d)))
        obs.append([read_bytes(d / n) == n.encode() for n in names])
        obs.append(err_of(os.open, d / ("b" * 256), os.O_CREAT | os.O_WRONLY))
        os.mkdir(d / "dir with space")
        os.rename(d / names[0], d / "dir with space" / names[3])
        obs.append(sorted(os.listdir(d / "dir with space")))
        return obs

    obs = run_both(sandbox, plain_dir, scen)
    assert obs[2] == "ENAMETOOLONG"



def test_name_too_long(sandbox, plain_dir):
    """A name of 256 bytes is ENAMETOOLONG for every operation, as on ext4,
    whether or not the directory was listed (cached) before; 255 works."""
    long, ok = "n" * 256, "o" * 255

    def ops(d):
        p = d / long
        return [
            err_of(os.stat, p),
            err_of(os.lstat, p),
            err_of(os.open, p, os.O_CREAT | os.O_WRONLY, 0o644),
            err_of(os.open, p, os.O_RDONLY),
            err_of(os.mkdir, p),
            err_of(os.mknod, p, stat.S_IFIFO | 0o644),
            err_of(os.symlink, "target", p),
            err_of(os.link, d / "f", p),
            err_of(os.rename, d / "f", p),
            err_of(os.rename, p, d / "g"),
            err_of(os.unlink, p),
            err_of(os.rmdir, p),
            err_of(os.listdir, p),
            err_of(os.stat, d / "sub" / long / "x"),
            err_of(os.getxattr, p, "user.x"),
        ]

    def scen(d):
        (d / "f").write_text("f")
        (d / "sub").mkdir()
        obs = [ops(d)]          # a directory not listed yet
        os.listdir(d)
        os.listdir(d / "sub")
        obs.append(ops(d))      # a listed (fully cached) directory
        (d / ok).write_text("255")
        obs.append(read_bytes(d / ok))
        obs.append(sorted(os.listdir(d)))
        # PATH_MAX: a path argument of 4096 bytes or more
        obs.append(err_of(os.stat, str(d) + "/" + "x/" * 2100))
        return obs

    obs = run_both(sandbox, plain_dir, scen)
    assert set(obs[0]) == {"ENAMETOOLONG"}, obs[0]


def test_deep_paths(sandbox, plain_dir):
    def scen(d):
        p = d
        for i in range(60):
            p = p / f"level-{i:02d}-{'x' * 40}"
        os.makedirs(p)
        (p / "leaf").write_text("deep")
        walked = sum(len(fs) for _, _, fs in os.walk(d))
        return [read_bytes(p / "leaf"), len(str(p.relative_to(d))), walked]

    run_both(sandbox, plain_dir, scen)


def drop_kernel_caches():
    """Make the kernel FORGET inodes (root only), as memory pressure does."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def rmdir_once_released(d, timeout=5.0):
    """rmdir(d), retried while it says ENOTEMPTY for up to `timeout` s:
    the kernel sends RELEASE after close() returns, and only then does a
    remote sandbox remove the hidden name of a file removed while open."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.rmdir(d)
            return
        except OSError as e:
            if e.errno != errno.ENOTEMPTY or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_file_replaced_while_open_then_listed(sandbox):
    """A file open through the mount and replaced by a rename over it
    lives on for its descriptor (remote sandboxes keep it under a hidden
    name), a listing of the directory meanwhile shows only the new file,
    and once the descriptor is closed nothing is left behind: the
    directory can be removed (the hidden file used to stay: ENOTEMPTY)."""
    d = sandbox.mnt / "replaced"
    d.mkdir()
    (d / "b").write_bytes(b"old")
    (d / "n").write_bytes(b"new")
    fd = os.open(d / "b", os.O_RDWR)
    try:
        os.rename(d / "n", d / "b")
        # A change made in the sandbox: the next listing asks it again.
        (sandbox.worktree / "replaced" / "other").write_bytes(b"o")
        deadline = time.monotonic() + VISIBLE_WITHIN
        while "other" not in os.listdir(d) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(os.listdir(d)) == ["b", "other"]
        assert os.pread(fd, 10, 0) == b"old"
        assert os.fstat(fd).st_nlink == 0
        assert (d / "b").read_bytes() == b"new"
    finally:
        os.close(fd)
    os.unlink(d / "b")
    os.unlink(d / "other")
    rmdir_once_released(d)
    assert not (sandbox.worktree / "replaced").exists()


def silly_names(root):
    """Hidden names of files removed while open (remote sandboxes) left
    anywhere below root."""
    return sorted(os.path.relpath(os.path.join(dp, n), root)
                  for dp, dns, fns in os.walk(root) for n in dns + fns
                  if n.startswith(".sbx-silly."))


@pytest.mark.parametrize("how", ["rmdir", "rename_over"])
def test_directory_removed_with_a_file_open_in_it(sandbox, plain_dir, how):
    """A directory whose only file was unlinked while open can be removed
    (or replaced by a rename) at once, as on a local disk; the open file
    still reads and writes, and its last close leaves nothing behind.
    Remote sandboxes said ENOTEMPTY: the file's hidden name was in it."""
    def scen(d):
        (d / "t").mkdir()
        (d / "t" / "f").write_bytes(b"data")
        fd = os.open(d / "t" / "f", os.O_RDWR)
        try:
            os.unlink(d / "t" / "f")
            if how == "rmdir":
                obs = [err_of(os.rmdir, d / "t")]
            else:
                (d / "u").mkdir()
                obs = [err_of(os.rename, d / "u", d / "t")]
            obs.append(lstat_facts(d / "t"))
            obs.append(sorted(os.listdir(d)))
            obs.append(os.pread(fd, 10, 0))
            obs.append(os.pwrite(fd, b"more", 4))
            obs.append(os.pread(fd, 10, 0))
            st = os.fstat(fd)
            obs.append((st.st_size, st.st_nlink))
        finally:
            os.close(fd)
        return obs

    obs = run_both(sandbox, plain_dir, scen, how)
    assert obs[0] == "ok"
    assert obs[5] == b"datamore" and obs[6] == (8, 0)
    # The last close (an asynchronous RELEASE) removes the hidden file.
    deadline = time.monotonic() + 5
    while silly_names(sandbox.worktree) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert silly_names(sandbox.worktree) == []
    assert ".sbx-silly" not in " ".join(os.listdir(sandbox.mnt))


def test_linked_file_opened_after_its_first_name_went(sandbox, plain_dir):
    """link(c, b), unlink(c), open(b), unlink(b): the descriptor keeps the
    file, fsync and I/O through it work, and nothing is left once it is
    closed (on remote sandboxes the open counted on the removed name c, so
    the unlink of b removed the file for good: fsync said ENOENT)."""
    def scen(d):
        (d / "c").write_bytes(b"data")
        os.link(d / "c", d / "b")
        os.unlink(d / "c")
        fd = os.open(d / "b", os.O_RDWR | os.O_APPEND)
        obs = []
        try:
            os.unlink(d / "b")
            obs.append(attempt(lambda: os.write(fd, b"MORE")))
            obs.append(attempt(lambda: os.fsync(fd)))
            obs.append(attempt(lambda: os.pread(fd, 100, 0)))
            obs.append(os.fstat(fd).st_nlink)
            obs.append(sorted(os.listdir(d)))
        finally:
            os.close(fd)
        return obs

    obs = run_both(sandbox, plain_dir, scen, label="link-reopen")
    assert obs[:4] == [("ok", 4), ("ok", None), ("ok", b"dataMORE"), 0], obs
    d = sandbox.mnt / "link-reopen"
    rmdir_once_released(d)


def test_link_to_a_file_with_a_name_removed_while_open(sandbox, plain_dir):
    """A file with one name removed while open (hidden on remote sandboxes)
    gets a new link: the link count the link reports, and fstat after it,
    leave the hidden name out (random tester, seed 766870628: 3 where a
    local disk says 2)."""
    def scen(d):
        (d / "x").mkdir()
        (d / "sub").mkdir()
        fd1 = os.open(d / "x" / "a", os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                      0o600)
        try:
            os.link(d / "x" / "a", d / "sub" / "a")
            os.unlink(d / "x" / "a")
            fd2 = os.open(d / "sub" / "a", os.O_RDWR | os.O_APPEND)
            try:
                os.link(d / "sub" / "a", d / "x" / "a")
                obs = [os.fstat(fd2).st_nlink, os.fstat(fd1).st_nlink,
                       os.stat(d / "x" / "a").st_nlink,
                       os.stat(d / "sub" / "a").st_nlink]
                os.unlink(d / "sub" / "a")
                obs += [os.fstat(fd2).st_nlink, os.stat(d / "x" / "a").st_nlink]
            finally:
                os.close(fd2)
        finally:
            os.close(fd1)
        obs.append(sorted(os.listdir(d / "x")))
        return obs

    obs = run_both(sandbox, plain_dir, scen, label="link-hidden")
    assert obs[:6] == [2, 2, 2, 2, 1, 1], obs


# The unlinked-but-open f7 once read ENOENT on remote sandboxes: the cache
# kept the wrapped file open at its old path across the silly rename (it
# now opens it per I/O at the current path; docs/design.md).
@pytest.mark.skipif(os.geteuid() != 0, reason="dropping caches needs root")
def test_inode_lifetime_across_forget(sandbox):
    m = sandbox.mnt / "forget"
    m.mkdir()
    for i in range(2000):
        (m / f"f{i}").write_text(str(i))
    keep = os.open(m / "f7", os.O_RDWR)        # an open file outlives FORGET
    os.chdir(m)                                 # so does a cwd
    try:
        st = {i: os.stat(m / f"f{i}").st_ino for i in range(0, 2000, 100)}
        drop_kernel_caches()
        for i, ino in st.items():
            assert os.stat(m / f"f{i}").st_ino == ino
        assert os.pread(keep, 10, 0) == b"7"
        os.pwrite(keep, b"77", 0)
        drop_kernel_caches()
        assert (m / "f7").read_text() == "77"
        assert open("f8").read() == "8"         # relative to the cwd
        os.rename(m / "f9", m / "nine")
        drop_kernel_caches()
        assert (m / "nine").read_text() == "9"
        for i in range(0, 2000, 2):
            if i != 8:
                os.unlink(m / f"f{i}")
        drop_kernel_caches()
        assert len(os.listdir(m)) == 1000 + 1
        os.unlink(m / "f7")
        assert os.pread(keep, 10, 0) == b"77"   # unlinked but open
    finally:
        os.chdir("/")
        os.close(keep)
    drop_kernel_caches()
    want = {f"f{i}" for i in range(1, 2000, 2)} - {"f7", "f9"} | {"f8", "nine"}
    # f7's hidden name (remote) goes at its last close, which the kernel
    # sends after close() has returned (RELEASE is asynchronous): CI saw
    # `.sbx-silly.*` still there once (kubernetes, 2026-12-07).
    poll(lambda: set(os.listdir(sandbox.worktree / "forget")), want,
         within=10)
    assert set(os.listdir(m)) == want


@pytest.mark.slow_remote
def test_worktree_changes_under_concurrent_listing(sandbox):
    """Changes made in the worktree while the mount is being listed and
    looked up all the time: no stale name may outlive the deadline (a reply
    built before a change and sent after its invalidation would otherwise
    keep one for the whole cache timeout)."""
    import threading

    m, w = sandbox.mnt / "busy", sandbox.worktree / "busy"
    w.mkdir()
    poll(lambda: m.is_dir(), True)
    stop = threading.Event()
    errors = []

    def lister():
        while not stop.is_set():
            try:
                for name in os.listdir(m):
                    os.path.exists(m / name)
            except OSError as e:   # a name may vanish between the two calls
                if e.errno != 2:
                    errors.append(e)

    threads = [threading.Thread(target=lister) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(25):
            (w / f"f{i}").write_text(str(i))
            poll(lambda: (m / f"f{i}").exists(), True)
            os.rename(w / f"f{i}", w / f"g{i}")
            poll(lambda: (m / f"f{i}").exists(), False)
            poll(lambda: read_bytes(m / f"g{i}"), str(i).encode())
            os.unlink(w / f"g{i}")
            poll(lambda: (m / f"g{i}").exists(), False)
            poll(lambda: os.listdir(m), [])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []


def test_rename_directory_with_open_files(sandbox, plain_dir):
    def scen(d):
        (d / "a" / "b").mkdir(parents=True)
        (d / "a" / "b" / "f").write_text("inside")
        fd = os.open(d / "a" / "b" / "f", os.O_RDWR)
        dfd = os.open(d / "a" / "b", os.O_RDONLY | os.O_DIRECTORY)
        os.rename(d / "a", d / "z")
        os.pwrite(fd, b"I", 0)
        obs = [read_bytes(d / "z" / "b" / "f"), lstat_facts(d / "a")]
        # openat relative to a directory that moved
        fd2 = os.open("f", os.O_RDONLY, dir_fd=dfd)
        obs.append(os.read(fd2, 100))
        os.mkdir("new", dir_fd=dfd)
        obs.append(sorted(os.listdir(d / "z" / "b")))
        for x in (fd, fd2, dfd):
            os.close(x)
        return obs

    run_both(sandbox, plain_dir, scen)


CHURN = r"""
import os, sys
root, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
d = os.path.join(root, tag)
os.makedirs(d)
for i in range(n):
    p = os.path.join(d, f"f{i}")
    data = f"{tag}-{i}-".encode() * (1 + i % 50)
    with open(p, "wb") as f:
        f.write(data)
    with open(p, "rb") as f:
        assert f.read() == data, p
    if i % 3 == 0:
        os.rename(p, p + ".r")
    elif i % 3 == 1:
        os.unlink(p)
    os.listdir(d)
"""


# Remote: six parallel churners once crashed the daemon about once in ten
# runs (a write-back buffer pushed after its file was freed; open files are
# now reference counted, docs/design.md "Write-back").
def test_parallel_churn(sandbox):
    """Several processes creating, renaming, deleting, listing at once."""
    root = sandbox.mnt / "churn"
    root.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", CHURN, str(root),
                               f"p{k}", "600"], stderr=subprocess.PIPE)
             for k in range(6)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    for k in range(6):
        names = sorted(os.listdir(root / f"p{k}"))
        want = sorted([f"f{i}.r" for i in range(0, 600, 3)] +
                      [f"f{i}" for i in range(2, 600, 3)])
        assert names == want
        assert names == sorted(os.listdir(sandbox.worktree / "churn" / f"p{k}"))
        i = 599
        assert (root / f"p{k}" / f"f{i}").read_bytes() == \
            f"p{k}-{i}-".encode() * (1 + i % 50)


# -- quick answers of the caching layer (issue 15) ------------------------------


def test_lseek_dense_buffered_and_past_eof(sandbox, plain_dir):
    """SEEK_DATA / SEEK_HOLE of files without holes (the cache answers from
    the size it knows), of a file with buffered writes (pushed and asked),
    at and past EOF (ENXIO), and of an empty file: as a plain directory."""
    def scen(d):
        obs = []
        write_file(d / "dense", b"x" * 200000)
        write_file(d / "one", b"1")
        write_file(d / "empty", b"")
        for name in ("dense", "one", "empty"):
            fd = os.open(d / name, os.O_RDONLY)
            size = os.fstat(fd).st_size
            for off in (0, 1, 4096, size - 1, size, size + 1, 10 * MiB):
                obs.append([name, off,
                            attempt(os.lseek, fd, off, os.SEEK_DATA),
                            attempt(os.lseek, fd, off, os.SEEK_HOLE)])
            os.close(fd)
        # buffered writes that grow the file without a hole, then seek on
        # the writing descriptor and on another one
        fd = os.open(d / "dense", os.O_RDWR)
        os.pwrite(fd, b"y" * 100, 200000)
        fd2 = os.open(d / "dense", os.O_RDONLY)
        for f in (fd, fd2):
            for off in (0, 199999, 200050, 200100, 300000):
                obs.append([off, attempt(os.lseek, f, off, os.SEEK_DATA),
                            attempt(os.lseek, f, off, os.SEEK_HOLE)])
        os.close(fd2)
        os.close(fd)
        return obs

    obs = run_both(sandbox, plain_dir, scen)
    assert obs[0] == ["dense", 0, ("ok", 0), ("ok", 200000)]


@pytest.mark.providers("remote")
def test_foreign_xattrs_not_exposed(sandbox):
    """security.* and system.* of a remote sandbox are not exposed
    (docs/design.md, "Foreign extended attributes"): get and set answer
    EOPNOTSUPP, as on a file system without them, and they are not listed.
    (A plain ext4 directory answers ENODATA for an absent security.selinux:
    "supported, none here", after which `ls -l` asks every file again; after
    EOPNOTSUPP coreutils stops asking for the device.)  user.* pass."""
    import errno
    ENOTSUP = errno.errorcode[errno.EOPNOTSUPP]
    f = sandbox.mnt / "xattr-foreign"
    write_file(f, b"x")
    for name in ("security.selinux", "system.posix_acl_access",
                 "security.capability"):
        assert err_of(os.getxattr, f, name) == ENOTSUP, name
        assert err_of(os.getxattr, sandbox.mnt, name) == ENOTSUP, name
    assert err_of(os.setxattr, f, "security.test", b"v") == ENOTSUP
    assert not [n for n in os.listxattr(f)
                if n.startswith(("security.", "system."))]
    os.setxattr(f, "user.kept", b"1")
    assert "user.kept" in os.listxattr(f)
    assert os.getxattr(f, "user.kept") == b"1"
