"""The modal provider against the fake Modal server (tests/fakes/).

The fake speaks Modal's gRPC API over TLS and runs every sandbox as a real
sbx-agent behind a TLS "tunnel": the mount, exec and the change stream are
the real thing; image builds are simulated.
"""

import json
import os
import time

import pytest

from testenv import read_bytes
from testenv.modal import configure


@pytest.fixture
def modal_fake(modal_fake_server):
    return modal_fake_server


@pytest.fixture
def menv(sbx_env, modal_fake):
    configure(sbx_env, modal_fake, modal_fake.bundle)
    modal_fake.control("DELETE", "/fail")
    yield sbx_env
    modal_fake.control("DELETE", "/fail")
    for name in sbx_env.session_names():
        sbx_env.sbx("down", name, "--force", timeout=120)


def up(env, name, *extra, check=True, cwd=None):
    # Outside any repository: nothing is sent into the sandbox unless asked.
    r = env.sbx("up", name, "--provider", "modal", *extra, timeout=180,
                cwd=cwd or env.root)
    if check:
        assert r.rc == 0, f"{r}\n{env.log_tail(name)}"
    return r


def mnt_of(r):
    from pathlib import Path
    return Path(r.out.strip().splitlines()[-1])


def test_up_files_exec_status_down(menv, modal_fake):
    r = up(menv, "m1", "--image", "python:3.12")
    m = mnt_of(r)
    st = menv.sbx("status", "m1", "--json").json()
    assert st["provider"] == "modal" and st["state"] == "ready", st
    sid = st["sandbox_id"]
    assert sid.startswith("sb-")

    # the call sequence, with the metadata Modal requires
    seq = [c["method"] for c in modal_fake.calls()]
    for rpc in ("EnvironmentGetOrCreate", "AppGetOrCreate",
                "ImageGetOrCreate", "SandboxCreate", "SandboxGetTaskId",
                "SandboxGetTunnels"):
        assert rpc in seq, seq
    create = modal_fake.calls("SandboxCreate")[-1]
    assert create["idempotency_key"]
    assert str(create["client_type"]) == "7"
    img = modal_fake.control("GET", "/images")
    assert "python:3.12" in json.dumps(img)

    (m / "hello.txt").write_text("through the tunnel\n")
    root = modal_fake.sandbox_root(sid)
    assert (root / "hello.txt").read_text() == "through the tunnel\n"
    r = menv.sbx("exec", "m1", "--", "sh", "-c",
                 "cat hello.txt; echo x > made; env | grep -c SBX_AGENT_TOKEN;"
                 " exit 4")
    assert r.rc == 4, r
    assert "through the tunnel" in r.out
    assert r.out.strip().endswith("0")      # the token is not inherited
    assert read_bytes(m / "made") == b"x\n"

    r = menv.sbx("down", "m1", timeout=120)
    assert r.rc == 0, r
    assert "snapshot" in r.err              # files kept before the end
    assert modal_fake.calls("SandboxTerminate")


def test_snapshot_and_restore(menv, modal_fake):
    m = mnt_of(up(menv, "m2"))
    (m / "a.txt").write_text("one")
    r = menv.sbx("snapshot", "m2", "-m", "first")
    assert r.rc == 0, r
    snap = r.out.strip().splitlines()[-1]
    assert modal_fake.calls("TaskGetCommandRouterAccess")
    (m / "a.txt").write_text("two")
    r = menv.sbx("restore", "m2", snap, timeout=180)
    assert r.rc == 0, r
    m = mnt_of(menv.sbx("up", "m2"))        # mounted again on the new one
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if read_bytes(m / "a.txt") == b"one":
                break
        except OSError:
            pass
        time.sleep(0.2)
    assert read_bytes(m / "a.txt") == b"one"
    ids = [s["id"] for s in menv.sbx("snapshots", "m2", "--json").json()]
    assert snap in ids and len(ids) >= 2


def test_build_failure_is_reported(menv, modal_fake):
    r = up(menv, "bad", "--image", "example/buildfail:1", check=False)
    assert r.rc != 0
    assert "building the image" in r.err, r
    assert "bad" not in menv.session_names()


def test_sandbox_never_ready_times_out(menv, modal_fake):
    configure(menv, modal_fake, modal_fake.bundle, ready_timeout=3)
    t0 = time.monotonic()
    r = up(menv, "slow", "--image", "example/neverready:1", check=False)
    assert r.rc != 0
    assert "no task" in r.err or "did not answer" in r.err, r
    assert time.monotonic() - t0 < 60
    # the sandbox was ended, not left running
    assert modal_fake.calls("SandboxTerminate")


