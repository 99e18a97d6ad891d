#!/usr/bin/env bash
# Benchmark a remote sbx mount against sshfs, both at 20 ms round trip.
#
#   sudo bench/remote.sh [BUILD_DIR]      (from anywhere, after building;
#                                          default BUILD_DIR: build)
#
# The tree is a copy of /usr/include/linux (~760 files, 6.5 MB) committed to
# a fresh git repository, plus an ignored 256 MiB file (blob/big.bin).  The
# same directory is seen three ways:
#   sbx     sbx-agent serving it, reached through the latency proxy
#           (tests/integration/testenv/latency_proxy.py, DELAY_MS each way),
#           mounted with `sbx up bench --provider remote --url ...`
#   sshfs   a private sshd on loopback (own host key, own authorized key,
#           own config, in the temporary directory; the system sshd and its
#           config are never touched) behind the same kind of latency proxy,
#           mounted with sshfs -o reconnect,ServerAliveInterval=15 and
#           sshfs's default cache settings (sshfs 3.7: dir_cache=yes,
#           dcache_timeout=20 s, entry_timeout=attr_timeout=1 s,
#           kernel_cache off, max_conns=1)
#   native  the directory itself (no network, no FUSE)
# Rows:
#   grep -r cold     grep -r for an absent string; before each run the page
#                    cache is dropped, sshfs is remounted, and sbx gets a
#                    fresh daemon with an empty cache (sbx umount + mount)
#   grep -r warm     the same right after a run (caches warm)
#   ls -lR cold/warm ls -lR of the tree, cold as above
#   git status cold/warm  git status --porcelain at the repository root
#                    (the repository sets core.checkStat=minimal and
#                    core.trustctime=false so that the three views, which
#                    report different inode numbers and ctimes for the same
#                    files, do not make each other re-index)
#   seq read 256MiB  dd bs=1M of blob/big.bin, cold (caches dropped,
#                    remounted); also shown as MB/s
#   editor save      write a temp file + fsync + rename over linux/kernel.h
#                    (what vim/VS Code do), median of SAVES saves
#   exec true        sbx: sbx-exec true with cwd in the mount (through the
#                    daemon, the proxy and the agent); sshfs column: `ssh
#                    host true` through the proxy (a new connection each
#                    time, as a tool would run it), plus a row for ssh over
#                    a ControlMaster connection; native: fork/exec of true
#   sbx exec true    sbx: `sbx exec bench -- true` (the CLI, not the shim);
#                    sshfs column: the ssh ControlMaster figure
#   tool startup cold  git status --porcelain, git rev-parse --show-toplevel,
#                    git log -1 (what a git-using tool such as opencode runs
#                    at start), after a cold start as for grep -r cold
#   create N files   SMALL_FILES x (open O_CREAT|O_EXCL, write 100 bytes,
#                    close) in a new directory (made untimed)
#   unlink N files   unlink of those files, one by one
#   untar N files    tar -xf of the first UNTAR_FILES regular files of
#                    /usr/include (made natively) into a new directory, as
#                    root (so tar also sets owners, modes and times);
#                    COLD_RUNS runs; removed natively afterwards
#   git checkout N   git checkout of a branch that changes CHECKOUT_FILES
#                    files of co/ (20 lines each; the files and the branch
#                    are made natively after every other row that walks the
#                    tree, so that those rows keep the tree described
#                    above), RUNS times; back to main natively after each
#                    (not measured)
#   seq write NMiB   dd if=/dev/zero bs=1M count=WRITE_MB conv=fsync into
#                    blob/ (removed natively after each run); also MB/s
#   scale            (after the table) for each size in SCALE_SIZES, a
#                    generated tree of that many files (100 a directory,
#                    SCALE_KB KiB on average: 80,000 files is ~1 GB, the
#                    size of a Linux kernel tree) served by its own agent
#                    behind its own latency proxy and mounted as session
#                    scaleN: grep -r cold (a fresh daemon with an empty
#                    cache, page cache dropped) for sbx, sshfs and native,
#                    and the sbx daemon's peak RSS (VmHWM in
#                    /proc/PID/status) after it; one run each.  sshfs only
#                    up to SCALE_SSHFS_MAX files: it costs ~70 ms a file at
#                    20 ms RTT (80,000 files would take over an hour)
#   seed repo        the repository in (docs/design.md, "Repository in and
#                    out"): a generated repository of SEED_FILES files of
#                    SEED_KB KiB each (text taken from /usr/include, each
#                    file different; default 10,000 x 10 KiB = 100 MB;
#                    packed by git gc, as a user's repository usually is).
#                    sbx: `sbx up --provider remote --repo` into an empty
#                    agent root behind its own latency proxy (the whole
#                    `up`: seed, then mount); ssh column: `git clone
#                    ssh://...` through the sshd's proxy (with checkout)
#   pull 1 commit    a commit of one changed file made in the sandbox
#                    (`git commit` in the agent's root), then `sbx pull`;
#                    ssh column: the same commit in the served repository,
#                    then `git fetch` in the clone
# Times are medians of COLD_RUNS (cold rows, seed, untar) or RUNS (warm
# rows, pull, small files, checkout, seq write) runs, in seconds.  Ratios:
# sbx/sshfs (< 1 means sbx is faster) and sbx/native.  Goals (last column)
# are those of issue 15 where it set one; untar and git checkout get theirs
# ("5x faster than today") when UNTAR_BASE / CHECKOUT_BASE give today's sbx
# seconds.  Which requests each workload sends to the agent:
# bench/roundtrips.sh.  The setup it shares with the other scripts (agent,
# latency proxy, tree, cold mounts, cleanup): bench/common.sh; the
# generated trees: bench/gentree.py.
#
# Environment: RUNS (default 3), COLD_RUNS (default 3), SAVES (default 10),
# EXEC_RUNS (default 20), DELAY_MS (one-way delay, default 10 = 20 ms RTT),
# SRC (default /usr/include/linux), WORKDIR (default /var/tmp), KEEP=1
# keeps the temporary directory, SKIP_SSHFS=1 / SKIP_SBX=1 leave one side
# out, SKIP_FS=1 leaves out every row but the repository's, SKIP_REPO=1
# those, SEED_FILES / SEED_KB size the seeded repository.  SKIP_BIG=1
# leaves out the big rows (seq read, seq write, untar, git checkout);
# SMALL_FILES (100), UNTAR_FILES (1000), CHECKOUT_FILES (1000) and
# WRITE_MB (256) size them.  SKIP_SCALE=1 leaves out the scale section;
# SCALE_SIZES (default "4000 20000 80000"), SCALE_KB (13) and
# SCALE_SSHFS_MAX (4000) size it.  Needs root (dropping caches, sshd);
# installs openssh-server and sshfs with apt-get if they are missing.
set -euo pipefail

