"""Tools people run on the mount: git, vim, sed -i, Python atomic saves.

git here is the plain local git CLI with its working directory in the mount
(the exec shim, which forwards commands into the sandbox, is tested in
test_exec.py).
"""

import os
import shutil
import stat
import subprocess
import sys

import pytest

from testenv import read_bytes

# Every test here runs on a local sandbox and on a remote one (sbx-agent on
# loopback, its root a clone of the repository on branch sbx/NAME); those
# marked slow_remote also through the latency proxy at 20 ms RTT.
pytestmark = pytest.mark.providers("local", "remote")


def git(sandbox, *args, cwd=None, check=True):
    r = sandbox.env.git(*args, cwd=cwd or sandbox.mnt, check=False)
    if check:
        assert r.rc == 0, str(r)
    return r


@pytest.mark.slow_remote
def test_git_status_add_commit_log(sandbox):
    r = git(sandbox, "status")
    assert f"On branch sbx/{sandbox.name}" in r.out
    assert "nothing to commit, working tree clean" in r.out

    (sandbox.mnt / "src" / "main.c").write_text("int main(void) { return 1; }\n")
    (sandbox.mnt / "new.txt").write_text("brand new\n")
    (sandbox.mnt / "junk.o").write_text("ignored\n")
    r = git(sandbox, "status", "--porcelain=v1")
    assert sorted(r.out.splitlines()) == [" M src/main.c", "?? new.txt"]
    r = git(sandbox, "status")
    assert "modified:   src/main.c" in r.out and "new.txt" in r.out

    git(sandbox, "add", "-A")
    r = git(sandbox, "status", "--porcelain=v1")
    assert sorted(r.out.splitlines()) == ["A  new.txt", "M  src/main.c"]
    r = git(sandbox, "diff", "--cached", "--stat")
    assert "2 files changed" in r.out

    r = git(sandbox, "commit", "-m", "change from the mount")
    assert "change from the mount" in r.out
    r = git(sandbox, "log", "--oneline")
    lines = r.out.splitlines()
    assert len(lines) == 2 and "change from the mount" in lines[0]
    assert git(sandbox, "status", "--porcelain").out == ""

    # the commit is on the session branch of the source repository (local
    # only: a remote sandbox commits to its own repository, the agent root)
    r = sandbox.env.git("log", "--format=%s", "-1", f"sbx/{sandbox.name}",
                        cwd=sandbox.repo if sandbox.provider == "local"
                        else sandbox.worktree)
    assert r.out.strip() == "change from the mount"
    # and the worktree (seen directly) agrees
    assert sandbox.env.git("status", "--porcelain", cwd=sandbox.worktree).out == ""


def test_git_checkout_branch_and_stash(sandbox):
    r = git(sandbox, "checkout", "-b", "feature")
    assert "Switched to a new branch 'feature'" in r.err + r.out
    assert git(sandbox, "branch", "--show-current").out.strip() == "feature"

    (sandbox.mnt / "docs" / "notes.txt").write_text("one\nTWO\nthree\n")
    (sandbox.mnt / "scratch.txt").write_text("untracked\n")
    r = git(sandbox, "stash", "push", "-u", "-m", "wip")
    assert "Saved working directory" in r.out
    assert (sandbox.mnt / "docs" / "notes.txt").read_text() == "one\ntwo\nthree\n"
    assert not (sandbox.mnt / "scratch.txt").exists()
    assert git(sandbox, "status", "--porcelain").out == ""
    assert "wip" in git(sandbox, "stash", "list").out

    git(sandbox, "stash", "pop")
    assert (sandbox.mnt / "docs" / "notes.txt").read_text() == "one\nTWO\nthree\n"
    assert (sandbox.mnt / "scratch.txt").read_text() == "untracked\n"
    r = git(sandbox, "status", "--porcelain")
    assert sorted(r.out.splitlines()) == [" M docs/notes.txt", "?? scratch.txt"]

    git(sandbox, "commit", "-am", "on feature")
    git(sandbox, "checkout", f"sbx/{sandbox.name}")
    assert (sandbox.mnt / "docs" / "notes.txt").read_text() == "one\ntwo\nthree\n"
    git(sandbox, "checkout", "feature")
    assert (sandbox.mnt / "docs" / "notes.txt").read_text() == "one\nTWO\nthree\n"
    r = git(sandbox, "log", "--oneline", "feature")
    assert "on feature" in r.out


def test_git_many_files_and_diff(sandbox):
    d = sandbox.mnt / "gen"
    d.mkdir()
    for i in range(500):
        (d / f"f{i:03d}.txt").write_text(f"line {i}\n")
    git(sandbox, "add", "gen")
    git(sandbox, "commit", "-qm", "generated")
    (d / "f123.txt").write_text("line 123 changed\n")
    os.unlink(d / "f007.txt")
    r = git(sandbox, "status", "--porcelain")
    assert sorted(r.out.splitlines()) == [" D gen/f007.txt", " M gen/f123.txt"]
    r = git(sandbox, "diff", "gen/f123.txt")
    assert "-line 123\n+line 123 changed" in r.out
    git(sandbox, "checkout", "--", "gen")
    assert git(sandbox, "status", "--porcelain").out == ""
    assert (d / "f007.txt").read_text() == "line 7\n"


def test_git_sees_worktree_changes_made_outside(sandbox):
    """A tool writing the worktree directly (an agent in the sandbox)."""
    (sandbox.worktree / "outside.txt").write_text("x\n")
    import time
    deadline = time.monotonic() + 1.0
    while True:
        r = git(sandbox, "status", "--porcelain")
        if "?? outside.txt" in r.out or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert "?? outside.txt" in r.out


