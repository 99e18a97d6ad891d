"""The kubernetes provider against the fake API server (tests/fakes/).

The fake runs a real sbx-agent per pod and forwards the pod proxy
subresource to it, so everything below the API (mount, exec, watch,
archive) is the real thing; only scheduling and image pulls are simulated.
"""

import json
import os
import time
from pathlib import Path

import pytest

from testenv import read_bytes

NS = "sbx-test"


@pytest.fixture
def fake(kube_fake_server):
    return kube_fake_server


@pytest.fixture
def kenv(sbx_env, kube_fake_server):
    """sbx_env with a config file pointing at the fake."""
    fake = kube_fake_server
    cfg = {"kubernetes": {"kubeconfig": str(fake.kubeconfig),
                          "ready_timeout": 30, "timeout": 20}}
    path = sbx_env.root / "kube-config.json"
    path.write_text(json.dumps(cfg))
    sbx_env.kube_config = path
    fake.clear()
    yield sbx_env
    fake.clear()
    # No pod may outlive its test.
    for name in sbx_env.session_names():
        sbx_env.sbx("--config", str(path), "down", name, "--force",
                    timeout=120)


def up(env, name, *extra, check=True, cwd=None):
    # Outside any repository: nothing is sent into the pod unless asked.
    r = env.sbx("--config", str(env.kube_config), "up", name, "--provider",
                "kubernetes", *extra, timeout=120, cwd=cwd or env.root)
    if check:
        assert r.rc == 0, f"{r}\n{env.log_tail(name)}"
    return r


def ksbx(env, *args, **kw):
    return env.sbx("--config", str(env.kube_config), *args, **kw)


def mnt_of(r):
    return Path(r.out.strip().splitlines()[-1])


def test_up_files_exec_status_down(kenv, fake):
    r = up(kenv, "k1", "--image", "python:3.12")
    m = mnt_of(r)
    pod = fake.pod("k1")
    assert pod is not None
    spec = pod["spec"]
    labels = pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "sbx"
    assert spec["containers"][0]["image"] == "python:3.12"
    assert spec["initContainers"][0]["name"] == "sbx-agent-install"
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 86400
    assert spec["containers"][0]["readinessProbe"]["httpGet"]["path"] == \
        "/v1/health"

    # files through the mount, commands inside the pod
    (m / "hello.txt").write_text("from the mount\n")
    assert read_bytes(m / "hello.txt") == b"from the mount\n"
    r = ksbx(kenv, "exec", "k1", "--", "sh", "-c",
             "cat hello.txt; echo made > made.txt; exit 3")
    assert r.rc == 3, r
    assert "from the mount" in r.out
    assert read_bytes(m / "made.txt") == b"made\n"

    st = ksbx(kenv, "status", "k1", "--json").json()
    assert st["state"] == "ready", st
    assert st["provider"] == "kubernetes"

    # down keeps a snapshot of the workdir, then deletes the pod
    r = ksbx(kenv, "down", "k1", timeout=120)
    assert r.rc == 0, r
    assert "snapshot" in r.err
    assert fake.pod("k1") is None


def test_snapshot_restore(kenv, fake):
    m = mnt_of(up(kenv, "k2"))
    (m / "a.txt").write_text("version 1")
    os.mkdir(m / "dir")
    (m / "dir" / "b").write_text("b")
    os.symlink("a.txt", m / "link")
    r = ksbx(kenv, "snapshot", "k2", "-m", "first")
    assert r.rc == 0, r
    snap = r.out.strip().splitlines()[-1]
    (m / "a.txt").write_text("version 2")
    (m / "extra").write_text("not in the snapshot")
    r = ksbx(kenv, "restore", "k2", snap, timeout=120)
    assert r.rc == 0, r
    deadline = time.monotonic() + 5
    while read_bytes(m / "a.txt") != b"version 1" and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    assert read_bytes(m / "a.txt") == b"version 1"
    assert read_bytes(m / "dir" / "b") == b"b"
    assert os.readlink(m / "link") == "a.txt"
    assert not (m / "extra").exists()
    r = ksbx(kenv, "snapshots", "k2", "--json")
    ids = [s["id"] for s in r.json()]
    assert snap in ids and len(ids) == 2  # + the safety one before restore

    # into a new sandbox: SESSION/ID
    m3 = mnt_of(up(kenv, "k3"))
    r = ksbx(kenv, "restore", "k3", f"k2/{snap}", timeout=120)
    assert r.rc == 0, r
    assert read_bytes(m3 / "a.txt") == b"version 1"


