"""The repository goes in and the work comes back (docs/design.md,
"Repository in and out"), on every provider whose sandboxes live elsewhere:
remote (a real sbx-agent over an empty root), kubernetes and modal (the
fakes of tests/fakes/, which run real agents).

    sbx up NAME --provider P --repo REPO [--ref] [--carry-changes] [--depth]
    sbx exec NAME -- git commit ...        (git runs in the sandbox)
    sbx pull NAME / sbx down NAME          (the commit lands on sbx/NAME)
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from testenv import read_bytes
from testenv.agent import Agent, free_port
from testenv.kube import write_config as kube_config
from testenv.modal import configure as modal_configure

PROVIDERS = ("remote", "kubernetes", "modal")
ID = ["-e", "GIT_AUTHOR_NAME=agent", "-e", "GIT_AUTHOR_EMAIL=agent@sbx.invalid",
      "-e", "GIT_COMMITTER_NAME=agent",
      "-e", "GIT_COMMITTER_EMAIL=agent@sbx.invalid"]


class Env:
    """One provider's way to make sessions with a repository."""

    def __init__(self, request, sbx_env, provider):
        self.env = sbx_env
        self.provider = provider
        self.request = request
        self.agents = {}
        self.config = []
        if provider == "kubernetes":
            self.fake = request.getfixturevalue("kube_fake_server")
            self.fake.clear()
            self.config = ["--config", str(kube_config(sbx_env, self.fake))]
        elif provider == "modal":
            self.fake = request.getfixturevalue("modal_fake_server")
            modal_configure(sbx_env, self.fake, self.fake.bundle)

    def sbx(self, *args, **kw):
        return self.env.sbx(*self.config, *args, **kw)

    def up(self, name, *extra, check=True, cwd=None, agent_root=None):
        args = ["up", name, "--provider", self.provider]
        if self.provider == "remote":
            root = agent_root or (self.env.root / f"agent-{name}")
            root.mkdir(parents=True, exist_ok=True)
            a = Agent(self.env.bin("sbx-agent"), root,
                      self.env.root / f"agent-{name}.work",
                      env=self.env.env).start()
            self.agents[name] = a
            args += ["--url", a.url, "--token-file", a.token_file]
        r = self.sbx(*args, *extra, timeout=180, cwd=cwd)
        if check:
            assert r.rc == 0, f"{r}\n{self.env.log_tail(name)}"
        return r

    def root(self, name):
        """The sandbox's workdir, as a command inside it sees it."""
        if self.provider == "remote":
            return self.agents[name].root
        if self.provider == "kubernetes":
            return self.fake.pod_root(name)
        sid = self.env.status(name)["sandbox_id"]
        return self.fake.sandbox_root(sid)

    def exec(self, name, *cmd, check=True):
        r = self.sbx("exec", name, *ID, "--", *cmd, timeout=60)
        if check:
            assert r.rc == 0, r
        return r

    def teardown(self):
        for name in self.env.session_names():
            self.sbx("down", name, "--force", timeout=120)
        for a in self.agents.values():
            a.stop()


@pytest.fixture(params=PROVIDERS)
def penv(request, sbx_env):
    e = Env(request, sbx_env, request.param)
    yield e
    e.teardown()


@pytest.fixture
def renv(request, sbx_env):
    e = Env(request, sbx_env, "remote")
    yield e
    e.teardown()


def mnt_of(r):
    return Path(r.out.strip().splitlines()[-1])


def git(env, repo, *args, check=True):
    return env.git(*args, cwd=repo, check=check).out.strip()


def commit_files(env, repo, name, msg, n=3):
    """n commits in `repo`, each adding the file NAME<i>.txt (message
    MSG<i>)."""
    for i in range(n):
        (repo / f"{name}{i}.txt").write_text(f"{i}\n")
        git(env, repo, "add", "-A")
        git(env, repo, "commit", "-q", "-m", f"{msg}{i}")