# -- editors ---------------------------------------------------------------------


VIM = shutil.which("vim") or shutil.which("vim.basic")


def vim(sandbox, path, *cmds, vimrc=True):
    """Run vim -es on path (cwd: its directory).  vimrc=False: -u NONE."""
    args = [VIM, "-es", "-i", "NONE"]
    if not vimrc:
        args[1:1] = ["-u", "NONE", "-N"]
    for c in cmds:
        args += ["-c", c]
    args += ["-c", "wq", os.path.basename(path)]
    r = sandbox.env.run(args, cwd=os.path.dirname(path), timeout=60)
    assert r.rc == 0, str(r)
    return r


@pytest.mark.skipif(VIM is None, reason="vim is not installed (apt install vim)")
def test_vim_swapfile_and_atomic_rename(sandbox, tmp_path):
    f = sandbox.mnt / "docs" / "notes.txt"
    os.chmod(f, 0o640)
    ino_before = os.stat(sandbox.worktree / "docs" / "notes.txt").st_ino
    seen = tmp_path / "swaps"
    # swapfile in the file's directory; backupcopy=no: rename the original
    # away and write a new file (bsk= because the tree is below /tmp, which
    # is in vim's default 'backupskip').
    vim(sandbox, f,
        "set swapfile directory=. backupcopy=no writebackup backupskip=",
        f"call writefile(glob('.*.sw?', 1, 1), '{seen}')",
        "%s/two/2/", vimrc=False)
    assert seen.read_text().split() == [".notes.txt.swp"]
    assert f.read_text() == "one\n2\nthree\n"
    wt = sandbox.worktree / "docs" / "notes.txt"
    assert wt.read_text() == "one\n2\nthree\n"
    assert os.stat(wt).st_ino != ino_before, "vim did not write a new file"
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o640
    assert sorted(os.listdir(f.parent)) == ["notes.txt"], "leftover files"
    r = sandbox.env.git("status", "--porcelain", cwd=sandbox.mnt)
    assert r.out.strip() == "M docs/notes.txt"


@pytest.mark.skipif(VIM is None, reason="vim is not installed (apt install vim)")
@pytest.mark.slow_remote
def test_vim_default_settings(sandbox):
    f = sandbox.mnt / "src" / "main.c"
    vim(sandbox, f, "%s/return 0/return 42/", "$put ='/* end */'")
    want = "int main(void) { return 42; }\n/* end */\n"
    assert f.read_text() == want
    assert (sandbox.worktree / "src" / "main.c").read_text() == want
    assert sorted(os.listdir(f.parent)) == ["main.c", "util.h"]


@pytest.mark.skipif(VIM is None, reason="vim is not installed (apt install vim)")
def test_vim_backupcopy_yes_writes_in_place(sandbox):
    f = sandbox.mnt / "README.md"
    ino = os.stat(f).st_ino
    vim(sandbox, f, "set backupcopy=yes backupskip=", "$put ='more'",
        vimrc=False)
    assert f.read_text() == "# sample\nmore\n"
    assert os.stat(f).st_ino == ino


def test_sed_in_place(sandbox):
    f = sandbox.mnt / "docs" / "notes.txt"
    os.chmod(f, 0o600)
    r = sandbox.env.run(["sed", "-i", "s/three/THREE/; 1i\\header", str(f)])
    assert r.rc == 0, str(r)
    assert f.read_text() == "header\none\ntwo\nTHREE\n"
    assert (sandbox.worktree / "docs" / "notes.txt").read_text() == \
        "header\none\ntwo\nTHREE\n"
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    assert sorted(os.listdir(f.parent)) == ["notes.txt"], "sed temp left"
    # sed -i with a backup suffix
    r = sandbox.env.run(["sed", "-i.bak", "s/header/HEADER/", str(f)])
    assert r.rc == 0, str(r)
    assert read_bytes(f.parent / "notes.txt.bak") == b"header\none\ntwo\nTHREE\n"
    assert f.read_text().startswith("HEADER\n")


@pytest.mark.slow_remote
def test_python_os_replace_atomic_save(sandbox):
    f = sandbox.mnt / "config.json"
    f.write_text('{"v": 1}\n')
    old = open(f, "rb")
    tmp = sandbox.mnt / ".config.json.tmp"
    with open(tmp, "w") as fh:
        fh.write('{"v": 2}\n')
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, f)
    assert f.read_text() == '{"v": 2}\n'
    assert (sandbox.worktree / "config.json").read_text() == '{"v": 2}\n'
    assert not tmp.exists() and not (sandbox.worktree / ".config.json.tmp").exists()
    assert old.read() == b'{"v": 1}\n'  # an open descriptor keeps the old file
    old.close()
    # many saves in a row, each read back at once (no stale cache)
    for i in range(50):
        with open(tmp, "w") as fh:
            fh.write(f'{{"v": {i}}}\n')
        os.replace(tmp, f)
        assert f.read_text() == f'{{"v": {i}}}\n'


def test_python_tempfile_save_in_subprocess(sandbox):
    """A separate process saving atomically; this one reads right after."""
    code = ("import os,sys,tempfile;d=sys.argv[1];"
            "fd,t=tempfile.mkstemp(dir=d);os.write(fd,b'saved');os.close(fd);"
            "os.replace(t,os.path.join(d,'out.txt'))")
    for _ in range(5):
        subprocess.run([sys.executable, "-c", code, str(sandbox.mnt)],
                       check=True)
        assert (sandbox.mnt / "out.txt").read_bytes() == b"saved"
    assert [n for n in os.listdir(sandbox.mnt) if n.startswith("tmp")] == []
