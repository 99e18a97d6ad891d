"""Fixtures for the sbx integration tests (real FUSE mounts, real git).

Run through meson (`meson test -C build --suite integration`), or directly:

    /usr/bin/python3 -m pytest tests/integration --build-dir=build -v

Fixtures (reusable by every test file, and later by remote providers):

    build_dir   the meson build directory (--build-dir, $MESON_BUILD_DIR)
    sbx_env     a private SbxEnv: SBX_HOME, SBX_MOUNT_ROOT, HOME under
                tmp_path; .sbx(*args) runs the CLI; torn down with
                `sbx down --force` + lazy unmount + killing stray daemons,
                then fails the test on unexpected daemon log errors or
                sanitizer reports (sbx_env.expect_log_error(regex) allows one)
    repo        a small committed git repository (sbx_env.make_repo())
    provider    "local"; in modules marked providers("local", "remote"),
                also "remote" (a real sbx-agent on loopback), and for
                tests marked slow_remote also "slow_remote" (the same
                through testenv.latency_proxy at 20 ms RTT);
                SBX_TEST_PROVIDERS=a,b restricts the set
    agent       a real sbx-agent (testenv.agent.Agent) serving a clone of
                `repo` on branch sbx/t1, on a free loopback port
    sandbox     a mounted session of `repo` on `provider`: .name, .mnt,
                .worktree, .repo, .sbx(*args), .status(), .daemon_pid(),
                .kill_daemon(), .wait_mounted()
    plain_dir   an empty plain directory on the same file system as the
                worktree, for comparisons (testenv.same_as_plain)

Environment knobs: SBX_TEST_TIMEOUT (seconds per test, default 180, with
pytest-timeout), SBX_TEST_LOG (daemon log level, default info),
SBX_TEST_VISIBLE_WITHIN (seconds a worktree change may take to show in the
mount, default 1.0), SBX_TEST_PROVIDERS (default: every provider a test
supports), SBX_TEST_MIRROR=0 (do not also run the remote data-plane tests
on kubernetes and modal), SBX_TEST_NO_FUSE=1 (pretend FUSE is unusable, to
test the skip path).

Every test here needs a usable /dev/fuse.  Without one they are skipped with
a reason starting "SBX-NO-FUSE"; scripts/test.sh turns such skips into a
failure under CI.  If every test was skipped, pytest exits 77 (meson SKIP).

Tests of a backend left out of the build (meson -Dkubernetes=disabled or
-Dmodal=disabled: the `provider` parameter, test_kubernetes.py,
test_modal.py, test_mgrpc.py) are skipped with a reason starting
"SBX-NOT-BUILT", read from the build's config.h; under CI=true, where every
backend is built, they fail instead.
"""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import testenv  # noqa: E402
from testenv import env as testenv_env  # noqa: E402
from testenv import mounts  # noqa: E402

# SBX_TEST_PROVIDERS restricts which providers run (default: every provider
# a test supports, see pytest_generate_tests).
PROVIDERS = [p for p in os.environ.get("SBX_TEST_PROVIDERS", "").split(",")
             if p] or None
MIRROR = os.environ.get("SBX_TEST_MIRROR", "1") != "0"
KNOWN_PROVIDERS = ("local", "remote", "slow_remote", "kubernetes", "modal")
SLOW_REMOTE_DELAY_MS = float(os.environ.get("SBX_TEST_SLOW_DELAY_MS", "10"))
DEFAULT_TIMEOUT = int(os.environ.get("SBX_TEST_TIMEOUT", "180"))
COUNTS = {"passed": 0, "failed": 0, "skipped": 0}


