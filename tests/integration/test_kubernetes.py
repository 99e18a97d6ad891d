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
    yield sbx_env
    # No pod may outlive its test.
    for name in sbx_env.session_names():
        sbx_env.sbx("--config", str(path), "down", name, "--force",
                    timeout=120)


def up(env, name, *extra, check=True):
    r = env.sbx("--config", str(env.kube_config), "up", name, "--provider",
                "kubernetes", *extra, timeout=120)
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