def commit_in_sandbox(penv, name, path="README.md", text="agent work\n",
                      msg="agent work"):
    penv.exec(name, "sh", "-c",
              f"printf %s '{text}' >> {path} && git add -A && "
              f"git commit -q -m '{msg}'")
    return penv.exec(name, "git", "rev-parse", "HEAD").out.strip()


# -- the round trip -------------------------------------------------------------


def test_up_commit_pull_roundtrip(penv, repo):
    env = penv.env
    head = git(env, repo, "rev-parse", "HEAD")
    r = penv.up("r1", "--repo", repo)
    m = mnt_of(r)
    assert "seeded session r1" in r.err, r
    # a working tree of REPO at HEAD, on sbx/r1, clean, without a git in
    # the image being needed: .git came from the client
    assert read_bytes(m / "src" / "main.c") == \
        (repo / "src" / "main.c").read_bytes()
    assert (m / ".git" / "HEAD").read_text() == "ref: refs/heads/sbx/r1\n"
    assert penv.exec("r1", "git", "rev-parse", "--abbrev-ref",
                     "HEAD").out.strip() == "sbx/r1"
    assert penv.exec("r1", "git", "rev-parse", "HEAD").out.strip() == head
    assert penv.exec("r1", "git", "status", "--porcelain").out == ""
    # the index came with the sandbox's stat data: nothing to re-read
    assert penv.exec("r1", "git", "diff-files", "--quiet",
                     check=False).rc == 0
    st = penv.sbx("status", "r1", "--json").json()
    assert st["branch"] == {"name": "sbx/r1", "head": head, "local": None,
                            "pulled": False}, st

    new = commit_in_sandbox(penv, "r1")
    st = penv.sbx("status", "r1", "--json").json()
    assert st["branch"]["head"] == new and not st["branch"]["pulled"], st

    r = penv.sbx("pull", "r1", "--json")
    assert r.rc == 0, r
    res = r.json()
    assert res["outcome"] == "created" and res["head"] == new, res
    # only what is new: commit, root tree, README.md's blob
    assert res["objects"] == 3, res
    assert res["requests"] <= 2, res
    assert git(env, repo, "rev-parse", "sbx/r1") == new
    assert git(env, repo, "log", "-1", "--format=%s", "sbx/r1") == \
        "agent work"
    assert git(env, repo, "show", "sbx/r1:README.md").endswith("agent work")
    env.git("fsck", "--no-progress", "--connectivity-only", cwd=repo)
    st = penv.sbx("status", "r1", "--json").json()
    assert st["branch"]["pulled"] and st["branch"]["local"] == new, st

    # a second commit: a fast-forward; pulling again: up to date
    new2 = commit_in_sandbox(penv, "r1", path="src/util.h",
                             text="#define MORE 2\n", msg="more")
    res = penv.sbx("pull", "r1", "--json").json()
    assert res["outcome"] == "fast-forward" and res["head"] == new2, res
    assert res["before"] == new
    # commit, root tree, src tree, blob
    assert res["objects"] == 4, res
    res = penv.sbx("pull", "r1", "--json").json()
    assert res["outcome"] == "up-to-date" and res["objects"] == 0, res
    assert git(env, repo, "rev-parse", "refs/sbx/pulled/r1") == new2


def test_down_pulls(penv, repo):
    penv.up("d1", "--repo", repo)
    new = commit_in_sandbox(penv, "d1", msg="before down")
    r = penv.sbx("down", "d1", timeout=180)
    assert r.rc == 0, f"{r}\n{penv.env.log_tail('d1')}"
    assert "pulled sbx/d1" in r.err, r
    assert git(penv.env, repo, "rev-parse", "sbx/d1") == new
    assert "d1" not in penv.env.session_names()