def pytest_addoption(parser):
    parser.addoption("--build-dir", default=None,
                     help="meson build directory holding cli/sbx "
                          "(default: $MESON_BUILD_DIR, ./build)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "nofuse: the test does not need a usable /dev/fuse")
    config.addinivalue_line(
        "markers", "slow: the test takes more than a few seconds")
    config.addinivalue_line(
        "markers", "providers(*names): the providers the `sandbox` fixture "
                   "is parametrised over for this test (default: local)")
    config.addinivalue_line(
        "markers", "slow_remote: also run through the latency proxy "
                   "(provider slow_remote) when remote is among providers")
    config.addinivalue_line(
        "markers", "remote_only(reason): not run on the kubernetes and modal providers "
                   "(needs the agent process itself)")
    config.addinivalue_line(
        "markers", "local_only(reason): the test checks something only a "
                   "local sandbox has; it is not run for remote providers")


def pytest_generate_tests(metafunc):
    if "provider" not in metafunc.fixturenames:
        return
    m = metafunc.definition.get_closest_marker("providers")
    wanted = list(m.args) if m else ["local"]
    if metafunc.definition.get_closest_marker("local_only"):
        wanted = [p for p in wanted if p == "local"]
    if "remote" in wanted and \
            metafunc.definition.get_closest_marker("slow_remote"):
        wanted.append("slow_remote")
    # Every test of the remote data plane also runs on a kubernetes
    # sandbox (the fake API server, the pod proxy, a real agent) and on a
    # modal one (the fake Modal server, a real agent behind a TLS tunnel).
    # SBX_TEST_MIRROR=0 turns this mirroring off (scripts/test.sh does so
    # in the sanitizer builds: the kubernetes and modal suites still run
    # there, the data-plane matrix over them runs in the normal build).
    if "remote" in wanted and MIRROR and \
            not metafunc.definition.get_closest_marker("remote_only"):
        wanted += [p for p in ("kubernetes", "modal") if p not in wanted]
    if PROVIDERS is not None:
        wanted = [p for p in wanted if p in PROVIDERS]
    metafunc.parametrize("provider", wanted, indirect=True)


def pytest_sessionstart(session):
    mounts.cleanup_stale_runs()


# Test files of one backend, beyond the `provider` parameter: they need it
# built in (meson -Dkubernetes=, -Dmodal=).
MODULE_PROVIDER = {"test_kubernetes": "kubernetes", "test_modal": "modal",
                   "test_mgrpc": "modal"}


def not_built_reason(build_dir, item):
    """Why `item` cannot run in this build (a backend left out), or None."""
    wanted = set()
    mod = getattr(item, "module", None)
    if mod is not None:
        name = mod.__name__.rpartition(".")[2]
        if name in MODULE_PROVIDER:
            wanted.add(MODULE_PROVIDER[name])
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "provider" in callspec.params:
        wanted.add(callspec.params["provider"])
    for p in sorted(wanted):
        reason = testenv_env.not_built_reason(build_dir, p)
        if reason:
            return reason
    return None


def pytest_collection_modifyitems(config, items):
    reason = testenv.fuse_unusable_reason()
    timeout_plugin = config.pluginmanager.hasplugin("timeout")
    build_dir = testenv.find_build_dir(config.getoption("--build-dir"))
    for item in items:
        if reason and not item.get_closest_marker("nofuse"):
            item.add_marker(pytest.mark.skip(
                reason=f"{testenv.NO_FUSE_TAG}: no usable FUSE: {reason}"))
        missing = not_built_reason(build_dir, item)
        if missing and os.environ.get("CI") == "true":
            # CI builds every backend: a missing one is a failure there
            # (pytest_runtest_setup), never a quiet skip.
            item.sbx_not_built = missing
        elif missing:
            item.add_marker(pytest.mark.skip(reason=missing))
        if timeout_plugin and not item.get_closest_marker("timeout"):
            # The thread method works even when the test is stuck in a
            # FUSE request that signals cannot interrupt.
            item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT,
                                                method="thread"))


