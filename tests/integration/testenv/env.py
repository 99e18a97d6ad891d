"""The test environment: built binaries, a private SBX_HOME, sessions.

An `SbxEnv` owns one temporary directory holding everything a test touches:

    <root>/state      SBX_HOME (sessions/, worktrees/, logs/, run/)
    <root>/mnt        SBX_MOUNT_ROOT (default mountpoints)
    <root>/home       HOME (no ~/.gitconfig: like a fresh CI machine)
    <root>/san        sanitizer reports of every sbx process (log_path)
    <root>/owner.pid  the pytest process owning it (stale-run cleanup)

`SbxEnv.cleanup()` runs `sbx down --force` on every session, lazily unmounts
whatever is still mounted below <root>, and kills any process still carrying
this SBX_HOME in its environment (stray daemons).  `SbxEnv.problems()` lists
unexpected daemon log errors and sanitizer reports (the OutputChecker).
"""

import json
import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from . import mounts

# Identity for the git CLI used by tests.  libgit2 (used by sbx) does not read
# these, and HOME has no .gitconfig, so sbx must cope without an identity.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "sbx test",
    "GIT_AUTHOR_EMAIL": "test@sbx.invalid",
    "GIT_COMMITTER_NAME": "sbx test",
    "GIT_COMMITTER_EMAIL": "test@sbx.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
}

# Daemon log lines that count as an unexpected error (sbx/log.h format:
# "<time> <component>[<pid>] <level>: <message>").
LOG_ERROR_RE = re.compile(r"^\S+ \S+\[\d+\] error: .*$", re.M)
SANITIZER_RE = re.compile(
    r"(ERROR: (AddressSanitizer|LeakSanitizer|ThreadSanitizer)|"
    r"WARNING: ThreadSanitizer|"
    r"runtime error:|SUMMARY: (Address|Undefined|Leak)\w*Sanitizer)")


def find_build_dir(option=None):
    """The meson build directory: --build-dir, $MESON_BUILD_DIR, or ./build."""
    here = Path(__file__).resolve().parents[3]  # repository root
    for cand in (option, os.environ.get("MESON_BUILD_DIR")):
        if cand:
            return Path(cand).resolve()
    for name in ("build", "build-test"):
        if (here / name / "cli" / "sbx").exists():
            return here / name
    return here / "build"


# Backends a build may leave out (meson -Dkubernetes=disabled,
# -Dmodal=disabled), with the config.h define that says whether it has them.
OPTIONAL_PROVIDERS = {"kubernetes": "SBX_HAVE_KUBERNETES",
                      "modal": "SBX_HAVE_MODAL"}
NOT_BUILT_TAG = "SBX-NOT-BUILT"


def provider_built(build_dir, provider):
    """Whether the build in `build_dir` has `provider` compiled in.

    Read from the build's config.h (SBX_HAVE_<NAME>), the same define the
    provider registry uses.  Providers that are always built, and builds
    older than the options, count as built.
    """
    define = OPTIONAL_PROVIDERS.get(provider)
    if define is None:
        return True
    try:
        text = (Path(build_dir) / "config.h").read_text()
    except OSError:
        return True
    m = re.search(r"^#define %s (\d+)" % define, text, re.M)
    return m is None or m.group(1) != "0"


def not_built_reason(build_dir, provider):
    """A skip reason when `provider` is not built in, else None."""
    if provider_built(build_dir, provider):
        return None
    return (f"{NOT_BUILT_TAG}: provider {provider} is not built in "
            f"(meson -D{provider}=disabled, or its dependencies are "
            f"missing)")


@dataclass
class Result:
    args: list
    rc: int
    out: str
    err: str

    @property
    def text(self):
        return self.out + self.err

    def json(self):
        return json.loads(self.out)

    def __str__(self):
        return (f"$ {shlex.join(map(str, self.args))}\n[rc={self.rc}]\n"
                f"--- stdout ---\n{self.out}--- stderr ---\n{self.err}")


class SbxError(AssertionError):
    pass