def test_diverged_branch_refused(penv, repo):
    env = penv.env
    penv.up("v1", "--repo", repo)
    theirs = commit_in_sandbox(penv, "v1", msg="sandbox side")
    # sbx/v1 in the repository moves elsewhere meanwhile
    git(env, repo, "branch", "sbx/v1", "main")
    git(env, repo, "checkout", "-q", "sbx/v1")
    (repo / "local.txt").write_text("mine\n")
    git(env, repo, "add", "local.txt")
    git(env, repo, "commit", "-q", "-m", "local side")
    git(env, repo, "checkout", "-q", "main")
    mine = git(env, repo, "rev-parse", "sbx/v1")

    r = penv.sbx("pull", "v1")
    assert r.rc == 4, r
    assert "diverged" in r.err and mine[:12] in r.err and \
        theirs[:12] in r.err, r
    assert "refs/sbx/pulled/v1" in r.err
    assert git(env, repo, "rev-parse", "sbx/v1") == mine   # untouched
    assert git(env, repo, "rev-parse", "refs/sbx/pulled/v1") == theirs
    st = penv.sbx("status", "v1", "--json").json()
    assert st["branch"]["pulled"] is False, st

    # down refuses too, and keeps the sandbox mounted
    r = penv.sbx("down", "v1", timeout=180)
    assert r.rc == 4, r
    assert "diverged" in r.err
    assert env.status("v1")["mounted"] is True
    assert git(env, repo, "rev-parse", "sbx/v1") == mine

    # moved aside as the message says: down pulls and removes
    git(env, repo, "branch", "-m", "sbx/v1", "sbx/v1-mine")
    r = penv.sbx("down", "v1", timeout=180)
    assert r.rc == 0, r
    assert git(env, repo, "rev-parse", "sbx/v1") == theirs


def test_carry_changes(penv, repo):
    env = penv.env
    (repo / "README.md").write_text("# changed, unstaged\n")
    (repo / "staged.txt").write_text("staged\n")
    git(env, repo, "add", "staged.txt")
    (repo / "docs" / "notes.txt").unlink()
    (repo / "untracked.txt").write_text("untracked\n")
    (repo / "ignored.o").write_text("ignored\n")
    os.chmod(repo / "src" / "main.c", 0o755)
    want = git(env, repo, "status", "--porcelain")

    m = mnt_of(penv.up("c1", "--repo", repo, "--carry-changes"))
    got = penv.exec("c1", "git", "status", "--porcelain").out.strip()
    assert got == want, (got, want)
    assert read_bytes(m / "README.md") == b"# changed, unstaged\n"
    assert read_bytes(m / "untracked.txt") == b"untracked\n"
    assert not (m / "ignored.o").exists()
    assert not (m / "docs" / "notes.txt").exists()
    assert os.stat(m / "src" / "main.c").st_mode & 0o777 == 0o755
    # the staged blob is in the sandbox's objects
    assert penv.exec("c1", "git", "diff", "--cached", "--name-only").out \
        .split() == ["staged.txt"]
    # the sandbox commits the carried work; it comes back
    penv.exec("c1", "git", "commit", "-q", "-am", "carried")
    r = penv.sbx("pull", "c1")
    assert r.rc == 0, r
    assert git(env, repo, "show", "sbx/c1:staged.txt") == "staged"
    assert git(env, repo, "show", "sbx/c1:README.md") == \
        "# changed, unstaged"


def test_path_identity(penv, repo):
    """The mount's path leads to the sandbox's files inside the sandbox:
    `cd MOUNT && ...` works and sees the files directly (not through the
    client's FUSE mount, which shares this test machine)."""
    m = mnt_of(penv.up("p1", "--repo", repo))
    r = penv.exec("p1", "sh", "-c",
                  f"cd {m} && cat README.md && stat -c %d:%i README.md && "
                  f"git -C {m} rev-parse --abbrev-ref HEAD")
    lines = r.out.splitlines()
    assert lines[0] == "# sample"
    real = os.stat(penv.root("p1") / "README.md")
    assert lines[1] == f"{real.st_dev}:{real.st_ino}", (lines, real)
    assert lines[2] == "sbx/p1"
    # what the command writes there is in the sandbox and in the mount
    penv.exec("p1", "sh", "-c", f"echo made-there > {m}/made.txt")
    assert read_bytes(m / "made.txt") == b"made-there\n"


