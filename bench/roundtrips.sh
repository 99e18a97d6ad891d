#!/usr/bin/env bash
# Which requests reach sbx-agent, per workload, on a remote mount.
#
#   sudo bench/roundtrips.sh [BUILD_DIR]      (default BUILD_DIR: build)
#
# The tree is the one of bench/remote.sh: a copy of /usr/include/linux in a
# fresh git repository (core.checkStat=minimal, core.trustctime=false) plus
# an ignored BIG_MB file (blob/big.bin).  sbx-agent serves it; the mount is
#
#   sbx daemon -> bench/reqlog.py -> latency proxy (DELAY_MS each way)
#              -> sbx-agent
#
# reqlog.py forwards bytes unchanged and writes one JSON line per request
# (method, path with its query, the op kinds of a batch, status, bytes,
# start and end as the client sees them, and how many requests were in
# flight when it began, the watch stream not counted).  The summary line of
# a workload gives its wall time, the time with at least one request out
# (also in round trips), and the most requests in flight at once.  The
# mount's read_ahead_kb is printed after each mount.  For each workload below the script notes the
# log's end, runs the workload, waits SETTLE seconds (the write-back
# flusher pushes within about one second) and prints the requests it
# caused: a count per kind, and the sequence in order (up to SHOW lines).
#
# Workloads (cold: sbx umount, cache removed, page cache dropped, sbx
# mount, then IDLE seconds for the mount's own requests to pass; warm:
# right after the same workload ran once):
#   grep-cold, grep-warm        grep -r ABSENT linux
#   ls-cold, ls-warm            ls -lR linux
#   git-status-cold/-warm       git status --porcelain
#   git-startup-cold/-warm      git status; git rev-parse --show-toplevel;
#                               git log -1 (what opencode runs at start)
#   editor-save                 temp write + fsync + rename over
#                               linux/kernel.h
#   create-1                    open(O_CREAT) + write 100 bytes + close of
#                               a new file in a warm directory
#   delete-1                    unlink of that file
#   create-10-newdir            mkdir + 10 x (create, write 100 B, close)
#   delete-10                   10 unlinks + rmdir of that directory
#   small-rows                  bench/remote.sh's create and unlink rows
#                               as it runs them: 3 passes back to back of
#                               mkdir, 100 creates, 100 unlinks, rmdir;
#                               each phase reported on its own
#   untar-netfilter             mkdir + tar -x of linux/netfilter (~90
#                               small files, as root) into the mount
#   seq-read-cold               dd bs=1M of blob/big.bin after a cold mount
#   seq-write                   dd bs=1M count=BIG_MB of a new file, close
#   checkout-20                 git checkout of a branch (made natively)
#                               that changes 20 files of linux/
#   exec-sbx, exec-shim         sbx exec bench -- true; sbx-exec true with
#                               cwd in the mount
#
# Environment: DELAY_MS (default 10), BIG_MB (default 256), SETTLE (default
# 1.5), IDLE (default 2), SHOW (default 40), RA_KB (sets the mount's
# read_ahead_kb after each mount), ONLY="grep-cold ls-warm ..."
# runs a subset, LOG=FILE keeps the raw request log there, KEEP=1 keeps the
# temporary directory.  Needs root (dropping caches).
set -euo pipefail

BENCH=roundtrips.sh
. "$(dirname "$0")/common.sh"
bench_build "${1:-}" SBX SHIM AGENT
DELAY_MS=${DELAY_MS:-10}
BIG_MB=${BIG_MB:-256}
SRC=${SRC:-/usr/include/linux}
[ "$(id -u)" -eq 0 ] || die "run as root (dropping caches)"

bench_workdir sbx-bench-rt
tree=$work/tree
sbxmnt=""
reqlog=${LOG:-$work/requests.jsonl}
: >"$reqlog"

make_linux_tree "$tree" "$BIG_MB"
start_agent "$tree" agent
start_proxy "$agent_port"
"$PY" "$top/bench/reqlog.py" --listen 127.0.0.1:0 \
	--target "127.0.0.1:$proxy_port" --log "$reqlog" \
	>"$work/reqlog.port" 2>"$work/reqlog.log" &
pids+=($!)
wait_port "$work/reqlog.port" "$work/reqlog.log"
sbxmnt=$(bench_up_remote bench "$port") ||
	die "sbx up failed: $(cat "$SBX_HOME/logs/bench.log" 2>/dev/null)"
[ -f "$sbxmnt/linux/kernel.h" ] || die "$sbxmnt does not show the tree"

# what the kernel was told (seq-read: request size and requests in flight);
# RA_KB=N overrides the mount's read_ahead_kb after every mount (to try)
ra() {
	local f
	f=/sys/class/bdi/$(mountpoint -d "$sbxmnt")/read_ahead_kb
	[ -n "${RA_KB:-}" ] && echo "$RA_KB" >"$f"
	echo "bench/roundtrips.sh: mount $sbxmnt: $f = $(cat "$f" 2>/dev/null || echo '?')" >&2
}
ra
cold_sbx_script "$work/cold.sh" bench "$sbxmnt"
cat >>"$work/cold.sh" <<EOF
$(declare -f ra)
sbxmnt=$sbxmnt RA_KB=${RA_KB:-} ra
EOF

