#!/usr/bin/env bash
# bench/exec.sh: cost of the exec shim on this machine.
#
#   latency     median wall time of `true` through sbx-exec (cwd in the
#               mount) vs plain fork/exec of /bin/true, N runs each
#   throughput  `cat` of a 1 GiB file to /dev/null through the shim (default
#               transport: descriptor passing; and forced framing, the path a
#               remote sandbox uses) vs cat of the same file in the worktree
#
# Usage: bench/exec.sh [BUILD_DIR]   (default: build).  Env: RUNS=200,
# SIZE_MB=1024.  Creates a throw-away repository, session and mount under a
# temporary SBX_HOME and removes them at the end.  Needs /dev/fuse.
# Goals (issue 3): overhead <= 5 ms per command, throughput >= 0.5x local.
set -euo pipefail

BENCH=exec.sh
. "$(dirname "$0")/common.sh"
bench_build "${1:-}" SBX SHIM
runs=${RUNS:-200}
size_mb=${SIZE_MB:-1024}

bench_workdir sbx-bench-exec /tmp
sbxmnt=""
git init -q -b main "$work/repo"
echo bench > "$work/repo/README"
git -C "$work/repo" add -A
git -C "$work/repo" -c user.name=b -c user.email=b@b commit -qm init
sbxmnt=$("$SBX" up bench --repo "$work/repo" | tail -n1)
wt=$SBX_HOME/worktrees/bench

# Median of $runs timings (ms) of "$@", measured by python around each
# fork/exec so the loop's own cost is the same for both sides.
median_ms() {
	/usr/bin/python3 - "$runs" "$@" <<'PY'
import os, subprocess, sys, time
runs = int(sys.argv[1]); cmd = sys.argv[2:]
t = []
for _ in range(runs):
    s = time.perf_counter()
    subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   check=True)
    t.append((time.perf_counter() - s) * 1000)
t.sort()
print(f"{t[len(t) // 2]:.3f}")
PY
}

secs() { # wall seconds of "$@" with stdout to /dev/null
	local s e
	s=$(date +%s%N)
	"$@" >/dev/null
	e=$(date +%s%N)
	echo "scale=3; ($e - $s) / 1000000000" | bc
}

cd "$sbxmnt"
lat_local=$(median_ms /bin/true)
lat_shim=$(median_ms "$SHIM" true)

head -c $((size_mb * 1024 * 1024)) /dev/zero > "$wt/big"
cat "$wt/big" > /dev/null # warm the page cache
t_local=$(secs cat "$wt/big")
t_shim=$(secs "$SHIM" cat big)
t_framed=$(SBX_EXEC_FRAMED=1 secs "$SHIM" cat big)

mbps() { echo "scale=0; $size_mb / $1" | bc; }
ratio() { echo "scale=2; $1 / $2" | bc; }

printf '\nsbx exec shim benchmark  (%s, %s, %d runs, %d MiB)\n\n' \
	"$(date -u +%Y-%m-%d)" "$(uname -srm)" "$runs" "$size_mb"
printf '%-34s %12s %12s %10s\n' "measure" "local" "shim" "ratio"
printf '%-34s %10s ms %10s ms %10s\n' "latency of true (median)" \
	"$lat_local" "$lat_shim" \
	"+$(echo "scale=2; $lat_shim - $lat_local" | bc) ms"
printf '%-34s %8s MB/s %8s MB/s %9sx\n' "cat 1 GiB > /dev/null (fds)" \
	"$(mbps "$t_local")" "$(mbps "$t_shim")" "$(ratio "$t_local" "$t_shim")"
printf '%-34s %8s MB/s %8s MB/s %9sx\n' "cat 1 GiB > /dev/null (framed)" \
	"$(mbps "$t_local")" "$(mbps "$t_framed")" \
	"$(ratio "$t_local" "$t_framed")"
echo