# -- options ------------------------------------------------------------------------


def test_ref_and_depth(renv, repo):
    env = renv.env
    commit_files(env, repo, "f", "c")
    m = mnt_of(renv.up("o1", "--repo", repo, "--ref", "main~1",
                       "--depth", "2"))
    assert renv.exec("o1", "git", "rev-parse", "HEAD").out.strip() == \
        git(env, repo, "rev-parse", "main~1")
    assert not (m / "f2.txt").exists()
    assert renv.exec("o1", "git", "rev-parse",
                     "--is-shallow-repository").out.strip() == "true"
    assert renv.exec("o1", "git", "rev-list", "--count",
                     "HEAD").out.strip() == "2"
    assert renv.exec("o1", "git", "status", "--porcelain").out == ""
    new = commit_in_sandbox(renv, "o1")
    assert renv.sbx("pull", "o1").rc == 0
    assert git(env, repo, "rev-parse", "sbx/o1") == new
    assert git(env, repo, "rev-parse", "sbx/o1~1") == \
        git(env, repo, "rev-parse", "main~1")


def test_seed_sends_the_repositorys_packs(renv, repo):
    """Full history: the repository's packs go as they are; only the
    loose objects (a commit made after `git gc`) are packed by sbx."""
    env = renv.env
    git(env, repo, "gc", "-q")
    packs = sorted(p.name for p in (repo / ".git/objects/pack").glob("*.pack"))
    assert len(packs) == 1
    (repo / "after-gc.txt").write_text("loose\n")
    git(env, repo, "add", "after-gc.txt")
    git(env, repo, "commit", "-q", "-m", "after gc")
    renv.up("k1", "--repo", repo)
    root = renv.root("k1")
    got = sorted(p.name for p in (root / ".git/objects/pack").glob("*.pack"))
    assert packs[0] in got and len(got) == 2, got
    for p in got:
        keep = (root / ".git/objects/pack" / p).with_suffix(".keep")
        assert keep.read_text().startswith("sbx seed "), keep
    assert renv.exec("k1", "git", "fsck", "--no-progress",
                     "--no-dangling").rc == 0
    assert renv.exec("k1", "git", "log", "-1", "--format=%s").out.strip() \
        == "after gc"
    # a pull after a commit there needs none of those packs
    new = commit_in_sandbox(renv, "k1")
    res = renv.sbx("pull", "k1", "--json").json()
    assert res["head"] == new and res["objects"] == 3, res


def test_seed_file_kinds(renv, sbx_env):
    """Symlinks, executables, empty files, long paths, checkout filters
    (.gitattributes eol=crlf) and a submodule entry arrive as git checks
    them out: `git status` in the sandbox is clean."""
    env = sbx_env
    long = "d" * 60 + "/" + "e" * 60 + "/" + "f" * 90 + ".txt"
    repo = env.make_repo("kinds", files={
        "run.sh": "#!/bin/sh\necho hi\n",
        "empty": "",
        "crlf.txt": "one\ntwo\n",
        ".gitattributes": "crlf.txt text eol=crlf\n",
        long: "deep\n",
    }, commit=False)
    os.chmod(repo / "run.sh", 0o755)
    os.symlink("run.sh", repo / "link")
    os.symlink("/etc/hostname", repo / "abs-link")
    git(env, repo, "add", "-A")
    # a submodule entry (its commit need not exist here)
    git(env, repo, "update-index", "--add", "--cacheinfo",
        "160000,1234567890123456789012345678901234567890,sub")
    git(env, repo, "commit", "-q", "-m", "kinds")
    m = mnt_of(renv.up("f1", "--repo", repo))
    assert os.readlink(m / "link") == "run.sh"
    assert os.readlink(m / "abs-link") == "/etc/hostname"
    assert os.stat(m / "run.sh").st_mode & 0o777 == 0o755
    assert read_bytes(m / "empty") == b""
    assert read_bytes(m / long) == b"deep\n"
    assert read_bytes(m / "crlf.txt") == b"one\r\ntwo\r\n"
    assert (m / "sub").is_dir() and list((m / "sub").iterdir()) == []
    assert renv.exec("f1", "git", "status", "--porcelain").out == ""