BENCH=remote.sh
. "$(dirname "$0")/common.sh"
RUNS=${RUNS:-3}
COLD_RUNS=${COLD_RUNS:-3}
SAVES=${SAVES:-10}
EXEC_RUNS=${EXEC_RUNS:-20}
DELAY_MS=${DELAY_MS:-10}
SRC=${SRC:-/usr/include/linux}
SKIP_SBX=${SKIP_SBX:-0}
SKIP_SSHFS=${SKIP_SSHFS:-0}
SKIP_FS=${SKIP_FS:-0}
SKIP_REPO=${SKIP_REPO:-0}
SEED_FILES=${SEED_FILES:-10000}
SEED_KB=${SEED_KB:-10}
SKIP_BIG=${SKIP_BIG:-0}
SMALL_FILES=${SMALL_FILES:-100}
UNTAR_FILES=${UNTAR_FILES:-1000}
CHECKOUT_FILES=${CHECKOUT_FILES:-1000}
WRITE_MB=${WRITE_MB:-256}
SKIP_SCALE=${SKIP_SCALE:-0}
SCALE_SIZES=${SCALE_SIZES:-4000 20000 80000}
SCALE_KB=${SCALE_KB:-13}
SCALE_SSHFS_MAX=${SCALE_SSHFS_MAX:-4000}

if [ "$SKIP_SBX" != 1 ]; then
	bench_build "${1:-}" SBX SHIM AGENT
else
	bench_build "${1:-}"