def test_transient_unavailable_is_retried(menv, modal_fake):
    modal_fake.control("POST", "/fail", {"method": "AppGetOrCreate",
                                          "code": "UNAVAILABLE", "count": 2})
    up(menv, "retried")
    calls = modal_fake.calls("AppGetOrCreate")
    keys = {c["idempotency_key"] for c in calls[-3:]}
    attempts = [c["retry_attempt"] for c in calls[-3:]]
    assert len(keys) == 1, calls[-3:]
    assert [int(a) for a in attempts] == [0, 1, 2]


def test_bad_credentials_are_clear(menv, modal_fake):
    menv.env["MODAL_TOKEN_ID"] = "ak-wrong"
    menv.env["MODAL_TOKEN_SECRET"] = "as-wrong"
    r = up(menv, "denied", check=False)
    assert r.rc != 0
    assert "MODAL_TOKEN_ID" in r.err or "modal.toml" in r.err, r


def test_credentials_from_environment(menv, modal_fake):
    del menv.env["MODAL_CONFIG_PATH"]
    menv.env["MODAL_CONFIG_PATH"] = str(menv.root / "missing.toml")
    menv.env["MODAL_TOKEN_ID"] = modal_fake.ready["other_token_id"]
    menv.env["MODAL_TOKEN_SECRET"] = modal_fake.ready["other_token_secret"]
    menv.env["MODAL_SERVER_URL"] = modal_fake.ready["url"]
    m = mnt_of(up(menv, "envcreds"))
    (m / "f").write_text("ok")
    assert read_bytes(m / "f") == b"ok"


def test_sandbox_killed_under_mount(menv, modal_fake):
    m = mnt_of(up(menv, "killed"))
    sid = menv.sbx("status", "killed", "--json").json()["sandbox_id"]
    modal_fake.control("POST", f"/sandboxes/{sid}/kill", {})
    with pytest.raises(OSError):
        for i in range(50):
            (m / f"x{i}").write_text("x")
            time.sleep(0.1)
    st = menv.sbx("status", "killed", "--json").json()
    assert st["state"] == "error", st
    assert "ended" in json.dumps(st)


def test_gc_by_tag(menv, modal_fake):
    up(menv, "keepme")
    up(menv, "orphaned")
    assert menv.sbx("umount", "orphaned").rc == 0
    menv.state_file("orphaned").unlink()
    (menv.home / "modal" / "orphaned.json").unlink()
    r = menv.sbx("gc", "--provider", "modal", "--dry-run")
    assert r.rc == 0, r
    assert "orphaned" in r.out and "keepme" not in r.out
    r = menv.sbx("gc", "--provider", "modal", timeout=120)
    assert r.rc == 0, r
    r = menv.sbx("gc", "--provider", "modal", "--dry-run")
    assert "orphaned" not in r.out


# -- issue 12: the failures a user meets, fixed once in the shared core --


def test_status_ls_report_ended_and_unreachable(menv, modal_fake):
    """Item 4: a sandbox that ended is SandboxError with its reason in
    status and ls alike; a Modal API that cannot be reached is "unknown"
    with the real class, and status fails."""
    up(menv, "mended")
    up(menv, "mok")
    sid = menv.sbx("status", "mended", "--json").json()["sandbox_id"]
    modal_fake.control("POST", f"/sandboxes/{sid}/kill", {})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        st = menv.sbx("status", "mended", "--json").json()
        if st["state"] == "error":
            break
        time.sleep(0.2)
    assert st["state"] == "error", st
    assert st["error"]["type"] == "SandboxError", st
    assert st["error"]["reason"] == "terminated", st
    ls = {s["session"]: s for s in menv.sbx("ls", "--json").json()}
    assert ls["mended"]["state"] == "error", ls
    assert ls["mended"]["error"]["type"] == "SandboxError", ls
    assert ls["mok"]["state"] == "ready", ls
    r = menv.sbx("status", "mok", "--json",
                 env={"MODAL_SERVER_URL": "https://127.0.0.1:1"})
    assert r.rc == 1, r
    st = r.json()
    assert st["state"] == "unknown", st
    assert st["error"]["type"] == "UnavailableError", st
    assert st["error"]["class"] == "HTTP", st
    ls = {s["session"]: s for s in menv.sbx(
        "ls", "--json", env={"MODAL_SERVER_URL": "https://127.0.0.1:1"}
    ).json()}
    assert ls["mok"]["state"] == "unknown", ls