def pytest_runtest_setup(item):
    missing = getattr(item, "sbx_not_built", None)
    if missing:
        pytest.fail(f"{missing}; under CI=true every backend must be "
                    f"built (scripts/install-deps.sh installs what they "
                    f"need)", pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def pytest_runtest_logreport(report):
    if report.skipped:
        COUNTS["skipped"] += 1
    elif report.failed:
        COUNTS["failed"] += 1
    elif report.when == "call":
        COUNTS["passed"] += 1


def pytest_sessionfinish(session, exitstatus):
    if (COUNTS["skipped"] and not COUNTS["passed"] and not COUNTS["failed"]
            and exitstatus == 0):
        session.exitstatus = 77  # meson: SKIP, never a pass


# -- fixtures -----------------------------------------------------------------


@pytest.fixture(scope="session")
def build_dir(request):
    d = testenv.find_build_dir(request.config.getoption("--build-dir"))
    sbx = d / "cli" / "sbx"
    if not sbx.exists():
        pytest.fail(f"{sbx} is not built: run `meson setup {d} && "
                    f"ninja -C {d}` or pass --build-dir", pytrace=False)
    return d


@pytest.fixture
def sbx_env(request, tmp_path, build_dir):
    env = testenv.SbxEnv(tmp_path / "sbx", build_dir)
    yield env
    notes = env.cleanup()
    problems = env.problems()
    call = getattr(request.node, "rep_call", None)
    test_passed = call is not None and call.passed
    for n in notes:
        sys.stderr.write(f"[sbx teardown] {n}\n")
    if mounts.mounts_under(env.root):
        pytest.fail("mounts left behind under " + str(env.root),
                    pytrace=False)
    if test_passed and (problems or any(n.startswith("sbx down") for n in notes)):
        pytest.fail("teardown found problems:\n" + "\n".join(problems + notes),
                    pytrace=False)


@pytest.fixture
def repo(sbx_env):
    return sbx_env.make_repo()


@pytest.fixture
def provider(request):
    p = getattr(request, "param", "local")
    if p not in KNOWN_PROVIDERS:
        pytest.fail(f"provider {p!r} has no test setup "
                    f"(known: {', '.join(KNOWN_PROVIDERS)})", pytrace=False)
    return p


@pytest.fixture
def agent(sbx_env, repo):
    from testenv.agent import Agent, make_agent_root
    root = make_agent_root(sbx_env, repo, sbx_env.root / "agent-root",
                           "sbx/t1")
    a = Agent(sbx_env.bin("sbx-agent"), root, sbx_env.root / "agent",
              env=sbx_env.env)
    a.start()
    yield a
    a.stop()


@pytest.fixture(scope="session")
def kube_fake_server(build_dir, tmp_path_factory):
    """One fake Kubernetes API server for the whole run."""
    from testenv.kube import KubeFakeServer
    fake = KubeFakeServer(tmp_path_factory.mktemp("kube") / "fake",
                          build_dir / "agent" / "sbx-agent")
    try:
        fake.start()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    yield fake
    fake.stop()


@pytest.fixture(scope="session")
def modal_fake_server(build_dir, tmp_path_factory):
    """One fake Modal server (and agent bundle) for the whole run."""
    from testenv.modal import ModalFakeServer, make_bundle
    d = tmp_path_factory.mktemp("modal")
    fake = ModalFakeServer(d / "fake", build_dir / "agent" / "sbx-agent")
    try:
        fake.start()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    fake.bundle = make_bundle(build_dir, d / "bundle")
    yield fake
    fake.stop()


@pytest.fixture
def sandbox(request, sbx_env, repo, provider):
    if provider == "local":
        sb = sbx_env.up("t1", repo, "--provider", provider)
        sb.provider = provider
        yield sb
        return
    if provider in ("kubernetes", "modal"):
        if provider == "kubernetes":
            from testenv.kube import KubeSandbox as cls
            fake = request.getfixturevalue("kube_fake_server")
        else:
            from testenv.modal import ModalSandbox as cls
            fake = request.getfixturevalue("modal_fake_server")
        sb = cls.up(sbx_env, "t1", fake, repo)
        try:
            yield sb
            call = getattr(request.node, "rep_call", None)
            if call is not None and call.failed:
                sys.stderr.write(f"[{provider} sandbox] "
                                 f"{sbx_env.log_tail('t1')}\n--- fake ---\n"
                                 f"{fake.log_tail()}\n")
        finally:
            sb.down()
        return
    from testenv.agent import up_remote
    from testenv.latency_proxy import ProxyProcess
    agent = request.getfixturevalue("agent")
    proxy = None
    if provider == "slow_remote":
        proxy = ProxyProcess(agent.address,
                             delay_ms=SLOW_REMOTE_DELAY_MS).start()
    try:
        yield up_remote(sbx_env, "t1", agent, proxy, repo=repo)
        call = getattr(request.node, "rep_call", None)
        if call is not None and call.failed:
            sys.stderr.write(f"[remote sandbox] {sbx_env.log_tail('t1')}\n"
                             f"--- agent output ---\n"
                             f"{agent.output()[-4000:]}\n")
        # Down while the agent still answers (sbx_env's teardown comes
        # after the agent fixture's).
        sbx_env.sbx("down", "t1", "--force", timeout=60)
    finally:
        if proxy is not None:
            proxy.close()


@pytest.fixture
def plain_dir(tmp_path):
    d = tmp_path / "plain"
    d.mkdir()
    return d