fi
[ "$(id -u)" -eq 0 ] || die "run as root (dropping caches, a private sshd)"
[ -d "$SRC" ] || die "$SRC missing (apt install linux-libc-dev)"
command -v git >/dev/null || die "git missing: apt install git"
if [ "$SKIP_SSHFS" != 1 ]; then
	need=()
	[ -x /usr/sbin/sshd ] || need+=(openssh-server)
	command -v sshfs >/dev/null || need+=(sshfs)
	command -v ssh >/dev/null || need+=(openssh-client)
	if [ ${#need[@]} -gt 0 ]; then
		note "installing ${need[*]} ..."
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" \
			>/dev/null || die "apt-get install ${need[*]} failed"
	fi
fi

bench_workdir sbx-bench-remote
tree=$work/tree
sbxmnt="" sshfsmnt=$work/sshfs
ctl=$work/ssh-ctl
# the ssh ControlMaster; bench_cleanup unmounts sshfs and stops the rest
bench_cleanup_more() {
	[ -S "$ctl" ] && ssh -o ControlPath="$ctl" -O exit bench >/dev/null 2>&1
}

# -- the tree ----------------------------------------------------------------------
big=256
[ "$SKIP_FS" != 1 ] && [ "$SKIP_BIG" != 1 ] || big=0
make_linux_tree "$tree" "$big"
nfiles=$(find "$tree/linux" -type f | wc -l)
ndirs=$(find "$tree/linux" -type d | wc -l)

# -- sbx: agent + proxy + sbx up ------------------------------------------------------
if [ "$SKIP_SBX" != 1 ]; then
	start_agent "$tree" agent
	start_proxy "$agent_port"
	sbxmnt=$(bench_up_remote bench "$proxy_port") ||
		die "sbx up failed: $(cat "$SBX_HOME/logs/bench.log" 2>/dev/null)"
	[ -f "$sbxmnt/linux/kernel.h" ] || die "$sbxmnt does not show the tree"
fi

# -- sshfs: private sshd + proxy + sshfs ------------------------------------------------
if [ "$SKIP_SSHFS" != 1 ]; then
	sd=$work/sshd
	mkdir -p "$sd" /run/sshd
	chmod 700 "$sd"
	ssh-keygen -q -t ed25519 -N '' -f "$sd/host_key"
	ssh-keygen -q -t ed25519 -N '' -f "$sd/client_key"
	cp "$sd/client_key.pub" "$sd/authorized_keys"
	sport=$(free_port)
	sftp=/usr/lib/openssh/sftp-server
	cat >"$sd/sshd_config" <<EOF
Port $sport
ListenAddress 127.0.0.1
HostKey $sd/host_key
PidFile $sd/sshd.pid
AuthorizedKeysFile $sd/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
LogLevel ERROR
Subsystem sftp $sftp
EOF
	/usr/sbin/sshd -D -e -f "$sd/sshd_config" 2>"$sd/sshd.log" &
	pids+=($!)
	start_proxy "$sport"
	sshport=$proxy_port
	cat >"$sd/ssh_config" <<EOF
Host bench
	HostName 127.0.0.1
	Port $sshport
	User root
	IdentityFile $sd/client_key
	IdentitiesOnly yes
	StrictHostKeyChecking no
	UserKnownHostsFile /dev/null
	LogLevel ERROR
	BatchMode yes
EOF
	ok=0
	for _ in $(seq 50); do
		ssh -F "$sd/ssh_config" bench true 2>/dev/null && { ok=1; break; }
		sleep 0.1
	done
	[ $ok = 1 ] || die "private sshd does not answer: $(cat "$sd/sshd.log")"
	mkdir -p "$sshfsmnt"
	sshfs_mount() {
		sshfs -F "$sd/ssh_config" -o reconnect,ServerAliveInterval=15 \
			"bench:$tree" "$sshfsmnt"
	}
	sshfs_mount
	[ -f "$sshfsmnt/linux/kernel.h" ] || die "sshfs does not show the tree"
	ssh -F "$sd/ssh_config" -o ControlMaster=yes -o ControlPath="$ctl" \
		-o ControlPersist=yes -fN bench
fi

# -- the repository rows: a generated repository, an agent with an empty root ---------
seedtree=$work/seed seedroot=$work/seed-root seedurl=""
if [ "$SKIP_REPO" != 1 ]; then
	note "preparing: $SEED_FILES files of $SEED_KB KiB in $seedtree ..."
	"$PY" "$top/bench/gentree.py" seed "$seedtree" "$SEED_FILES" "$SEED_KB"
	git -C "$seedtree" init -q -b main
	git -C "$seedtree" add -A
	git -C "$seedtree" -c user.name=bench -c user.email=bench@sbx.invalid \
		-c gc.auto=0 commit -q -m "seed tree"
	git -C "$seedtree" gc -q
	mkdir -p "$seedroot"
	if [ "$SKIP_SBX" != 1 ]; then
		start_agent "$seedroot" agent-seed
		start_proxy "$agent_port"
		seedurl=http://127.0.0.1:$proxy_port
	fi
fi

# -- cold-start scripts, run before every cold measurement ----------------------------
cat >"$work/cold-native.sh" <<EOF
sync; echo 3 >/proc/sys/vm/drop_caches
EOF
cold_sbx_script "$work/cold-sbx.sh" bench "$sbxmnt"
cat >"$work/cold-sshfs.sh" <<EOF
set -e
fusermount3 -u "$sshfsmnt"
sync; echo 3 >/proc/sys/vm/drop_caches
sshfs -F "$work/sshd/ssh_config" -o reconnect,ServerAliveInterval=15 \
	"bench:$tree" "$sshfsmnt"
EOF

note "tree: $nfiles files, $ndirs directories; one-way delay ${DELAY_MS} ms"
note "measuring (RUNS=$RUNS, COLD_RUNS=$COLD_RUNS) ..."

export work tree sbxmnt sshfsmnt RUNS COLD_RUNS SAVES EXEC_RUNS DELAY_MS \
	SHIM SKIP_SBX SKIP_SSHFS nfiles ndirs SKIP_FS SKIP_REPO seedtree \
	seedroot seedurl SBX SKIP_BIG SMALL_FILES UNTAR_FILES CHECKOUT_FILES \
	WRITE_MB
"$PY" - <<'PY'
import os, statistics, subprocess, sys, time

E = os.environ
work, tree = E["work"], E["tree"]
RUNS, COLD, SAVES = int(E["RUNS"]), int(E["COLD_RUNS"]), int(E["SAVES"])
EXEC_RUNS, DELAY = int(E["EXEC_RUNS"]), float(E["DELAY_MS"])
SMALL, UNTAR = int(E["SMALL_FILES"]), int(E["UNTAR_FILES"])
CHECKOUT, WRITE_MB = int(E["CHECKOUT_FILES"]), int(E["WRITE_MB"])
RTT = 2 * DELAY / 1000
views = {"native": tree}
if E["SKIP_SBX"] != "1":
    views["sbx"] = E["sbxmnt"]
if E["SKIP_SSHFS"] != "1":
    views["sshfs"] = E["sshfsmnt"]
ssh_cfg = os.path.join(work, "sshd", "ssh_config")
ctl = os.path.join(work, "ssh-ctl")


def sh(cmd, check=False):
    return subprocess.run(["bash", "-c", cmd], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, check=check)


def cold(view):
    r = sh(f"bash {work}/cold-{view}.sh")
    if r.returncode:
        sys.exit(f"cold start of {view} failed: {r.stderr.decode()}")


def timed(cmd, cwd=None):
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    el = time.perf_counter() - t
    # grep -r for an absent string exits 1; anything else is worth a word
    if r.returncode and not (cmd[0] == "grep" and r.returncode == 1):
        print(f"  warning: {' '.join(cmd)[:80]} exited {r.returncode}: "
              f"{r.stderr.decode(errors='replace')[-200:]}", file=sys.stderr)
    return el


res = {}   # row -> view -> seconds
extra = {}


def record(row, view, ts):
    """The median of the runs `ts` is the row's figure for `view`."""
    med = statistics.median(ts)
    res.setdefault(row, {})[view] = med
    print(f"  {row:18} {view:7} {med:8.3f} s   (runs: "
          f"{', '.join(f'{t:.3f}' for t in ts)})", file=sys.stderr,
          flush=True)


def measure(row, view, cmd, is_cold, runs=None, cwd=None):
    n = runs or (COLD if is_cold else RUNS)
    ts = []
    if not is_cold:
        timed(cmd, cwd)                      # warm-up
    for _ in range(n):
        if is_cold:
            cold(view)
        ts.append(timed(cmd, cwd))
    record(row, view, ts)


if E["SKIP_FS"] != "1":
    absent = "ZZ_sbx_bench_string_that_is_nowhere_ZZ"
    for view, d in views.items():
        measure("grep -r cold", view, ["grep", "-r", absent, f"{d}/linux"], True)
        measure("grep -r warm", view, ["grep", "-r", absent, f"{d}/linux"], False)
    for view, d in views.items():
        measure("ls -lR cold", view, ["ls", "-lR", f"{d}/linux"], True)
        measure("ls -lR warm", view, ["ls", "-lR", f"{d}/linux"], False)
    for view, d in views.items():
        git = ["git", "-c", f"safe.directory={d}", "-C", d, "status",
               "--porcelain"]
        measure("git status cold", view, git, True)
        measure("git status warm", view, git, False)
    if E["SKIP_BIG"] != "1":
        for view, d in views.items():
            measure("seq read 256MiB", view,
                    ["dd", f"if={d}/blob/big.bin", "of=/dev/null", "bs=1M"],
                    True)

    # editor-style save: temp + fsync + rename over an existing file
    target_rel = "linux/kernel.h"
    orig = open(os.path.join(tree, target_rel), "rb").read()
    for view, d in views.items():
        target = os.path.join(d, target_rel)
        tmp = os.path.join(os.path.dirname(target), ".kernel.h.sbx-bench.tmp")
        ts = []
        for i in range(SAVES + 1):
            data = orig + f"/* save {i} */\n".encode() if i < SAVES else orig
            t = time.perf_counter()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, data)
            os.fsync(fd)
            os.close(fd)
            os.replace(tmp, target)
            ts.append(time.perf_counter() - t)
        assert open(target, "rb").read() == orig
        med = statistics.median(ts[:SAVES])
        res.setdefault("editor save", {})[view] = med
        print(f"  {'editor save':18} {view:7} {med:8.3f} s", file=sys.stderr)

    # exec of true
    def exec_med(cmd, cwd=None):
        timed(cmd, cwd)
        return statistics.median(timed(cmd, cwd) for _ in range(EXEC_RUNS))

    res["exec true"] = {"native": exec_med(["true"])}
    if "sbx" in views:
        res["exec true"]["sbx"] = exec_med([E["SHIM"], "true"], cwd=views["sbx"])
    if "sshfs" in views:
        res["exec true"]["sshfs"] = exec_med(["ssh", "-F", ssh_cfg, "bench",
                                              "true"])
        res["exec true (ssh mux)"] = {
            "sshfs": exec_med(["ssh", "-F", ssh_cfg, "-o",
                               f"ControlPath={ctl}", "bench", "true"]),
            "native": res["exec true"]["native"]}
        if "sbx" in views:
            res["exec true (ssh mux)"]["sbx"] = res["exec true"]["sbx"]
    if "sbx" in views:
        res["sbx exec true"] = {
            "sbx": exec_med([E["SBX"], "exec", "bench", "--", "true"]),
            "native": res["exec true"]["native"]}
        if "sshfs" in res.get("exec true (ssh mux)", {}):
            res["sbx exec true"]["sshfs"] = \
                res["exec true (ssh mux)"]["sshfs"]
    for k in ("exec true", "exec true (ssh mux)", "sbx exec true"):
        for v, t in res.get(k, {}).items():
            print(f"  {k:18} {v:7} {t:8.4f} s", file=sys.stderr)

    # the startup of a git-using tool (opencode's), after a cold start
    def tool_startup(d):
        g = ["git", "-c", f"safe.directory={d}", "-C", d]
        return ["bash", "-c", " && ".join(
            " ".join(g + a) + " >/dev/null" for a in
            (["status", "--porcelain"], ["rev-parse", "--show-toplevel"],
             ["log", "-1", "--format=%H"]))]

    for view, d in views.items():
        measure("tool startup cold", view, tool_startup(d), True)

    # small files: create + write 100 B + close, then unlink, N each
    def timed_fn(fn):
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    for view, d in views.items():
        cts, uts = [], []
        for i in range(RUNS):
            sd = os.path.join(d, f"bench-small-{i}")
            os.mkdir(sd)
            names = [os.path.join(sd, f"f{k:04d}.txt")
                     for k in range(SMALL)]

            def create():
                for p in names:
                    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                 0o644)
                    os.write(fd, b"x" * 100)
                    os.close(fd)

            cts.append(timed_fn(create))
            uts.append(timed_fn(lambda: [os.unlink(p) for p in names]))
            os.rmdir(sd)
        record(f"create {SMALL} files", view, cts)
        record(f"unlink {SMALL} files", view, uts)