export work tree sbxmnt reqlog SBX SHIM DELAY_MS BIG_MB
"$PY" - <<'PY'
import collections, json, os, subprocess, sys, time

E = os.environ
work, mnt, log = E["work"], E["sbxmnt"], E["reqlog"]
SETTLE = float(E.get("SETTLE", "1.5"))
IDLE = float(E.get("IDLE", "2"))
SHOW = int(E.get("SHOW", "40"))
ONLY = set(E.get("ONLY", "").split())
RTT = 2 * float(E["DELAY_MS"]) / 1000
ABSENT = "ZZ_sbx_bench_string_that_is_nowhere_ZZ"


def sh(cmd, cwd=None):
    return subprocess.run(["bash", "-c", cmd], cwd=cwd,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def cold():
    r = sh(f"bash {work}/cold.sh")
    if r.returncode:
        sys.exit(f"cold mount failed: {r.stderr.decode()}")
    sys.stderr.write(r.stderr.decode())   # the mount's read_ahead_kb
    time.sleep(IDLE)


def kind(rec):
    p = rec["path"].split("?", 1)[0]
    if "/v1/exec/" in p:
        rest = p.split("/v1/exec/", 1)[1].split("/", 1)
        p = "/v1/exec/ID" + ("/" + rest[1] if len(rest) > 1 else "")
    k = f'{rec["method"]} {p}'
    if "ops" in rec:
        k += " {" + ",".join(rec["ops"]) + "}"
    return k


def query(rec):
    q = rec["path"].split("?", 1)
    return q[1] if len(q) > 1 else ""


def begin(name, prep):
    """None when ONLY leaves `name` out; else run prep, let its requests
    pass and return where the workload's requests start in the log."""
    if ONLY and name not in ONLY:
        return None
    if prep:
        prep()
    time.sleep(0.3)
    return os.path.getsize(log)


def run(name, fn, prep=None):
    start = begin(name, prep)
    if start is None:
        return
    t = time.perf_counter()
    fn()
    el = time.perf_counter() - t
    time.sleep(SETTLE)
    report(name, read_log(start), el)


def read_log(start):
    """The requests logged past byte `start`, in the order they began;
    the watch stream and other never-ending requests are not a
    workload's."""
    with open(log) as f:
        f.seek(start)
        recs = [json.loads(l) for l in f if l.strip()]
    recs.sort(key=lambda r: r["t0"])
    return [r for r in recs if not r["path"].startswith("/v1/watch")]


def report(name, recs, el):
    cnt = collections.Counter(kind(r) for r in recs)
    maxin = max((r.get("inflight", 1) for r in recs), default=0)
    # time with at least one request out, over the workload's wall time
    busy, end = 0.0, None
    for r in recs:
        t0, t1 = r["t0"], r["t1"] or r["t0"]
        if end is None or t0 > end:
            busy += t1 - t0
            end = t1
        elif t1 > end:
            busy += t1 - end
            end = t1
    print(f"\n## {name}: {len(recs)} requests, {el:.3f} s wall, "
          f"{busy:.3f} s with a request out (~{busy / RTT:.0f} RTT), "
          f"at most {maxin} in flight")
    for k, n in cnt.most_common():
        print(f"  {n:6d}  {k}")
    t00 = recs[0]["t0"] if recs else 0
    for r in recs[:SHOW]:
        extra = ""
        if "op_paths" in r:
            extra = " " + " ".join(r["op_paths"])[:100]
        elif r.get("argv"):
            extra = " " + " ".join(r["argv"])[:60]
        q = query(r)[:90]
        dur = f'{(r["t1"] - r["t0"]) * 1000:7.1f}' if r["t1"] else "   open"
        print(f"    +{(r['t0'] - t00) * 1000:8.1f} ms {dur} ms "
              f"in{r.get('inflight', 1):2d}  {kind(r)}  {q}{extra}  "
              f"-> {r['status']} {r['resp_bytes']} B")
    if len(recs) > SHOW:
        print(f"    ... {len(recs) - SHOW} more")
    if name.startswith("seq-"):
        sizes = collections.Counter()
        for r in recs:
            q = dict(x.split("=", 1) for x in query(r).split("&") if "=" in x)
            if "length" in q:
                sizes[int(q["length"])] += 1
            elif r["method"] == "PUT":
                sizes[r["req_bytes"]] += 1
        print("  sizes (bytes: count): " + ", ".join(
            f"{s}: {n}" for s, n in sizes.most_common(8)))
    sys.stdout.flush()


def cmd(argv, cwd=None):
    return lambda: subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL,
                                  stdin=subprocess.DEVNULL)


git = ["git", "-c", f"safe.directory={mnt}", "-C", mnt]
grep = cmd(["grep", "-r", ABSENT, f"{mnt}/linux"])
ls = cmd(["ls", "-lR", f"{mnt}/linux"])
status = cmd(git + ["status", "--porcelain"])