class SbxEnv:
    def __init__(self, root, build_dir):
        self.root = Path(root)
        self.build_dir = Path(build_dir)
        self.home = self.root / "state"
        self.mount_root = self.root / "mnt"
        self.userhome = self.root / "home"
        self.san_dir = self.root / "san"
        self.saved_logs = {}  # daemon logs read before `sbx down` removes them
        for d in (self.root, self.mount_root, self.userhome, self.san_dir):
            d.mkdir(parents=True, exist_ok=True)
        (self.root / "owner.pid").write_text(str(os.getpid()))
        # $SBX_CONFIG must exist when set; tests may rewrite it.
        (self.root / "config.json").write_text("{}\n")
        self.expected_log_errors = []  # regexes a test declares as expected
        self.env = self._make_env()

    # -- binaries and environment ------------------------------------------

    def bin(self, name):
        sub = {"sbx": "cli", "sbx-exec": "shim", "sbx-agent": "agent"}
        p = self.build_dir / sub.get(name, "") / name
        if not p.exists():
            raise SbxError(f"{p} not built (build dir {self.build_dir})")
        return p

    def _make_env(self):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SBX_", "GIT_", "XDG_"))}
        env.update(GIT_ENV)
        env.update({
            "HOME": str(self.userhome),
            "SBX_HOME": str(self.home),
            "SBX_MOUNT_ROOT": str(self.mount_root),
            "SBX_CONFIG": str(self.root / "config.json"),
            "SBX_LOG": os.environ.get("SBX_TEST_LOG", "info"),
            "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        })
        # Sanitizer reports of every sbx process (the detached daemon's too,
        # which may come at its exit, after `sbx down` removed its log) go
        # to files that problems() reads; a failed command's Result.err
        # gets the reports written while it ran.
        # (TSan reads UBSAN_OPTIONS after TSAN_OPTIONS: its reports may be
        # named ubsan.PID.)
        for var in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS",
                    "TSAN_OPTIONS"):
            base = env.get(var, "")
            tag = var.split("_")[0].lower()
            env[var] = ":".join(filter(None, [
                base, f"log_path={self.san_dir}/{tag}"]))
        return env

    # -- running commands ---------------------------------------------------

    def run(self, args, *, cwd=None, input=None, timeout=120, env=None,
            check=False):
        e = dict(self.env)
        if env:
            e.update(env)
        # Not pytest's cwd (often a git repository: `sbx up` would take it
        # for the session's repository, as it does for a user).
        if cwd is None:
            cwd = self.root
        args = [str(a) for a in args]
        san_before = set(self.san_dir.iterdir())
        try:
            p = subprocess.run(args, cwd=cwd, env=e, input=input,
                               capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired as ex:
            raise SbxError(f"timed out after {timeout}s: {shlex.join(args)}\n"
                           f"stdout: {ex.stdout}\nstderr: {ex.stderr}")
        r = Result(args, p.returncode, p.stdout, p.stderr)
        if r.rc != 0:
            for f in sorted(set(self.san_dir.iterdir()) - san_before):
                r.err += f"\n[sanitizer report {f.name}]\n" + \
                    f.read_text(errors="replace")
        if check and r.rc != 0:
            raise SbxError(f"command failed:\n{r}")
        return r

    def sbx(self, *args, check=False, **kw):
        """Run the sbx CLI; returns a Result (check=True: must exit 0)."""
        if args and args[0] == "down":
            self.save_logs()
        return self.run([self.bin("sbx"), *args], check=check, **kw)

    def sbx_ok(self, *args, **kw):
        return self.sbx(*args, check=True, **kw)

    def git(self, *args, cwd=None, check=True, **kw):
        return self.run(["git", *args], cwd=cwd, check=check, **kw)

    # -- repositories -------------------------------------------------------

    def make_repo(self, name="repo", files=None, commit=True):
        """A git repository with `files` ({relpath: text}) committed."""
        repo = self.root / name
        repo.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "-b", "main", cwd=repo)
        if files is None:
            files = {
                "README.md": "# sample\n",
                "src/main.c": "int main(void) { return 0; }\n",
                "src/util.h": "#define UTIL 1\n",
                "docs/notes.txt": "one\ntwo\nthree\n",
                ".gitignore": "*.o\nbuild/\n",
            }
        for rel, text in files.items():
            p = repo / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        if commit:
            self.git("add", "-A", cwd=repo)
            self.git("commit", "-q", "-m", "initial", cwd=repo)
        return repo

    # -- sessions -----------------------------------------------------------

    def worktree(self, name):
        return self.home / "worktrees" / name

    def state_file(self, name):
        return self.home / "sessions" / f"{name}.json"

    def log_file(self, name):
        return self.home / "logs" / f"{name}.log"

    def status(self, name):
        r = self.sbx("status", name, "--json", timeout=30)
        if r.rc != 0:
            raise SbxError(f"sbx status failed:\n{r}")
        return r.json()

    def up(self, name, repo, *extra, wait=True):
        """`sbx up NAME --repo REPO ...`; returns a Sandbox once mounted."""
        r = self.sbx("up", name, "--repo", repo, *extra, timeout=120)
        if r.rc != 0:
            raise SbxError(f"sbx up failed:\n{r}\n{self.log_tail(name)}")
        mnt = Path(r.out.strip().splitlines()[-1]) if "--json" not in extra \
            else Path(json.loads(r.out)["mountpoint"])
        sb = Sandbox(self, name, mnt, Path(repo))
        if wait:
            sb.wait_mounted()
        return sb

    def session_names(self):
        d = self.home / "sessions"
        if not d.is_dir():
            return []
        return sorted(p.stem for p in d.glob("*.json"))

    def log_tail(self, name, n=4000):
        p = self.log_file(name)
        if p.exists():
            return f"--- {p} ---\n" + p.read_text(errors="replace")[-n:]
        return f"(no daemon log at {p})"

    # -- OutputChecker ------------------------------------------------------

    def expect_log_error(self, regex):
        """Declare that a daemon log error matching regex is expected."""
        self.expected_log_errors.append(re.compile(regex))

    def save_logs(self):
        """Remember the daemon logs as they are now (down removes them)."""
        logs = self.home / "logs"
        if logs.is_dir():
            for p in logs.glob("*.log"):
                text = p.read_text(errors="replace")
                if len(text) >= len(self.saved_logs.get(p.name, "")):
                    self.saved_logs[p.name] = text

    def problems(self):
        """Unexpected daemon log errors and sanitizer reports, as text."""
        out = []
        self.save_logs()
        for name, text in sorted(self.saved_logs.items()):
            for m in LOG_ERROR_RE.finditer(text):
                line = m.group(0)
                if not any(r.search(line) for r in self.expected_log_errors):
                    out.append(f"{name}: {line}")
            if SANITIZER_RE.search(text):
                out.append(f"{name}: sanitizer report:\n{text[-6000:]}")
        for p in sorted(self.san_dir.glob("*")):
            text = p.read_text(errors="replace")
            if text.strip():
                out.append(f"sanitizer report {p.name}:\n{text[-6000:]}")
        return out

    # -- teardown -----------------------------------------------------------

    def cleanup(self):
        """Leave nothing behind: sessions down, mounts gone, daemons dead.

        Returns a list of things that had to be forced (for the report).
        """
        notes = []
        self.save_logs()
        for name in self.session_names():
            try:
                r = self.sbx("down", name, "--force", timeout=60)
                if r.rc != 0:
                    notes.append(f"sbx down {name} --force: rc={r.rc} "
                                 f"{r.err.strip()}")
            except Exception as e:  # noqa: BLE001 - teardown goes on
                notes.append(f"sbx down {name} --force: {e}")
        left = mounts.mounts_under(self.root)
        if left:
            notes.append("mounts left after sbx down: "
                         + ", ".join(m.mountpoint for m in left))
        still = mounts.unmount_all_under(self.root)
        if still:
            notes.append("could not unmount: " + ", ".join(still))
        pids = mounts.processes_with_env("SBX_HOME", str(self.home))
        if pids:
            notes.append(f"stray processes killed: {pids}")
            mounts.kill_pids(pids)
        return notes


class Sandbox:
    """One session as tests see it: name, mountpoint, worktree, runner."""

    def __init__(self, env, name, mnt, repo=None):
        self.env = env
        self.name = name
        self.mnt = Path(mnt)
        self.repo = repo
        self.provider = "local"

    @property
    def worktree(self):
        return self.env.worktree(self.name)

    @property
    def log(self):
        return self.env.log_file(self.name)

    def sbx(self, *args, **kw):
        return self.env.sbx(*args, **kw)

    def status(self):
        return self.env.status(self.name)

    def daemon_pid(self):
        return self.status().get("pid")

    def wait_mounted(self, timeout=15):
        pid = None
        try:
            pid = self.daemon_pid()
        except SbxError:
            pass
        mounts.wait_for_mount(self.mnt, pid=pid, timeout=timeout,
                              log=self.log)

    def kill_daemon(self, sig=signal.SIGKILL, timeout=10):
        pid = self.daemon_pid()
        assert pid, f"no daemon pid in status: {self.status()}"
        os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while mounts.pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not mounts.pid_alive(pid), f"daemon {pid} survived {sig}"
        return pid

    def path(self, rel=""):
        return self.mnt / rel

    def __repr__(self):
        return f"Sandbox({self.name!r}, mnt={str(self.mnt)!r})"