def test_reserved_env_is_refused_and_env_is_passed(menv, modal_fake):
    """Item 5: "env" exists for Modal too, and SBX_AGENT_TOKEN in it is a
    ConfigError."""
    def set_env(env):
        cfg = json.loads((menv.root / "config.json").read_text())
        cfg["modal"]["env"] = env
        (menv.root / "config.json").write_text(json.dumps(cfg))
    set_env({"SBX_AGENT_TOKEN": "chosen"})
    before = len(modal_fake.calls("SandboxCreate"))
    r = up(menv, "menvbad", check=False)
    assert r.rc == 5, r
    assert "SBX_AGENT_TOKEN" in r.err and "reserved" in r.err, r
    assert len(modal_fake.calls("SandboxCreate")) == before
    set_env({"SANDBOX_MARK": "from-the-config"})
    up(menv, "menvok")
    r = menv.sbx("exec", "menvok", "--", "sh", "-c", 'echo "$SANDBOX_MARK"')
    assert r.rc == 0 and r.out.strip() == "from-the-config", r


def test_crash_at_start_is_explained(menv, modal_fake):
    """Item 6: the sandbox's own account of its end (its log's tail, as
    Modal reports it) is shown whole, not cut with the error message."""
    r = up(menv, "mcrash", "--image", "example/crashlog:1", check=False)
    assert r.rc != 0, r
    assert "exited with code 1" in r.err, r
    assert "sbx: | start step 2" in r.err, r
    assert "sbx: | fatal: cannot serve /workspace" in r.err, r
    assert "mcrash" not in menv.session_names()


def test_data_plane_errors_name_the_tunnel(menv, modal_fake):
    """Item 8: a dead tunnel is named as Modal's tunnel, not the agent."""
    menv.env["SBX_LOG"] = "debug"
    m = mnt_of(up(menv, "mhop"))
    sid = menv.sbx("status", "mhop", "--json").json()["sandbox_id"]
    modal_fake.control("POST", f"/sandboxes/{sid}/kill", {})
    time.sleep(0.5)
    with pytest.raises(OSError):
        os.stat(m / "not-cached")
    log = menv.log_tail("mhop", 20000)
    assert "Modal's tunnel at https://" in log, log
    assert "sbx-agent at" not in log and "is it running" not in log, log


def test_down_of_an_ended_sandbox_says_nothing_saved(menv, modal_fake):
    """Item 9."""
    up(menv, "mgone")
    sid = menv.sbx("status", "mgone", "--json").json()["sandbox_id"]
    modal_fake.control("POST", f"/sandboxes/{sid}/kill", {})
    time.sleep(0.5)
    r = menv.sbx("down", "mgone", timeout=120)
    assert r.rc == 0, r
    assert "nothing to save" in r.err, r


def test_no_leftover_files(menv, modal_fake):
    """Item 10: no lock file after down, no snapshot directory from a
    listing or a failed snapshot."""
    up(menv, "mtidy")
    snapdir = menv.home / "modal" / "snapshots" / "mtidy"
    r = menv.sbx("snapshots", "mtidy", "--json")
    assert r.rc == 0 and r.json() == [], r
    assert not snapdir.exists()
    modal_fake.control("POST", "/fail", {"method": "*", "code": "INTERNAL",
                                         "count": 30,
                                         "service": "TaskCommandRouter"})
    modal_fake.control("POST", "/fail", {"method": "SandboxSnapshotFs",
                                         "code": "INVALID_ARGUMENT",
                                         "count": 1})
    r = menv.sbx("snapshot", "mtidy")
    assert r.rc != 0, r
    assert not snapdir.exists()
    modal_fake.control("DELETE", "/fail")
    r = menv.sbx("down", "mtidy", "--force", timeout=120)
    assert r.rc == 0, r
    assert not (menv.home / "sessions" / "mtidy.lock").exists()


def test_exec_uses_the_sandbox_environment(menv, modal_fake):
    """Item 11: HOME and PATH are the sandbox's, not the client's; -e
    wins."""
    mtest = up(menv, "menvx")
    sid = menv.sbx("status", "menvx", "--json").json()["sandbox_id"]
    fs_home = str(modal_fake.sandbox_root(sid).parent / "root")
    client = {"PATH": "/client-only-dir:" + menv.env["PATH"]}
    r = menv.sbx("exec", "menvx", "--", "sh", "-c",
                 'echo "H=$HOME"; echo "P=$PATH"', env=client)
    assert r.rc == 0, r
    out = dict(line.split("=", 1) for line in r.out.splitlines())
    assert out["H"] == fs_home, (out, fs_home)
    assert "/client-only-dir" not in out["P"], out
    r = menv.sbx("exec", "-e", "HOME=/chosen", "menvx", "--", "sh", "-c",
                 'echo "$HOME"', env=client)
    assert r.rc == 0 and r.out.strip() == "/chosen", r
    del mtest
