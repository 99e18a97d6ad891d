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

here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$here/build}" && pwd)
sbx=$build/cli/sbx
shim=$build/shim/sbx-exec
runs=${RUNS:-200}
size_mb=${SIZE_MB:-1024}
[[ -x $sbx && -x $shim ]] || { echo "build first: ninja -C $build" >&2; exit 2; }

tmp=$(mktemp -d /tmp/sbx-bench-exec.XXXXXX)
export SBX_HOME=$tmp/state SBX_MOUNT_ROOT=$tmp/mnt HOME=$tmp/home
export SBX_CONFIG=$tmp/config.json
echo '{}' > "$SBX_CONFIG"
mkdir -p "$HOME"
cleanup() {
	"$sbx" down bench --force >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT

git init -q -b main "$tmp/repo"
echo bench > "$tmp/repo/README"
git -C "$tmp/repo" add -A
git -C "$tmp/repo" -c user.name=b -c user.email=b@b commit -qm init
mnt=$("$sbx" up bench --repo "$tmp/repo" | tail -n1)
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

cd "$mnt"
lat_local=$(median_ms /bin/true)
lat_shim=$(median_ms "$shim" true)

head -c $((size_mb * 1024 * 1024)) /dev/zero > "$wt/big"
cat "$wt/big" > /dev/null # warm the page cache
t_local=$(secs cat "$wt/big")
t_shim=$(secs "$shim" cat big)
t_framed=$(SBX_EXEC_FRAMED=1 secs "$shim" cat big)

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