def test_existing_branch_continued_and_ref_refused(renv, repo):
    env = renv.env
    git(env, repo, "branch", "sbx/e1", "main")
    (repo / "later.txt").write_text("later\n")
    git(env, repo, "add", "later.txt")
    git(env, repo, "commit", "-q", "-m", "later")
    r = renv.up("e1", "--repo", repo, "--ref", "main", check=False)
    assert r.rc == 4 and "already exists" in r.err, r
    assert "e1" not in env.session_names()
    r = renv.up("e1", "--repo", repo)
    assert "(continued)" in r.err
    assert renv.exec("e1", "git", "rev-parse", "HEAD").out.strip() == \
        git(env, repo, "rev-parse", "sbx/e1")


def test_repository_of_the_cwd_and_no_repo(renv, repo):
    env = renv.env
    m = mnt_of(renv.up("w1", cwd=repo / "src"))
    assert (m / ".git").is_dir() and (m / "README.md").exists()
    assert renv.sbx("pull", "w1").rc == 0
    m2 = mnt_of(renv.up("w2", "--no-repo", cwd=repo))
    assert list(m2.iterdir()) == []
    assert renv.sbx("pull", "w2").rc == 5
    # an agent whose root is not empty: a note for the cwd's repository,
    # an error for an explicit --repo (and nothing is left behind)
    root = env.root / "busy-root"
    root.mkdir()
    (root / "keep.txt").write_text("keep\n")
    r = renv.up("w3", cwd=repo, agent_root=root)
    assert "not empty" in r.err and "not putting" in r.err, r
    assert sorted(p.name for p in root.iterdir()) == ["keep.txt"]
    root4 = env.root / "busy-root4"
    root4.mkdir()
    (root4 / "keep.txt").write_text("keep\n")
    r = renv.up("w4", "--repo", repo, check=False, agent_root=root4)
    assert r.rc == 6 and "not empty" in r.err, r
    assert "w4" not in env.session_names()
    assert sorted(p.name for p in root4.iterdir()) == ["keep.txt"]
    assert renv.sbx("up", "w5", "--no-repo", "--repo", repo).rc == 2


def test_refused_seed_of_a_large_repository(renv, repo):
    """The agent refuses a seed into a non-empty root as soon as it has the
    headers.  The client must hear that answer for a repository far larger
    than the socket buffers too, not a broken pipe from pushing a body the
    agent will never read (it asks before sending: Expect: 100-continue)."""
    env = renv.env
    (repo / "big.bin").write_bytes(os.urandom(16 << 20))
    git(env, repo, "add", "big.bin")
    git(env, repo, "commit", "-q", "-m", "big")
    for name, implicit in (("b1", True), ("b2", False)):
        root = env.root / f"busy-{name}"
        root.mkdir()
        (root / "keep.txt").write_text("keep\n")
        extra = () if implicit else ("--repo", repo)
        r = renv.up(name, *extra, cwd=repo, check=False, agent_root=root)
        assert "Broken pipe" not in r.err and "not empty" in r.err, r
        if implicit:
            assert r.rc == 0 and "not putting" in r.err, r
        else:
            assert r.rc == 6 and name not in env.session_names(), r
        assert sorted(p.name for p in root.iterdir()) == ["keep.txt"]


def test_pull_after_gc_in_the_sandbox(renv, repo):
    """The sandbox packs its objects (git gc): the pull gets the new pack
    through libgit2's indexer, and still only what is missing matters."""
    env = renv.env
    renv.up("g1", "--repo", repo)
    commit_in_sandbox(renv, "g1", msg="one")
    renv.exec("g1", "git", "gc", "-q")
    new = commit_in_sandbox(renv, "g1", msg="two")
    r = renv.sbx("pull", "g1", "--json")
    assert r.rc == 0, r
    assert r.json()["requests"] <= 3
    assert git(env, repo, "rev-parse", "sbx/g1") == new
    assert git(env, repo, "log", "--format=%s", "-2", "sbx/g1").split() \
        == ["two", "one"]


