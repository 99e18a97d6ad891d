"""The exec shim end to end: sbx-exec / sbx exec against a real daemon.

Streams are tested in both transports (docs/exec.md): "fds" (the client's
descriptors handed to the command, the default for a local sandbox) and
"framed" (STDIN/STDOUT/STDERR frames, forced with SBX_EXEC_FRAMED=1; what a
remote sandbox uses).
"""

import concurrent.futures
import os
import signal
import subprocess
import time

import pytest

from exec_util import (Tmux, have, path_with, run_bytes, sha256, shim,
                       shim_dir, wait_for)

MODES = {"fds": {}, "framed": {"SBX_EXEC_FRAMED": "1"}}
# git identity comes from the test environment (no ~/.gitconfig): forward it
# the documented way.
GIT_ID = {"SBX_EXEC_ENV": "GIT_AUTHOR_NAME,GIT_AUTHOR_EMAIL,"
                          "GIT_COMMITTER_NAME GIT_COMMITTER_EMAIL"}


@pytest.fixture(params=sorted(MODES))
def mode(request):
    return MODES[request.param]


def sx(sb, *args, cwd=None, **kw):
    """Run sbx-exec ARGS with cwd in the mount (default: its root)."""
    return run_bytes(sb.env, [shim(sb.env), *args],
                     cwd=cwd or sb.mnt, **kw)


# -- exit status ---------------------------------------------------------------


def test_exit_codes_0_to_255(sandbox):
    for code in range(256):
        r = sx(sandbox, "sh", "-c", f"exit {code}")
        assert r.returncode == code, (code, r.stderr)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL,
                                 signal.SIGSEGV, signal.SIGINT])
def test_signal_death_is_128_plus_n(sandbox, sig):
    r = sx(sandbox, "sh", "-c", f"kill -{int(sig)} $$")
    assert r.returncode == 128 + int(sig), r.stderr


def test_command_not_found_127_and_not_executable_126(sandbox):
    r = sx(sandbox, "no-such-tool-sbx")
    assert r.returncode == 127
    assert b"command not found" in r.stderr
    (sandbox.mnt / "noexec.sh").write_text("echo hi\n")
    r = sx(sandbox, "./noexec.sh")
    assert r.returncode == 126, r.stderr


# -- streams -------------------------------------------------------------------


def test_stdin_streamed_with_eof(sandbox, mode):
    data = os.urandom(3 << 20)
    r = sx(sandbox, "sh", "-c", "cat; echo END", input=data, extra_env=mode)
    assert r.returncode == 0, r.stderr
    assert r.stdout == data + b"END\n"
    r = sx(sandbox, "wc", "-c", input=b"", extra_env=mode)
    assert r.stdout.strip() == b"0"


