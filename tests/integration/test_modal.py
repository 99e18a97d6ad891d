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


def up(env, name, *extra, check=True):
    r = env.sbx("up", name, "--provider", "modal", *extra, timeout=180)
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