def test_pull_refuses_a_corrupt_object(renv, repo):
    env = renv.env
    renv.up("x1", "--repo", repo)
    new = commit_in_sandbox(renv, "x1")
    obj = renv.root("x1") / ".git" / "objects" / new[:2] / new[2:]
    data = obj.read_bytes()
    # another valid loose object under the commit's name
    other = subprocess.run(["git", "hash-object", "-w", "--stdin"],
                           cwd=renv.root("x1"), input=b"not it\n",
                           capture_output=True, check=True).stdout.strip()
    src = renv.root("x1") / ".git" / "objects" / other[:2].decode() / \
        other[2:].decode()
    os.chmod(obj, 0o644)
    obj.write_bytes(src.read_bytes())
    r = renv.sbx("pull", "x1")
    assert r.rc != 0 and "corrupt" in r.err, r
    assert env.git("rev-parse", "--verify", "-q", "sbx/x1", cwd=repo,
                   check=False).rc != 0
    obj.write_bytes(data)
    assert renv.sbx("pull", "x1").rc == 0


def test_path_identity_by_symlink(sbx_env, repo):
    """An agent that cannot see the client's mount path (another machine;
    here: its own mount namespace with a tmpfs over the mount root) makes
    it a symlink to its root."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1)")
    root = sbx_env.root / "sym-root"
    root.mkdir()
    port = free_port()
    tok = sbx_env.root / "sym.token"
    tok.write_text("t0ken-for-symlink-test\n")
    os.chmod(tok, 0o600)
    agent = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs none {sbx_env.mount_root} && exec "
         f"{sbx_env.bin('sbx-agent')} serve --root {root} --listen "
         f"127.0.0.1:{port} --token-file {tok}"],
        env=sbx_env.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        import time
        import urllib.request
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health",
                                       timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline, agent.stderr.read()
                time.sleep(0.05)
        r = sbx_env.sbx("up", "s1", "--provider", "remote", "--url",
                        f"http://127.0.0.1:{port}", "--token-file", tok,
                        "--repo", repo, timeout=120)
        assert r.rc == 0, r
        m = mnt_of(r)
        r = sbx_env.sbx("exec", "s1", "--", "sh", "-c",
                        f"cd {m} && cat README.md && readlink {m}")
        assert r.rc == 0, r
        assert r.out.splitlines() == ["# sample", str(root)], r
        sbx_env.sbx("down", "s1", "--force", timeout=60)
    finally:
        agent.terminate()
        agent.wait(10)


def test_opencode_launcher_puts_only_bash_first(sbx_env, repo, tmp_path):
    """contrib/opencode/sbx-opencode: opencode gets the bash shim as its
    shell and first on PATH, but its own git and rg are the real ones
    (they run on the mount)."""
    top = Path(__file__).resolve().parents[2]
    launcher = top / "contrib" / "opencode" / "sbx-opencode"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "fake-opencode"
    fake.write_text("#!/bin/sh\n"
                    "echo \"shell=$SHELL\"\n"
                    "echo \"git=$(command -v git)\"\n"
                    "echo \"bash=$(command -v bash)\"\n"
                    "echo \"first=${PATH%%:*}\"\n"
                    "ls \"${PATH%%:*}\"\n")
    fake.chmod(0o755)
    env = {"SBX": str(sbx_env.bin("sbx")), "OPENCODE": str(fake),
           "SBX_UP_ARGS": f"--repo {repo}"}
    r = sbx_env.run([launcher, "oc1"], cwd=repo, env=env, timeout=120)
    assert r.rc == 0, r
    out = dict(line.split("=", 1) for line in r.out.splitlines()
               if "=" in line)
    first = out["first"]
    assert out["shell"].endswith("/bash")
    assert os.readlink(out["shell"]).endswith("sbx-exec")
    assert out["bash"] == f"{first}/bash"
    assert os.readlink(out["bash"]).endswith("sbx-exec")
    assert out["git"] == shutil.which("git"), out
    listed = [line for line in r.out.splitlines() if "=" not in line]
    assert listed == ["bash"], r.out


def test_opencode_launcher_on_kubernetes(sbx_env, repo, tmp_path,
                                         kube_fake_server):
    """The launcher, unchanged, with {"sandbox": {"provider": "kubernetes"}}
    in the project's opencode.json: the pod gets the checkout, opencode's
    bash tool commits in it, and the commit is on sbx/NAME in the project
    when opencode exits."""
    fake = kube_fake_server
    fake.clear()
    (repo / "opencode.json").write_text(json.dumps({
        "sandbox": {"provider": "kubernetes",
                    "kubernetes": {"kubeconfig": str(fake.kubeconfig),
                                   "ready_timeout": 30, "timeout": 20}}}))
    git(sbx_env, repo, "add", "opencode.json")
    git(sbx_env, repo, "commit", "-q", "-m", "sandbox config")
    top = Path(__file__).resolve().parents[2]
    oc = tmp_path / "opencode"
    # What opencode's bash tool does: "$SHELL" -c '<command>' in the mount.
    oc.write_text("#!/bin/sh\n"
                  "exec \"$SHELL\" -c 'echo from-agent >> README.md && "
                  "git add -A && git -c user.name=oc -c "
                  "user.email=oc@sbx.invalid commit -qm \"from opencode\"'\n")
    oc.chmod(0o755)
    env = {"SBX": str(sbx_env.bin("sbx")), "OPENCODE": str(oc)}
    r = sbx_env.run([top / "contrib/opencode/sbx-opencode", "oc2"], cwd=repo,
                    env=env, timeout=180)
    assert r.rc == 0, f"{r}\n{sbx_env.log_tail('oc2')}\n{fake.log_tail()}"
    assert "pulled sbx/oc2" in r.err, r
    assert git(sbx_env, repo, "log", "-1", "--format=%s", "sbx/oc2") == \
        "from opencode"
    assert git(sbx_env, repo, "show", "sbx/oc2:README.md").endswith(
        "from-agent")
    # the commit was made in the pod, not in the checkout
    assert git(sbx_env, repo, "status", "--porcelain") == ""
    assert sbx_env.status("oc2")["provider"] == "kubernetes"
    r = sbx_env.sbx("down", "oc2", timeout=180)
    assert r.rc == 0, r


def test_serve_body_repo_keys(renv, repo):
    """`sbx serve`'s POST body takes the same keys: depth, no_repo."""
    from test_serve import Server
    env = renv.env
    commit_files(env, repo, "h", "h")
    roots = {}
    for name in ("sv1", "sv2"):
        root = env.root / f"agent-{name}"
        root.mkdir()
        roots[name] = Agent(env.bin("sbx-agent"), root,
                            env.root / f"agent-{name}.work",
                            env=env.env).start()
        renv.agents[name] = roots[name]
    srv = Server(env)
    try:
        def body(name, **kw):
            return {"provider": "remote", "repo": str(repo),
                    "remote": {"url": roots[name].url,
                               "token_file": str(roots[name].token_file)},
                    **kw}
        st, b = srv.request("POST", "/session/sv1/sandbox",
                            body("sv1", depth=1))
        assert st == 200, b
        assert renv.exec("sv1", "git", "rev-list", "--count",
                         "HEAD").out.strip() == "1"
        st, b = srv.request("POST", "/session/sv2/sandbox",
                            body("sv2", no_repo=True))
        assert st == 200, b
        assert list(roots["sv2"].root.iterdir()) == []
        st, b = srv.request("POST", "/session/sv3/sandbox",
                            body("sv2", depth="x"))
        assert st == 400, b
    finally:
        srv.stop()