if E["SKIP_FS"] != "1" and E["SKIP_BIG"] != "1":
    # untar of UNTAR_FILES files from /usr/include (made here, natively)
    tarball = os.path.join(work, "untar.tar")
    members = []
    for dp, dns, fns in os.walk("/usr/include"):
        dns.sort()
        for f in sorted(fns):
            p = os.path.join(dp, f)
            if os.path.isfile(p) and not os.path.islink(p):
                members.append(os.path.relpath(p, "/usr/include"))
        if len(members) >= UNTAR:
            break
    members = members[:UNTAR]
    lst = os.path.join(work, "untar.list")
    open(lst, "w").write("\n".join(members) + "\n")
    subprocess.run(["tar", "-C", "/usr/include", "-cf", tarball, "-T", lst],
                   check=True)
    for view, d in views.items():
        ts = []
        for i in range(COLD):
            dest = os.path.join(d, f"bench-untar-{i}")
            os.mkdir(dest)
            ts.append(timed(["tar", "-C", dest, "-xf", tarball]))
        record(f"untar {UNTAR} files", view, ts)
        sh(f"rm -rf {tree}/bench-untar-*")   # natively: not measured

    # sequential write of WRITE_MB, fsync'd, then removed natively
    row = f"seq write {WRITE_MB}MiB"
    for view, d in views.items():
        ts = []
        for _ in range(RUNS):
            ts.append(timed(["dd", "if=/dev/zero", f"of={d}/blob/w.bin",
                             "bs=1M", f"count={WRITE_MB}", "conv=fsync"]))
            sh(f"rm -f {tree}/blob/w.bin")
        record(row, view, ts)

    # git checkout of a branch touching CHECKOUT_FILES files: the files
    # (co/) and the branch are made natively now, after every other row
    # that walks the tree, so that those keep their tree
    co = os.path.join(tree, "co")
    os.mkdir(co)
    for k in range(CHECKOUT):
        with open(os.path.join(co, f"f{k:05d}.txt"), "w") as f:
            f.write(f"file {k}\n" * 20)
    gn = ["git", "-C", tree, "-c", "user.name=bench", "-c",
          "user.email=bench@sbx.invalid"]
    subprocess.run(gn + ["add", "co"], check=True)
    subprocess.run(gn + ["commit", "-qm", "co"], check=True)
    subprocess.run(gn + ["checkout", "-qb", "other"], check=True)
    for k in range(CHECKOUT):
        with open(os.path.join(co, f"f{k:05d}.txt"), "a") as f:
            f.write("changed on other\n")
    subprocess.run(gn + ["commit", "-qam", "other"], check=True)
    subprocess.run(gn + ["checkout", "-q", "main"], check=True)
    for view, d in views.items():
        g = ["git", "-c", f"safe.directory={d}", "-C", d]
        subprocess.run(g + ["status", "--porcelain"],
                       stdout=subprocess.DEVNULL)   # the index, once
        ts = []
        for _ in range(RUNS):
            ts.append(timed(g + ["checkout", "-q", "other"]))
            # back natively (not measured), then let the view catch up
            subprocess.run(gn + ["checkout", "-q", "main"], check=True)
            subprocess.run(g + ["status", "--porcelain"],
                           stdout=subprocess.DEVNULL)
        record(f"git checkout {CHECKOUT}", view, ts)
    subprocess.run(["git", "-C", tree, "checkout", "-qf", "main"])