@pytest.mark.parametrize("image,reason", [
    ("example/errimagepull:1", "ErrImagePull"),
    ("example/crashloop:1", "exited"),
])
def test_start_failures_fail_fast(kenv, fake, image, reason):
    t0 = time.monotonic()
    r = up(kenv, "bad", "--image", image, check=False)
    assert r.rc != 0
    assert reason in r.err, r
    assert time.monotonic() - t0 < 25
    assert fake.pod("bad") is None          # no pod left behind
    assert "bad" not in kenv.session_names()


def test_unschedulable(kenv, fake):
    cfg = json.loads(kenv.kube_config.read_text())
    cfg["kubernetes"]["node_selector"] = {"sbx.test/unschedulable": "yes"}
    kenv.kube_config.write_text(json.dumps(cfg))
    r = up(kenv, "nosched", check=False)
    assert r.rc != 0
    assert "Unschedulable" in r.err, r


def test_contexts(kenv, fake):
    for ctx in ("cert", "insecure"):
        name = f"ctx-{ctx}"
        m = mnt_of(up(kenv, name, "--context", ctx))
        (m / "f").write_text(ctx)
        assert read_bytes(m / "f") == ctx.encode()
        r = ksbx(kenv, "down", name, "--force", timeout=120)
        assert r.rc == 0, r


def test_bad_context_is_clear(kenv, fake):
    r = up(kenv, "nope", "--context", "no-such-context", check=False)
    assert r.rc != 0
    assert "no-such-context" in r.err


def test_pod_deleted_under_mount(kenv, fake):
    m = mnt_of(up(kenv, "gone"))
    (m / "x").write_text("x")
    pod = fake.pod("gone")["metadata"]["name"]
    st, _ = fake.api("DELETE", f"/api/v1/namespaces/{NS}/pods/{pod}",
                     {"gracePeriodSeconds": 0})
    assert st == 200
    deadline = time.monotonic() + 10
    while fake.pod("gone") is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    t0 = time.monotonic()
    with pytest.raises(OSError):
        (m / "new-file").write_text("y")
    assert time.monotonic() - t0 < 30
    st = ksbx(kenv, "status", "gone", "--json").json()
    assert st["state"] == "error", st
    assert "no longer exists" in json.dumps(st)


def test_gc_deletes_orphans_only(kenv, fake):
    up(kenv, "keep")
    up(kenv, "orphan")
    # the orphan's session record is lost (the pod is still there)
    assert ksbx(kenv, "umount", "orphan").rc == 0
    kenv.state_file("orphan").unlink()
    r = ksbx(kenv, "gc", "--provider", "kubernetes", "--dry-run")
    assert r.rc == 0, r
    assert "orphan" in r.out and "keep" not in r.out
    assert fake.pod("orphan") is not None
    r = ksbx(kenv, "gc", "--provider", "kubernetes", timeout=120)
    assert r.rc == 0, r
    assert fake.pod("orphan") is None
    assert fake.pod("keep") is not None


def test_evicted_pod_is_reported(kenv, fake):
    m = mnt_of(up(kenv, "evicted"))
    (m / "x").write_text("x")
    name = fake.pod("evicted")["metadata"]["name"]
    st, j = fake.api("POST", f"/fake/pods/{NS}/{name}/evict")
    assert st in (200, 201), j
    with pytest.raises(OSError):
        for i in range(50):             # until the change reaches us
            (m / f"y{i}").write_text("y")
            time.sleep(0.1)
    st = ksbx(kenv, "status", "evicted", "--json").json()
    assert st["state"] == "error", st
    assert "Evicted" in json.dumps(st), st