def test_stdout_stderr_100mb_interleaved_exact(sandbox, mode):
    # Two different deterministic streams, written in alternating chunks of
    # varying size; compared by sha256.
    gen = r'''
import sys, hashlib
o, e = sys.stdout.buffer, sys.stderr.buffer
ho, he = hashlib.sha256(), hashlib.sha256()
n, i = 0, 0
while n < 100 * 1024 * 1024:
    size = 1 + (i * 7919) % 65536
    a = bytes([(i + k) % 251 for k in range(256)]) * (size // 256 + 1)
    a = a[:size]
    b = a[::-1]
    o.write(a); ho.update(a)
    e.write(b); he.update(b)
    if i % 3 == 0:
        o.flush(); e.flush()
    n += size; i += 1
o.flush(); e.flush()
open("hashes", "w").write(ho.hexdigest() + " " + he.hexdigest())
'''
    r = sx(sandbox, "python3", "-c", gen, extra_env=mode, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    want_o, want_e = (sandbox.worktree / "hashes").read_text().split()
    assert len(r.stdout) >= 100 << 20
    assert sha256(r.stdout) == want_o
    assert sha256(r.stderr) == want_e


def test_binary_output(sandbox, mode):
    blob = bytes(range(256)) * 1024
    (sandbox.worktree / "blob.bin").write_bytes(blob)
    r = sx(sandbox, "cat", "blob.bin", extra_env=mode)
    assert r.stdout == blob
    r = sx(sandbox, "sh", "-c", "cat blob.bin >&2", extra_env=mode)
    assert r.stderr == blob and r.stdout == b""


def test_no_descriptor_leaks_into_command(sandbox, mode):
    r = sx(sandbox, "sh", "-c", 'ls /proc/$$/fd', extra_env=mode)
    assert sorted(r.stdout.split()) == [b"0", b"1", b"2"]


def test_argv_exact_no_shell(sandbox):
    args = ["a b", "", "'q'", '"dq"', "$HOME", "*", "semi;colon", "back\\sl",
            "new\nline", "-n"]
    r = sx(sandbox, "python3", "-c",
           "import sys; print(repr(sys.argv[1:]))", *args)
    assert r.stdout.decode().strip() == repr(args)


def test_environment_policy(sandbox):
    env = {"LC_ALL": "C", "TERM": "dumb", "SECRET_TOKEN": "x",
           "MY_VAR": "y", "SBX_EXEC_ENV": "MY_VAR"}
    r = sx(sandbox, "sh", "-c",
           'echo "$LC_ALL|$TERM|${SECRET_TOKEN-unset}|$MY_VAR|$SBX_SESSION"',
           extra_env=env)
    assert r.stdout.decode().strip() == f"C|dumb|unset|y|{sandbox.name}"
    r = run_bytes(sandbox.env, [sandbox.env.bin("sbx"), "exec", sandbox.name,
                                "-e", "K=V=W", "--", "sh", "-c", 'echo "$K"'])
    assert r.stdout == b"V=W\n", r.stderr


# -- signals -------------------------------------------------------------------


def test_ctrl_c_reaches_remote_process(sandbox, mode):
    script = ('trap "echo got-int > marker; exit 7" INT; echo ready; '
              'while :; do sleep 0.05; done')
    e = dict(sandbox.env.env, **mode)
    p = subprocess.Popen([shim(sandbox.env), "sh", "-c", script],
                         cwd=sandbox.mnt, env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert p.stdout.readline() == b"ready\n"
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=10)
    finally:
        p.kill()
        p.wait()
    assert rc == 7
    assert (sandbox.worktree / "marker").read_text() == "got-int\n"


def test_sigterm_forwarded_kills_remote_group(sandbox):
    e = dict(sandbox.env.env)
    p = subprocess.Popen([shim(sandbox.env), "sh", "-c",
                          "sleep 30 & echo $!; wait"],
                         cwd=sandbox.mnt, env=e, stdout=subprocess.PIPE,
                         stdin=subprocess.DEVNULL)
    child = int(p.stdout.readline())
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 128 + signal.SIGTERM
    assert wait_for(lambda: not os.path.exists(f"/proc/{child}")
                    or "Z" in open(f"/proc/{child}/stat").read().split()[2],
                    timeout=5)


# -- terminal ------------------------------------------------------------------


@pytest.mark.skipif(not have("tmux"), reason="tmux not installed")
def test_pty_session_through_tmux_with_resize(sandbox):
    t = Tmux(sandbox.env)
    marker = sandbox.env.root / "after.txt"
    cmd = (f"'{shim(sandbox.env)}' bash --norc --noprofile -i; "
           f"echo rc=$? > '{marker}'; stty -a >> '{marker}'; sleep 60")
    t.start(cmd, sandbox.mnt, cols=80, rows=24)
    try:
        t.keys("PS1='sbx$ '", "Enter")
        t.keys("tty; stty size; echo $((6*7))", "Enter")
        t.wait_text("24 80")
        t.wait_text("42")
        screen = t.capture()
        assert "/dev/pts/" in screen
        # Inside the sandbox: the working directory is the worktree.
        t.keys(f"test \"$PWD\" = '{sandbox.worktree}' && echo IN-$((1))-WT",
               "Enter")
        t.wait_text("IN-1-WT")
        t.tmux("resize-window", "-t", "t", "-x", 100, "-y", 30)

        # The new size travels as SIGWINCH to the sandbox's terminal: ask
        # until it shows there.
        def resized():
            t.keys("clear; stty size", "Enter")
            return wait_for(lambda: "30 100" in t.capture(), timeout=1.0)
        assert wait_for(resized, timeout=10, step=0), t.capture()
        # ^C is a byte for the remote terminal: interrupts sleep only.
        # (SLEEP-2 is output, not the echo of the typed line: the shell
        # is running the command line when it shows.)
        t.keys("echo SLEEP-$((1+1)); sleep 30", "Enter")
        t.wait_text("SLEEP-2")
        t.keys("C-c")
        t.keys("echo still-here", "Enter")
        t.wait_text("still-here")
        t.keys("exit 3", "Enter")
        assert wait_for(lambda: marker.exists()
                        and "icanon" in marker.read_text(), timeout=10)
        text = marker.read_text()
        assert text.startswith("rc=3")
        # The local terminal is back in cooked mode.
        assert " icanon" in text and " echo" in text, text
    finally:
        t.kill()


# -- concurrency ---------------------------------------------------------------


def test_20_concurrent_execs(sandbox):
    def one(i):
        return sx(sandbox, "sh", "-c", f'sleep 0.3; echo "job {i}"; exit {i}')

    with concurrent.futures.ThreadPoolExecutor(20) as ex:
        results = list(ex.map(one, range(20)))
    for i, r in enumerate(results):
        assert r.returncode == i, r.stderr
        assert r.stdout == f"job {i}\n".encode()


# -- paths ---------------------------------------------------------------------


def test_cwd_and_absolute_args_translated(sandbox):
    sub = sandbox.mnt / "src"
    r = sx(sandbox, "pwd", cwd=sub)
    assert r.stdout.decode().strip() == str(sandbox.worktree / "src")
    r = sx(sandbox, "sh", "-c", 'printf "%s\\n" "$@"', "sh",
           str(sandbox.mnt / "src" / "main.c"), f"--file={sandbox.mnt}/docs",
           str(sandbox.mnt), "/etc/hostname", "relative/x")
    assert r.stdout.decode().split("\n")[:5] == [
        str(sandbox.worktree / "src" / "main.c"),
        f"--file={sandbox.worktree}/docs",
        str(sandbox.worktree), "/etc/hostname", "relative/x"]
    r = sx(sandbox, "cat", str(sandbox.mnt / "src" / "util.h"))
    assert r.stdout == b"#define UTIL 1\n"
    r = sx(sandbox, "-C", str(sub), "pwd", cwd="/")
    assert r.stdout.decode().strip() == str(sandbox.worktree / "src")


def test_outside_a_mount_runs_locally(sandbox, tmp_path):
    r = sx(sandbox, "sh", "-c", "pwd; echo ${SBX_SESSION-none}", cwd=tmp_path)
    assert r.stdout.decode().split() == [str(tmp_path), "none"]


def test_recursion_guard(sandbox, tmp_path):
    d = tmp_path / "onlyshim"
    d.mkdir()
    os.symlink(shim(sandbox.env), d / "tool-that-is-nowhere")
    os.symlink(shim(sandbox.env), d / "true")
    env = {"PATH": f"{d}:{d}:/usr/bin:/bin"}
    start = time.monotonic()
    r = run_bytes(sandbox.env, [d / "tool-that-is-nowhere"], cwd=tmp_path,
                  extra_env=env, timeout=10)
    assert r.returncode == 127
    assert b"command not found" in r.stderr
    assert time.monotonic() - start < 5
    # A shim named like a real tool finds the real one, outside a mount.
    r = run_bytes(sandbox.env, ["true"], cwd=tmp_path, extra_env=env)
    assert r.returncode == 0
    # A chain of shim calls is bounded by SBX_SHIM_DEPTH.
    r = run_bytes(sandbox.env, [d / "true"], cwd=tmp_path,
                  extra_env=dict(env, SBX_SHIM_DEPTH="99"))
    assert r.returncode == 125 and b"levels deep" in r.stderr


# -- unmodified tools through the symlinks ------------------------------------


def test_bash_make_git_through_symlinks(sandbox):
    d = shim_dir(sandbox.env)
    env = dict(GIT_ID, PATH=path_with(d, sandbox.env))
    (sandbox.mnt / "Makefile").write_text(
        "all:\n\t@echo built-in-$$(pwd) > made.txt\n")
    r = run_bytes(sandbox.env, ["bash", "-c", 'echo "$((1+2)) $PWD"'],
                  cwd=sandbox.mnt, extra_env=env)
    assert r.stdout.decode().strip() == f"3 {sandbox.worktree}"
    r = run_bytes(sandbox.env, ["make"], cwd=sandbox.mnt, extra_env=env)
    assert r.returncode == 0, r.stderr
    assert (sandbox.mnt / "made.txt").read_text() == \
        f"built-in-{sandbox.worktree}\n"
    r = run_bytes(sandbox.env, ["git", "add", "-A"], cwd=sandbox.mnt,
                  extra_env=env)
    assert r.returncode == 0, r.stderr
    r = run_bytes(sandbox.env, ["git", "commit", "-qm", "via shim"],
                  cwd=sandbox.mnt, extra_env=env)
    assert r.returncode == 0, r.stderr
    r = run_bytes(sandbox.env, ["git", "log", "--format=%s", "-1"],
                  cwd=sandbox.mnt, extra_env=env)
    assert r.stdout == b"via shim\n"
    r = run_bytes(sandbox.env, ["git", "status", "--porcelain"],
                  cwd=sandbox.mnt, extra_env=env)
    assert r.stdout == b""


def test_sbx_env_prints_shell_lines(sandbox):
    r = sandbox.sbx("env", sandbox.name)
    assert r.rc == 0, str(r)
    lines = r.out.strip().splitlines()
    d = sandbox.env.home / "shims"
    assert lines == [f"export PATH='{d}':\"$PATH\"",
                     f"export SBX_SESSION='{sandbox.name}'"]
    assert os.path.realpath(d / "make") == os.path.realpath(shim(sandbox.env))


# -- the barrier ---------------------------------------------------------------


def test_barrier_mount_write_seen_by_command(sandbox):
    for i in range(20):
        with open(sandbox.mnt / "f.txt", "w") as f:
            f.write(f"v{i}")
        r = sx(sandbox, "cat", "f.txt")
        assert r.stdout == f"v{i}".encode()


def test_barrier_command_write_seen_through_mount(sandbox):
    f = sandbox.mnt / "g.txt"
    f.write_text("old")
    for i in range(20):
        assert f.read_text() in ("old", f"new{i - 1}")  # cached now
        r = sx(sandbox, "sh", "-c", f"echo new{i} > g.txt; echo x > n{i}")
        assert r.returncode == 0
        assert f.read_text() == f"new{i}\n"
        assert (sandbox.mnt / f"n{i}").exists()
        f.write_text(f"new{i}")


# -- isolation -----------------------------------------------------------------


@pytest.mark.skipif(not have("bwrap"), reason="bubblewrap not installed")
def test_bwrap_isolation(sbx_env, repo):
    sb = sbx_env.up("iso", repo, "--isolate")
    assert sb.status().get("isolation") == "bwrap"
    home_file = sbx_env.userhome / "escape.txt"
    r = sx(sb, "sh", "-c", f"echo x > '{home_file}'")
    assert r.returncode != 0
    assert not home_file.exists()
    r = sx(sb, "sh", "-c", "echo x > /usr/escape.txt")
    assert r.returncode != 0
    r = sx(sb, "sh", "-c", "echo tmp > /tmp/private.txt && cat /tmp/private.txt")
    assert r.stdout == b"tmp\n"
    r = sx(sb, "sh", "-c", "echo $$")   # own PID namespace
    assert int(r.stdout) < 10
    r = sx(sb, "sh", "-c", "echo in > inside.txt")
    assert r.returncode == 0 and (sb.mnt / "inside.txt").read_text() == "in\n"
    d = shim_dir(sbx_env)
    env = dict(GIT_ID, PATH=path_with(d, sbx_env))
    for args in (["git", "add", "inside.txt"],
                 ["git", "commit", "-qm", "isolated commit"]):
        r = run_bytes(sbx_env, args, cwd=sb.mnt, extra_env=env)
        assert r.returncode == 0, r.stderr
    r = sx(sb, "git", "log", "-1", "--format=%s")
    assert r.stdout == b"isolated commit\n"
    # Ctrl-C reaches the command, not bubblewrap.
    p = subprocess.Popen([shim(sbx_env), "sh", "-c",
                          'trap "echo int > m; exit 5" INT; echo ready; '
                          'while :; do sleep 0.05; done'],
                         cwd=sb.mnt, env=sbx_env.env, stdout=subprocess.PIPE,
                         stdin=subprocess.DEVNULL)
    assert p.stdout.readline() == b"ready\n"
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=10) == 5
    assert (sb.worktree / "m").read_text() == "int\n"


# -- failure -------------------------------------------------------------------


def test_dead_daemon_clear_error(sandbox):
    sandbox.env.expect_log_error(".*")
    sandbox.kill_daemon()
    start = time.monotonic()
    r = sx(sandbox, "true", timeout=20)
    assert time.monotonic() - start < 5
    assert r.returncode == 125
    msg = r.stderr.decode()
    assert f"session {sandbox.name}'s daemon is not running" in msg, msg
    assert f"sbx mount {sandbox.name}" in msg
    r = sandbox.sbx("exec", sandbox.name, "--", "true", timeout=20)
    assert r.rc == 125
    assert "sbx mount" in r.err
