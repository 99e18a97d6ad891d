import os, random, subprocess, sys, pytest

@pytest.mark.providers("remote")
@pytest.mark.timeout(900)
def test_hunt(sandbox, plain_dir, tmp_path):
    seed = random.randrange(1, 10**9)
    (sandbox.mnt / "rops").mkdir()
    (plain_dir / "rops").mkdir()
    r = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "randomops.py"),
                        "--mount", str(sandbox.mnt / "rops"), "--plain", str(plain_dir / "rops"),
                        "--workdir", str(tmp_path / "w"), "--seed", str(seed), "--procs", "4",
                        "--ops", "100000", "--time-limit", "30", "--keep-going", "3"],
                       capture_output=True, text=True, timeout=850)
    out = os.environ["HUNT_DIR"]
    os.makedirs(out, exist_ok=True)
    open(f"{out}/{seed}.out", "w").write(r.stdout + r.stderr)
    if "MISMATCH" in r.stdout:
        log = sandbox.env.log_file(sandbox.name)
        open(f"{out}/{seed}.log", "wb").write(log.read_bytes())
        subprocess.run(["cp", "-r", str(tmp_path / "w"), f"{out}/{seed}.w"])