# -- the repository in and out --------------------------------------------
def seeded_seconds(err):
    for line in err.splitlines():
        if "seeded session" in line and " in " in line:
            return float(line.rsplit(" in ", 1)[1].split()[0])
    return None


def git_commit(repo, i):
    p = os.path.join(repo, "d000", "f00000.c")
    with open(p, "ab") as f:
        f.write(f"/* change {i} */\n".encode())
    subprocess.run(["git", "-C", repo, "-c", "user.name=b", "-c",
                    "user.email=b@sbx.invalid", "commit", "-qam",
                    f"change {i}"], check=True)


if E["SKIP_REPO"] != "1":
    seedtree, seedroot = E["seedtree"], E["seedroot"]
    sbx_cmd = E["SBX"]
    tok = os.path.join(work, "agent.token")
    if E["seedurl"]:
        ts, seeds, pulls = [], [], []
        for i in range(COLD):
            sh(f"rm -rf {seedroot}/* {seedroot}/.git")
            t = time.perf_counter()
            r = subprocess.run([sbx_cmd, "up", f"seed{i}", "--provider",
                                "remote", "--url", E["seedurl"],
                                "--token-file", tok, "--repo", seedtree],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
            ts.append(time.perf_counter() - t)
            if r.returncode:
                sys.exit(f"sbx up --repo failed: {r.stderr}")
            seeds.append(seeded_seconds(r.stderr))
            for k in range(RUNS if i == 0 else 0):
                git_commit(seedroot, k)
                t = time.perf_counter()
                subprocess.run([sbx_cmd, "pull", f"seed{i}"], check=True,
                               stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                pulls.append(time.perf_counter() - t)
            sh(f"{sbx_cmd} down seed{i} --force")
        res.setdefault("seed repo", {})["sbx"] = statistics.median(ts)
        extra["seed only"] = statistics.median(seeds)
        res.setdefault("pull 1 commit", {})["sbx"] = statistics.median(pulls)
        print(f"  seed repo (sbx up) runs: {', '.join(f'{t:.3f}' for t in ts)}"
              f"; the seed alone: {', '.join(f'{t:.2f}' for t in seeds)}",
              file=sys.stderr)
        print(f"  pull 1 commit (sbx) runs: "
              f"{', '.join(f'{t:.3f}' for t in pulls)}", file=sys.stderr)
    if E["SKIP_SSHFS"] != "1":
        dest = os.path.join(work, "clone")
        genv = dict(os.environ, GIT_SSH_COMMAND=f"ssh -F {ssh_cfg}")
        ts, fetches = [], []
        for i in range(COLD):
            sh(f"rm -rf {dest}")
            t = time.perf_counter()
            subprocess.run(["git", "clone", "-q", f"ssh://bench{seedtree}",
                            dest], env=genv, check=True)
            ts.append(time.perf_counter() - t)
        for k in range(RUNS):
            git_commit(seedtree, k)
            t = time.perf_counter()
            subprocess.run(["git", "-C", dest, "fetch", "-q", "origin"],
                           env=genv, check=True)
            fetches.append(time.perf_counter() - t)
        res.setdefault("seed repo", {})["sshfs"] = statistics.median(ts)
        res.setdefault("pull 1 commit", {})["sshfs"] = \
            statistics.median(fetches)
        print(f"  seed repo (git clone over ssh) runs: "
              f"{', '.join(f'{t:.3f}' for t in ts)}", file=sys.stderr)
        print(f"  pull 1 commit (git fetch over ssh) runs: "
              f"{', '.join(f'{t:.3f}' for t in fetches)}", file=sys.stderr)

# -- the table ------------------------------------------------------------
goals = {
    "grep -r cold": ("<= 2 s", lambda r: r["sbx"] <= 2.0),
    "grep -r warm": ("<= 2x native", lambda r: r["sbx"] <= 2 * r["native"]),
    "ls -lR cold": ("<= 1 s", lambda r: r["sbx"] <= 1.0),
    "exec true": (f"<= 2 RTT + 10 ms = {(2 * RTT + 0.010) * 1000:.0f} ms",
                  lambda r: r["sbx"] <= 2 * RTT + 0.010),
    "seq read 256MiB": (">= 100 MB/s",
                        lambda r: r["sbx"] <= 256 * 1048576 / 100e6),
    # issue 15
    "sbx exec true": (f"<= 2 RTT + 10 ms = {(2 * RTT + 0.010) * 1000:.0f} ms",
                      lambda r: r["sbx"] <= 2 * RTT + 0.010),
    "editor save": ("<= 3 RTT", lambda r: r["sbx"] <= 3 * RTT + 0.005),
    f"create {SMALL} files": (f"<= 1 RTT each",
                              lambda r: r["sbx"] <= SMALL * (RTT + 0.005)),
    f"unlink {SMALL} files": (f"<= 1 RTT each",
                              lambda r: r["sbx"] <= SMALL * (RTT + 0.005)),
    f"seq write {WRITE_MB}MiB": (">= 100 MB/s",
                                 lambda r: r["sbx"] <= WRITE_MB * 1048576
                                 / 100e6),
}
for key, row in (("UNTAR_BASE", f"untar {UNTAR} files"),
                 ("CHECKOUT_BASE", f"git checkout {CHECKOUT}")):
    if E.get(key):
        base = float(E[key])
        goals[row] = (f"<= {base:.1f}/5 s",
                      lambda r, b=base: r["sbx"] <= b / 5)


def fmt(t):
    if t is None:
        return "n/a"
    return f"{t:.4f}" if t < 0.1 else f"{t:.3f}"


def ratio(a, b):
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


rows = ["grep -r cold", "grep -r warm", "ls -lR cold", "ls -lR warm",
        "git status cold", "git status warm", "seq read 256MiB",
        "editor save", "exec true", "exec true (ssh mux)", "sbx exec true",
        "tool startup cold", f"create {SMALL} files", f"unlink {SMALL} files",
        f"untar {UNTAR} files", f"git checkout {CHECKOUT}",
        f"seq write {WRITE_MB}MiB", "seed repo", "pull 1 commit"]
print()
print(f"sbx remote vs sshfs at {2 * DELAY:.0f} ms RTT "
      f"({E['nfiles']} files, {E['ndirs']} dirs; seconds, median)")
hdr = (f"| {'row':19} | {'sbx':>8} | {'sshfs':>8} | {'native':>8} | "
       f"{'sbx/sshfs':>9} | {'sbx/native':>10} | goal")
print(hdr)
print("|" + "|".join("-" * (len(c) + 0) for c in hdr.split("|")[1:]))
misses = []
for row in rows:
    r = res.get(row)
    if not r:
        continue
    s, f, n = r.get("sbx"), r.get("sshfs"), r.get("native")
    goal = ""
    if row in goals and s is not None:
        text, ok = goals[row]
        try:
            met = ok(r)
        except (KeyError, TypeError):
            met = None
        goal = f"{text}: {'met' if met else 'MISSED' if met is False else '?'}"
        if met is False:
            misses.append(f"{row} ({text})")
    if s is not None and f is not None and row not in (
            "exec true (ssh mux)", "sbx exec true"):
        faster = s < f
        goal += ("; " if goal else "") + ("faster than sshfs" if faster
                                          else "NOT faster than sshfs")
        if not faster:
            misses.append(f"{row} (faster than sshfs)")
    print(f"| {row:19} | {fmt(s):>8} | {fmt(f):>8} | {fmt(n):>8} | "
          f"{ratio(s, f):>9} | {ratio(s, n):>10} | {goal}")
mb = 256 * 1048576 / 1e6
sr = res.get("seq read 256MiB", {})
if sr:
    print("\nseq read MB/s: " + ", ".join(
        f"{v} {mb / t:.0f}" for v, t in sr.items()))
sw = res.get(f"seq write {WRITE_MB}MiB", {})
if sw:
    print("seq write MB/s (fsync'd): " + ", ".join(
        f"{v} {WRITE_MB * 1048576 / 1e6 / t:.0f}" for v, t in sw.items()))
for row in (f"create {SMALL} files", f"unlink {SMALL} files",
            f"untar {UNTAR} files", f"git checkout {CHECKOUT}"):
    r = res.get(row, {})
    n = SMALL if "files" in row and "untar" not in row else \
        (UNTAR if "untar" in row else CHECKOUT)
    if "sbx" in r:
        print(f"{row}: sbx {r['sbx'] / n * 1000:.1f} ms per file "
              f"({r['sbx'] / n / RTT:.1f} RTT)"
              + (f", sshfs {r['sshfs'] / n * 1000:.1f} ms" if "sshfs" in r
                 else ""))
if "seed only" in extra:
    print(f"seed repo: the seed alone (pack, stream, index) took "
          f"{extra['seed only']:.2f} s of sbx up; its ssh column is git "
          f"clone, and pull's is git fetch, over the same proxied sshd")
print("exec true (ssh) opens a new ssh connection per command; "
      "(ssh mux) reuses a ControlMaster connection; sbx exec true's sshfs "
      "column is ssh mux.")
print("sshfs options: reconnect,ServerAliveInterval=15, default caches "
      "(dir_cache=yes, dcache_timeout=20, entry/attr_timeout=1, no "
      "kernel_cache).")
if misses:
    print("goals missed: " + "; ".join(misses))
elif "sbx" in views:
    print("all goals met")
PY

# -- scale: generated trees, cold grep -r and the daemon's peak RSS ---------------
if [ "$SKIP_SCALE" != 1 ] && [ "$SKIP_FS" != 1 ]; then
	: >"$work/scale.tsv"
	ms_of() { # run "$@" quietly; print its wall time in seconds
		local t0 t1
		t0=$(date +%s%N)
		"$@" >/dev/null 2>&1 || true
		t1=$(date +%s%N)
		awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", (b - a) / 1e9 }'
	}
	dropcaches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
	absent=ZZ_sbx_bench_string_that_is_nowhere_ZZ
	for n in $SCALE_SIZES; do
		sdir=$work/scale-$n
		note "scale: generating $n files (~$SCALE_KB KiB each) in $sdir ..."
		"$PY" "$top/bench/gentree.py" scale "$sdir" "$n" "$SCALE_KB"
		mb=$(du -sm "$sdir" | cut -f1)
		t_native=$(dropcaches; ms_of grep -r "$absent" "$sdir")
		t_sbx=n/a hwm=n/a t_sshfs=n/a
		if [ "$SKIP_SBX" != 1 ]; then
			start_agent "$sdir" agent-scale
			start_proxy "$agent_port"
			smnt=$(bench_up_remote "scale$n" "$proxy_port") ||
				die "sbx up scale$n failed"
			cold_sbx_script "$work/cold-scale.sh" "scale$n" "$smnt"
			bash "$work/cold-scale.sh" ||
				die "cold mount of scale$n failed"
			t_sbx=$(ms_of grep -r "$absent" "$smnt")
			dpid=$("$SBX" status "scale$n" --json |
				"$PY" -c 'import json,sys; print(json.load(sys.stdin).get("pid", 0))')
			hwm=$(awk '/^VmHWM/ { printf "%.0f", $2 / 1024 }' \
				"/proc/$dpid/status" 2>/dev/null || echo n/a)
			"$SBX" down "scale$n" --force >/dev/null 2>&1 || true
			kill "$agent_pid" "$proxy_pid" 2>/dev/null || true
		fi
		if [ "$SKIP_SSHFS" != 1 ] && [ "$n" -le "$SCALE_SSHFS_MAX" ]; then
			smnt=$work/sshfs-scale
			mkdir -p "$smnt"
			sshfs -F "$work/sshd/ssh_config" \
				-o reconnect,ServerAliveInterval=15 \
				"bench:$sdir" "$smnt"
			dropcaches
			t_sshfs=$(ms_of grep -r "$absent" "$smnt")
			fusermount3 -u "$smnt"
		fi
		note "scale $n files ($mb MB): sbx $t_sbx s (daemon VmHWM" \
			"$hwm MB), sshfs $t_sshfs s, native $t_native s"
		echo "$n $mb $t_sbx $t_sshfs $t_native $hwm" >>"$work/scale.tsv"
		rm -rf "$sdir"
	done
	"$PY" - "$work/scale.tsv" "$DELAY_MS" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
rtt = 2 * float(sys.argv[2])
print(f"\nscale: cold grep -r of generated trees at {rtt:.0f} ms RTT "
      "(seconds, one run each; VmHWM = the sbx daemon's peak RSS)")
print("| files | MB | sbx | sshfs | native | sbx/sshfs | sbx/native | "
      "VmHWM MB | goal")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---")
num = lambda x: float(x) if x not in ("n/a", "") else None
for n, mb, s, f, nat, hwm in rows:
    s, f, nat, h = num(s), num(f), num(nat), num(hwm)
    goal = ""
    if int(n) >= 80000 and s is not None:
        ok = s <= 10 and h is not None and h < 300
        goal = f"<= 10 s, < 300 MB: {'met' if ok else 'MISSED'}"
    r = lambda a, b: f"{a / b:.2f}x" if a is not None and b else "n/a"
    print(f"| {n} | {mb} | {s if s is not None else 'n/a'} | "
          f"{f if f is not None else 'n/a'} | {nat} | {r(s, f)} | "
          f"{r(s, nat)} | {hwm} | {goal}")
if len(rows) > 1 and all(num(r[2]) for r in rows):
    a, b = rows[0], rows[-1]
    k = int(b[0]) / int(a[0])
    print(f"growth {a[0]} -> {b[0]} files ({k:.0f}x): sbx time "
          f"{float(b[2]) / float(a[2]):.1f}x, VmHWM "
          f"{num(b[5]) / num(a[5]):.1f}x" if num(a[5]) and num(b[5]) else "")
PY
fi