def test_api_errors_are_clear(kenv, fake):
    try:
        st, j = fake.api("POST", "/fake/forbid",
                         {"verb": "create", "resource": "pods"})
        assert st in (200, 201), j
        r = up(kenv, "forbidden", check=False)
        assert r.rc != 0
        assert "forbidden" in r.err and "rbac.yaml" in r.err, r
        fake.api("DELETE", "/fake/forbid")

        st, j = fake.api("POST", "/fake/failures",
                         {"method": "POST", "path": "/pods$", "code": 422,
                          "message": "Pod is invalid"})
        assert st in (200, 201), j
        r = up(kenv, "invalid", check=False)
        assert r.rc != 0
        assert "rejected as invalid" in r.err, r

        # 429 with Retry-After: waited for, then it works
        st, j = fake.api("POST", "/fake/failures",
                         {"method": "POST", "path": "/pods$", "code": 429,
                          "retry_after": 1})
        assert st in (200, 201), j
        t0 = time.monotonic()
        m = mnt_of(up(kenv, "throttled"))
        assert time.monotonic() - t0 >= 1
        (m / "ok").write_text("ok")
    finally:
        fake.api("DELETE", "/fake/forbid")
        fake.api("DELETE", "/fake/failures")


def test_exec_plugin_refreshed_on_401(kenv, fake, tmp_path):
    """Credentials from an exec plugin; when the API server starts
    refusing them (401), sbx runs the plugin again and carries on."""
    import yaml
    cfg = yaml.safe_load(fake.kubeconfig.read_text())
    st, t1 = fake.api("POST", "/fake/tokens", {"user": "plugin-user"})
    assert st in (200, 201), t1
    cur = tmp_path / "current-token"
    runs = tmp_path / "runs"
    cur.write_text(t1["token"])
    plugin = tmp_path / "plugin.sh"
    plugin.write_text(
        "#!/bin/sh\n"
        f"echo run >> {runs}\n"
        'printf \'{"apiVersion":"client.authentication.k8s.io/v1",'
        '"kind":"ExecCredential","status":{"token":"%s"}}\' '
        f'"$(cat {cur})"\n')
    plugin.chmod(0o755)
    cfg["users"].append({"name": "plugin", "user": {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": str(plugin), "interactiveMode": "Never"}}})
    token_ctx = next(c for c in cfg["contexts"] if c["name"] == "token")
    cfg["contexts"].append({"name": "plugin", "context": {
        **token_ctx["context"], "user": "plugin"}})
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump(cfg))
    m = mnt_of(up(kenv, "plugged", "--kubeconfig", str(kc),
                  "--context", "plugin"))
    (m / "before").write_text("1")
    assert runs.read_text().count("run") >= 1
    before = runs.read_text().count("run")

    st, t2 = fake.api("POST", "/fake/tokens", {"user": "plugin-user"})
    assert st in (200, 201), t2
    cur.write_text(t2["token"])
    st, _ = fake.api("POST", f"/fake/tokens/{t1['token']}/expire")
    assert st == 200
    (m / "after").write_text("2")        # 401, plugin again, retried
    assert read_bytes(m / "after") == b"2"
    assert runs.read_text().count("run") > before
    r = ksbx(kenv, "down", "plugged", "--force", timeout=120)
    assert r.rc == 0, r


# -- issue 12: one control-plane core, and the failures a cluster user meets --


def pod_name(fake, session, ns=NS):
    p = fake.pod(session, ns)
    return p["metadata"]["name"] if p else None


def kube_config_copy(fake, tmp_path, server=None):
    """A kubeconfig of our own (its server may be changed later)."""
    import yaml
    cfg = yaml.safe_load(fake.kubeconfig.read_text())
    if server:
        for c in cfg["clusters"]:
            c["cluster"]["server"] = server
    path = tmp_path / "kubeconfig-copy"
    path.write_text(yaml.safe_dump(cfg))
    return path


def set_server(path, server):
    import yaml
    cfg = yaml.safe_load(path.read_text())
    for c in cfg["clusters"]:
        c["cluster"]["server"] = server
    path.write_text(yaml.safe_dump(cfg))


def test_gc_other_namespace_and_leftovers(kenv, fake):
    """Item 1: gc finds the pod of a session made with --namespace (its pin
    names the namespace), and removes what the lost session left here:
    the mount, its daemon, the mountpoint, the lock file."""
    m = mnt_of(up(kenv, "nsorphan", "--namespace", "sbx-other"))
    up(kenv, "nskeep")
    assert fake.pod("nsorphan", "sbx-other") is not None
    pid = ksbx(kenv, "status", "nsorphan", "--json").json()["pid"]
    assert pid > 0 and os.path.ismount(m)
    kenv.state_file("nsorphan").unlink()   # the record is lost, mounted
    r = ksbx(kenv, "gc", "--provider", "kubernetes", "--dry-run")
    assert r.rc == 0, r
    assert "nsorphan" in r.out and "sbx-other/" in r.out, r
    assert "nskeep" not in r.out
    r = ksbx(kenv, "gc", "--provider", "kubernetes", timeout=180)
    assert r.rc == 0, r
    deadline = time.monotonic() + 10
    while fake.pod("nsorphan", "sbx-other") is not None and \
            time.monotonic() < deadline:
        time.sleep(0.2)
    assert fake.pod("nsorphan", "sbx-other") is None
    assert fake.pod("nskeep") is not None
    assert not os.path.ismount(m)
    assert not m.exists(), "the mountpoint directory is left"
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists(), "the daemon is left"
    assert not (kenv.home / "sessions" / "nsorphan.lock").exists()
    assert not (kenv.home / "kubernetes" / "nsorphan.json").exists()


def test_delete_options_and_user_agent(kenv, fake):
    """Item 2: DELETE carries DeleteOptions; every request says sbx/VER."""
    up(kenv, "delopts")
    name = pod_name(fake, "delopts")
    seq = fake.last_seq()
    r = ksbx(kenv, "down", "delopts", "--force", timeout=120)
    assert r.rc == 0, r
    reqs = fake.requests(seq)
    dels = [q for q in reqs if q["method"] == "DELETE" and
            q["path"] == f"/api/v1/namespaces/{NS}/pods/{name}"]
    assert dels, reqs
    assert dels[0]["body"] == {"gracePeriodSeconds": 5,
                               "propagationPolicy": "Background"}, dels[0]
    assert dels[0]["content_type"] == "application/json"
    agents = {q["user_agent"] for q in reqs}
    assert all(a and a.startswith("sbx/") for a in agents), agents


def test_rbac_without_pods_proxy_is_checked_first(kenv, fake):
    """Item 3: without pods/proxy nothing is created; the message names the
    verb and the resource and points at rbac.yaml."""
    fake.forbid(verb="*", resource="pods/proxy")
    seq = fake.last_seq()
    r = up(kenv, "noproxy", check=False)
    assert r.rc == 5, r                     # a configuration problem
    assert "pods/proxy" in r.err and "rbac.yaml" in r.err, r
    assert "get pods/proxy" in r.err, r
    reqs = fake.requests(seq)
    assert any(q["path"].endswith("/selfsubjectaccessreviews")
               for q in reqs), reqs
    assert not any(q["method"] == "POST" and q["path"].endswith("/pods")
                   for q in reqs), "a pod was created"
    assert fake.pod("noproxy") is None
    assert "noproxy" not in kenv.session_names()


def test_rbac_unknown_up_leaves_no_pod(kenv, fake):
    """Item 3: where access cannot be reviewed, a pod whose agent cannot be
    reached is deleted again and the session forgotten; the API server's
    Status message is quoted whole."""
    fake.forbid(verb="create", resource="selfsubjectaccessreviews")
    fake.forbid(verb="*", resource="pods/proxy")
    r = up(kenv, "noproxy2", check=False)
    assert r.rc != 0, r
    assert "deleted again" in r.err, r
    assert 'cannot get resource "pods/proxy"' in r.err, r
    assert "rbac.yaml" in r.err, r
    assert fake.pod("noproxy2") is None
    assert "noproxy2" not in kenv.session_names()
    r = ksbx(kenv, "down", "noproxy2")
    assert r.rc == 3, r                     # nothing left to take down


def test_status_and_ls_report_real_state(kenv, fake, tmp_path):
    """Item 4: status and ls ask the provider and agree: a deleted pod is
    NotFoundError, a crashed one SandboxError with its reason, an API
    server that cannot be reached "unknown" with the real class (and a
    failing exit status)."""
    kc = kube_config_copy(fake, tmp_path)
    up(kenv, "alive")
    up(kenv, "deleted")
    up(kenv, "crashed")
    up(kenv, "unreach", "--kubeconfig", str(kc))
    st, _ = fake.api("DELETE", f"/api/v1/namespaces/{NS}/pods/"
                     f"{pod_name(fake, 'deleted')}", {"gracePeriodSeconds": 0})
    assert st == 200
    st, _ = fake.api("POST", f"/fake/pods/{NS}/{pod_name(fake, 'crashed')}"
                     "/kill")
    assert st == 200
    set_server(kc, "https://127.0.0.1:1")
    try:
        deadline = time.monotonic() + 10
        while fake.pod("deleted") is not None and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        want = {}
        r = ksbx(kenv, "status", "alive", "--json")
        assert r.rc == 0 and r.json()["state"] == "ready", r
        want["alive"] = ("ready", None)
        r = ksbx(kenv, "status", "deleted", "--json")
        st = r.json()
        assert st["state"] == "error", st
        assert st["error"]["type"] == "NotFoundError", st
        want["deleted"] = ("error", "NotFoundError")
        st = ksbx(kenv, "status", "crashed", "--json").json()
        assert st["state"] == "error", st
        assert st["error"]["type"] == "SandboxError", st
        assert st["error"]["reason"] == "Error", st
        want["crashed"] = ("error", "SandboxError")
        r = ksbx(kenv, "status", "unreach", "--json")
        assert r.rc == 1, r
        st = r.json()
        assert st["state"] == "unknown", st
        assert st["error"]["type"] == "UnavailableError", st
        assert st["error"]["class"] == "HTTP", st
        assert "Kubernetes API server" in st["error"]["message"], st
        want["unreach"] = ("unknown", "UnavailableError")
        r = ksbx(kenv, "status", "unreach")
        assert "unknown" in r.out and "UnavailableError" in r.out, r

        t0 = time.monotonic()
        ls = {s["session"]: s for s in ksbx(kenv, "ls", "--json").json()}
        assert time.monotonic() - t0 < 15
        for name, (state, etype) in want.items():
            assert ls[name]["state"] == state, ls[name]
            assert (ls[name].get("error") or {}).get("type") == etype, \
                ls[name]
        r = ksbx(kenv, "ls")
        line = next(x for x in r.out.splitlines() if x.startswith("deleted"))
        assert " error " in line, r.out
    finally:
        set_server(kc, fake.url)


def test_ls_asks_in_parallel_with_a_short_timeout(kenv, fake):
    """Item 4: a hung API server makes `ls` say "unknown" within its short
    timeout instead of hanging, and the other sessions are still asked."""
    up(kenv, "slow1")
    up(kenv, "slow2")
    name = pod_name(fake, "slow1")
    fake.inject(method="GET", path=f"/pods/{name}$", action="delay",
                delay=25, count=5)
    t0 = time.monotonic()
    ls = {s["session"]: s for s in ksbx(kenv, "ls", "--json").json()}
    took = time.monotonic() - t0
    assert took < 12, took
    assert ls["slow1"]["state"] == "unknown", ls["slow1"]
    assert "within" in ls["slow1"]["error"]["message"], ls["slow1"]
    assert ls["slow2"]["state"] == "ready", ls["slow2"]


def test_reserved_env_is_refused(kenv, fake):
    """Item 5: the config's env may not override SBX_AGENT_TOKEN."""
    cfg = json.loads(kenv.kube_config.read_text())
    cfg["kubernetes"]["env"] = {"SBX_AGENT_TOKEN": "chosen"}
    kenv.kube_config.write_text(json.dumps(cfg))
    seq = fake.last_seq()
    r = up(kenv, "tokenenv", check=False)
    assert r.rc == 5, r
    assert "SBX_AGENT_TOKEN" in r.err and "reserved" in r.err, r
    assert not any(q["method"] == "POST" for q in fake.requests(seq))


def test_crash_at_start_shows_logs(kenv, fake):
    """Item 6: the reason of an agent that crashed at start is shown: the
    termination message and the last lines of the log, fetched before the
    pod is deleted."""
    seq = fake.last_seq()
    r = up(kenv, "crashy", "--image", "example/crashstart:1", check=False)
    assert r.rc != 0, r
    assert "Permission denied" in r.err, r          # termination message
    assert "| fatal: sbx-agent: cannot serve" in r.err, r
    assert "| boot step 30" in r.err, r
    assert "| boot step 11\n" not in r.err, r       # 20 lines only
    reqs = fake.requests(seq)
    logs = [i for i, q in enumerate(reqs) if q["path"].endswith("/log")]
    dels = [i for i, q in enumerate(reqs) if q["method"] == "DELETE"]
    assert logs and dels and logs[0] < dels[0], reqs
    assert reqs[logs[0]]["params"]["tailLines"] == ["20"]
    assert reqs[logs[0]]["params"]["container"] == ["sandbox"]
    assert fake.pod("crashy") is None


def test_transient_api_errors_are_retried(kenv, fake):
    """Item 7: a 500 and a reset connection on GET pod and a 503 on the
    watch do not abort `up` (a slow pod start makes sure every one is
    met before the pod is ready)."""
    fake.inject(method="GET", path="/pods/sbx-transient-[^/]*$", code=500,
                count=1)
    fake.inject(method="GET", path="/pods/sbx-transient-[^/]*$",
                action="close", count=1)
    fake.inject(method="GET", path="/pods$", query="watch=", code=503,
                count=1)
    st, _ = fake.api("POST", "/fake/config", {"step_ms": 400})
    assert st == 200
    try:
        m = mnt_of(up(kenv, "transient"))
    finally:
        fake.api("POST", "/fake/config", {"step_ms": 60})
    (m / "ok").write_text("ok")
    hits = [f["hits"] for f in fake.failures()]
    assert hits == [1, 1, 1], fake.failures()


def test_errors_name_the_hop(kenv, fake, tmp_path):
    """Item 8: an API server that cannot be reached is named as such, not
    as the agent."""
    kc = kube_config_copy(fake, tmp_path, server="https://127.0.0.1:1")
    r = up(kenv, "hop", "--kubeconfig", str(kc), check=False)
    assert r.rc != 0
    assert "Kubernetes API server" in r.err, r
    assert "sbx-agent" not in r.err and "is it running" not in r.err, r


def test_data_plane_timeout_names_the_api_server(kenv, fake):
    """Item 8: a hung pod proxy is "no answer from the Kubernetes API
    server (pod proxy ...)", not "from the agent"."""
    cfg = json.loads(kenv.kube_config.read_text())
    cfg["kubernetes"]["timeout"] = 3
    kenv.kube_config.write_text(json.dumps(cfg))
    kenv.env["SBX_LOG"] = "debug"
    m = mnt_of(up(kenv, "hung"))
    fake.inject(method="*", path="/proxy/v1/fs/", action="delay", delay=8,
                count=3)
    with pytest.raises(OSError):
        os.stat(m / "nothing-cached-here")
    log = kenv.log_tail("hung", 20000)
    assert "no answer from the Kubernetes API server" in log, log
    assert "pod proxy to pod" in log, log
    assert "no answer from the agent" not in log, log


def test_down_dead_pod_says_nothing_saved(kenv, fake):
    """Item 9: `sbx down` of a pod that died says there was nothing to
    save, instead of deleting silently."""
    up(kenv, "dead")
    st, _ = fake.api("POST", f"/fake/pods/{NS}/{pod_name(fake, 'dead')}/kill")
    assert st == 200
    deadline = time.monotonic() + 10
    while (fake.pod("dead") or {}).get("status", {}).get("phase") != \
            "Failed" and time.monotonic() < deadline:
        time.sleep(0.1)
    r = ksbx(kenv, "down", "dead", timeout=120)
    assert r.rc == 0, r
    assert "nothing to save" in r.err, r
    assert fake.pod("dead") is None


def test_no_leftover_files(kenv, fake):
    """Item 10: no lock file per session ever created, no empty snapshot
    directory from a listing or a failed snapshot."""
    up(kenv, "tidy")
    snapdir = kenv.home / "kubernetes" / "snapshots" / "tidy"
    r = ksbx(kenv, "snapshots", "tidy", "--json")
    assert r.rc == 0 and r.json() == [], r
    assert not snapdir.exists()
    fake.inject(method="GET", path="/proxy/v1/archive", code=503, count=1)
    r = ksbx(kenv, "snapshot", "tidy")
    assert r.rc != 0, r
    assert not snapdir.exists(), list(snapdir.iterdir())
    assert (kenv.home / "sessions" / "tidy.lock").exists()
    r = ksbx(kenv, "down", "tidy", "--force", timeout=120)
    assert r.rc == 0, r
    assert not (kenv.home / "sessions" / "tidy.lock").exists()
    r = up(kenv, "tidyfail", "--image", "example/errimagepull:1",
           check=False)
    assert r.rc != 0
    assert not (kenv.home / "sessions" / "tidyfail.lock").exists()
    assert list((kenv.home / "sessions").glob("*.lock")) == []


def test_exec_uses_the_container_environment(kenv, fake):
    """Item 11: commands get the pod's environment (its spec's env), not
    the client's PATH; -e still wins."""
    cfg = json.loads(kenv.kube_config.read_text())
    cfg["kubernetes"]["env"] = {"SBX_TEST_MARK": "x"}
    kenv.kube_config.write_text(json.dumps(cfg))
    r = up(kenv, "envcfg", check=False)
    assert r.rc == 5 and "reserved" in r.err, r     # SBX_* is sbx's
    cfg["kubernetes"]["env"] = {"POD_SPEC_MARK": "from-the-pod-spec"}
    kenv.kube_config.write_text(json.dumps(cfg))
    up(kenv, "envpod")
    client = {"PATH": "/client-only-dir:" + kenv.env["PATH"],
              "LANG": "C.UTF-8"}
    r = kenv.sbx("--config", str(kenv.kube_config), "exec", "envpod", "--",
                 "sh", "-c",
                 'echo "P=$PATH"; echo "M=$POD_SPEC_MARK"; echo "L=$LANG";'
                 ' echo "S=$SBX_SESSION"; echo "X=${SBX_EXEC_SET-unset}"',
                 env=client)
    assert r.rc == 0, r
    out = dict(line.split("=", 1) for line in r.out.splitlines())
    assert "/client-only-dir" not in out["P"], out
    assert out["M"] == "from-the-pod-spec", out
    assert out["L"] == "C.UTF-8", out
    assert out["S"] == "envpod", out
    assert out["X"] == "unset", out
    r = kenv.sbx("--config", str(kenv.kube_config), "exec", "-e",
                 "PATH=/usr/bin:/bin:/chosen", "envpod", "--", "sh", "-c",
                 'echo "$PATH"', env=client)
    assert r.rc == 0 and r.out.strip() == "/usr/bin:/bin:/chosen", r


def test_create_timeout_deletes_the_late_pod(kenv, fake):
    """Item 12: a create that timed out while the API server hung and went
    through later leaves no pod behind."""
    cfg = json.loads(kenv.kube_config.read_text())
    cfg["kubernetes"]["timeout"] = 2
    kenv.kube_config.write_text(json.dumps(cfg))
    fake.inject(method="POST", path="/pods$", action="delay", delay=5,
                count=1)
    t0 = time.monotonic()
    r = up(kenv, "latepod", check=False)
    assert r.rc != 0, r
    assert time.monotonic() - t0 < 30
    # The fake carries the create out 5 s after it arrived: only after
    # that can "no pod" mean anything.
    while time.monotonic() < t0 + 6.5:
        time.sleep(0.2)
    deadline = time.monotonic() + 15
    while fake.pod("latepod") is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert fake.pod("latepod") is None, \
        f"the late pod is left\n{r}\n{fake.log_tail()}"
    assert "latepod" not in kenv.session_names()