def startup():
    for a in (["status", "--porcelain"], ["rev-parse", "--show-toplevel"],
              ["log", "-1", "--format=%H %s"]):
        subprocess.run(git + a, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


run("grep-cold", grep, cold)
run("grep-warm", grep, grep)
run("ls-cold", ls, cold)
run("ls-warm", ls, ls)
run("git-status-cold", status, cold)
run("git-status-warm", status, status)
run("git-startup-cold", startup, cold)
run("git-startup-warm", startup, startup)

target = os.path.join(mnt, "linux", "kernel.h")
orig = open(os.path.join(E["tree"], "linux", "kernel.h"), "rb").read()


def save():
    tmp = os.path.join(mnt, "linux", ".kernel.h.sbx-bench.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, orig + b"/* saved */\n")
    os.fsync(fd)
    os.close(fd)
    os.replace(tmp, target)


def warm_linux():
    subprocess.run(["ls", "-l", f"{mnt}/linux"], stdout=subprocess.DEVNULL)
    os.stat(target)


run("editor-save", save, warm_linux)
small = os.path.join(mnt, "linux", "sbx-bench-small.txt")


def create1():
    fd = os.open(small, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"x" * 100)
    os.close(fd)


run("create-1", create1, warm_linux)
run("delete-1", lambda: os.unlink(small), warm_linux)
newdir = os.path.join(mnt, "newdir")


def create_n():
    os.mkdir(newdir)
    for i in range(10):
        fd = os.open(os.path.join(newdir, f"f{i}"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"x" * 100)
        os.close(fd)


def delete_n():
    for i in range(10):
        os.unlink(os.path.join(newdir, f"f{i}"))
    os.rmdir(newdir)


run("create-10-newdir", create_n)
run("delete-10", delete_n)


def small_rows(name, prep=None, n=100, passes=3):
    """bench/remote.sh's create and unlink rows as it runs them: passes
    back to back (mkdir, n creates, n unlinks, rmdir), nothing settled in
    between; each phase of each pass reported on its own."""
    start = begin(name, prep)
    if start is None:
        return
    phases = []
    for i in range(passes):
        sd = os.path.join(mnt, f"bench-small-{i}")
        names = [os.path.join(sd, f"f{k:04d}.txt") for k in range(n)]
        t0 = time.monotonic()
        os.mkdir(sd)
        for p in names:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, b"x" * 100)
            os.close(fd)
        t1 = time.monotonic()
        for p in names:
            os.unlink(p)
        os.rmdir(sd)
        t2 = time.monotonic()
        phases += [(f"{name} pass {i + 1} create {n}", t0, t1),
                   (f"{name} pass {i + 1} unlink {n}", t1, t2)]
    time.sleep(SETTLE)
    recs = read_log(start)
    for k, (name, a, b) in enumerate(phases):
        # a request belongs to the phase it began in
        last = k == len(phases) - 1
        report(name, [r for r in recs
                      if a <= r["t0"] and (r["t0"] < b or last)], b - a)


small_rows("small-rows")
small_rows("small-rows-cold", cold)
tarball = os.path.join(work, "small.tar")
subprocess.run(["tar", "-C", E["tree"], "-cf", tarball, "linux/netfilter"],
               check=True)
untar_dir = os.path.join(mnt, "untar")


def untar():
    os.mkdir(untar_dir)
    subprocess.run(["tar", "-C", untar_dir, "-xf", tarball], check=True)


run("untar-netfilter", untar)
subprocess.run(["rm", "-rf", untar_dir])
run("seq-read-cold",
    cmd(["dd", f"if={mnt}/blob/big.bin", "of=/dev/null", "bs=1M"]), cold)
out = os.path.join(mnt, "blob", "out.bin")
run("seq-write",
    cmd(["dd", "if=/dev/zero", f"of={out}", "bs=1M",
         f"count={E['BIG_MB']}"]),
    lambda: os.listdir(os.path.join(mnt, "blob")))
if os.path.exists(out):
    os.unlink(out)
# git checkout of a branch changing 20 files (made natively)
gn = ["git", "-C", E["tree"], "-c", "user.name=b", "-c", "user.email=b@b"]


def make_branch():
    subprocess.run(gn + ["checkout", "-qb", "other"], check=True)
    for f in sorted(os.listdir(os.path.join(E["tree"], "linux")))[:20]:
        p = os.path.join(E["tree"], "linux", f)
        if os.path.isfile(p):
            with open(p, "a") as fh:
                fh.write("/* changed on other */\n")
    subprocess.run(gn + ["commit", "-qam", "other"], check=True)
    subprocess.run(gn + ["checkout", "-q", "main"], check=True)
    time.sleep(1)
    subprocess.run(git + ["status", "--porcelain"], stdout=subprocess.DEVNULL)


if not ONLY or "checkout-20" in ONLY:
    run("checkout-20", cmd(git + ["checkout", "-q", "other"]), make_branch)
run("exec-sbx", cmd([E["SBX"], "exec", "bench", "--", "true"]),
    cmd([E["SBX"], "exec", "bench", "--", "true"]))
run("exec-shim", cmd([E["SHIM"], "true"], cwd=mnt),
    cmd([E["SHIM"], "true"], cwd=mnt))
PY
