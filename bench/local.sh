#!/usr/bin/env bash
# Benchmark the local sbx mount against native and bindfs, in one run.
#
#   sudo bench/local.sh            (from the repository root, after building)
#
# The tree is a copy of /usr/include committed to a fresh git repository.
# Three views of the same directory are measured:
#   native  the session's worktree itself ($SBX_HOME/worktrees/bench)
#   bindfs  a bindfs mount of that worktree
#   sbx     the sbx mount of the session (sbx up bench)
# Rows:
#   grep -r cold     grep -r for an absent string, page cache dropped first
#   grep -r warm     the same, caches warm
#   find -newer      find DIR -newer REF over the tree (a stat storm), warm
#   git status       git status --porcelain, warm
#   seq write 1 GiB  dd if=/dev/zero bs=1M count=1024 conv=fsync
#   seq read cold    dd of a 1 GiB file, page cache dropped first
#   seq read warm    dd of the same file read just before
#   10k files        create 10000 small files, then delete them (bash loop)
# Times are medians (hyperfine when installed, else RUNS repetitions).
# Ratios are time / native time: lower is better, 1.00x is native speed.
#
# Environment: SBX (default build/cli/sbx), RUNS (default 5), SEQ_RUNS
# (runs of the 1 GiB rows, default 3), WORKDIR
# (default /var/tmp), KEEP=1 keeps the temporary tree, SRC (default
# /usr/include).  Needs root: dropping caches and bindfs.
set -euo pipefail

BENCH=local.sh
. "$(dirname "$0")/common.sh"
SBX=${SBX:-$top/build/cli/sbx}
RUNS=${RUNS:-5}
SEQ_RUNS=${SEQ_RUNS:-3}
SRC=${SRC:-/usr/include}

[ "$(id -u)" -eq 0 ] || die "run as root (dropping caches, bindfs mounts)"
[ -x "$SBX" ] || die "$SBX not found: build first (meson setup build && ninja -C build)"
command -v bindfs >/dev/null || die "bindfs missing: apt install bindfs"
command -v git >/dev/null || die "git missing: apt install git"

bench_workdir sbx-bench
echo "{\"provider\": \"local\"}" >"$SBX_CONFIG"
repo=$work/repo
bindmnt=$work/bindfs
wt=$SBX_HOME/worktrees/bench
sbxmnt=""

can_drop=1
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
drop_caches 2>/dev/null || can_drop=0

echo "preparing: copying $SRC to a git repository in $work ..." >&2
mkdir -p "$repo"
cp -a "$SRC" "$repo/include"
nfiles=$(find "$repo/include" -type f | wc -l)
size=$(du -sh "$repo/include" | cut -f1)
git -C "$repo" init -q -b main
git -C "$repo" add -A
git -C "$repo" -c user.name=bench -c user.email=bench@sbx.invalid \
	commit -q -m "bench tree"

sbxmnt=$("$SBX" up bench --repo "$repo")
mkdir -p "$bindmnt"
bindfs "$wt" "$bindmnt"
for d in "$wt" "$bindmnt" "$sbxmnt"; do
	[ -f "$d/include/stdio.h" ] || die "$d does not show the tree"
done
touch -d '1 hour ago' "$wt/include"
touch "$wt/ref-newer"
# the 1 GiB file for the read rows
dd if=/dev/urandom of="$wt/big.read" bs=1M count=1024 status=none
sync

results=$work/results.tsv
: >"$results"

median() { sort -n | awk '{a[NR]=$1} END {m=int((NR+1)/2); if (NR%2) print a[m]; else print (a[m]+a[m+1])/2}'; }

# measure ROW VIEW PREPARE CMD: median seconds of CMD, PREPARE before each.
# $runs (default RUNS) and $warmup (default 1) may be set for one call.
measure() {
	local row=$1 view=$2 prep=$3 cmd=$4 t
	local n=${runs:-$RUNS} w=${warmup:-1}
	if command -v hyperfine >/dev/null; then
		local js=$work/h.json
		hyperfine --style none -S bash -i --warmup "$w" --runs "$n" \
			${prep:+--prepare "$prep"} --export-json "$js" "$cmd" \
			>/dev/null 2>&1 || die "hyperfine failed on: $cmd"
		t=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["results"][0]["median"])' "$js")
	else
		[ "$w" -gt 0 ] && { bash -c "$cmd" >/dev/null 2>&1 || true; }
		t=$(for _ in $(seq "$n"); do
			[ -n "$prep" ] && bash -c "$prep"
			s=$(date +%s.%N)
			bash -c "$cmd" >/dev/null 2>&1 || true
			e=$(date +%s.%N)
			echo "$e - $s" | bc -l
		done | median)
	fi
	printf '%s\t%s\t%s\n' "$row" "$view" "$t" >>"$results"
	printf '  %-16s %-7s %8.3f s\n' "$row" "$view" "$t" >&2
}

drop='sync; echo 3 > /proc/sys/vm/drop_caches'
echo "measuring ($RUNS runs each) ..." >&2
for v in native bindfs sbx; do
	case $v in
	native) d=$wt ;;
	bindfs) d=$bindmnt ;;
	sbx) d=$sbxmnt ;;
	esac
	if [ "$can_drop" = 1 ]; then
		measure "grep -r cold" $v "$drop" "grep -r zqxjv_sbx_absent '$d/include'"
	fi
	measure "grep -r warm" $v "" "grep -r zqxjv_sbx_absent '$d/include'"
	measure "find -newer" $v "" "find '$d/include' -newer '$d/ref-newer' | wc -l"
	measure "git status" $v "" "git -C '$d' status --porcelain | wc -l"
	runs=$SEQ_RUNS warmup=0 measure "seq write 1GiB" $v "rm -f '$d/big.write'; sync" \
		"dd if=/dev/zero of='$d/big.write' bs=1M count=1024 conv=fsync status=none"
	rm -f "$d/big.write"
	if [ "$can_drop" = 1 ]; then
		runs=$SEQ_RUNS measure "seq read cold" $v "$drop" "dd if='$d/big.read' of=/dev/null bs=1M status=none"
	fi
	runs=$SEQ_RUNS measure "seq read warm" $v "cat '$d/big.read' >/dev/null" \
		"dd if='$d/big.read' of=/dev/null bs=1M status=none"
	measure "10k files" $v "rm -rf '$d/many'" \
		"mkdir '$d/many' && for i in \$(seq 10000); do echo x > '$d/many/f'\$i; done && rm -rf '$d/many'"
done

model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
echo
echo "sbx local benchmark, $(date -u +%Y-%m-%d), $(nproc) cores ($model), kernel $(uname -r)"
echo "tree: copy of $SRC, $nfiles files, $size; median of $RUNS runs; ratio = time / native"
[ "$can_drop" = 1 ] || echo "(cold rows skipped: cannot write /proc/sys/vm/drop_caches)"
python3 - "$results" <<'EOF'
import sys
rows, t = [], {}
for line in open(sys.argv[1]):
    row, view, sec = line.rstrip("\n").split("\t")
    if row not in rows:
        rows.append(row)
    t[row, view] = float(sec)
goals = {"grep -r warm": 1.3, "git status": 1.5, "seq read cold": 1.25}
print()
print("| operation | native s | bindfs s | sbx s | bindfs/native | sbx/native | sbx faster than bindfs | goal |")
print("|---|---:|---:|---:|---:|---:|:---:|---|")
bad = []
for r in rows:
    n, b, s = t[r, "native"], t[r, "bindfs"], t[r, "sbx"]
    g = goals.get(r)
    goal = ""
    if g:
        ok = s / n <= g
        goal = f"<= {g}x: {'met' if ok else 'MISSED'}"
        if not ok:
            bad.append(r)
    faster = "yes" if s < b else "NO"
    if s >= b:
        bad.append(r + " (vs bindfs)")
    extra = ""
    if r.startswith("seq "):
        extra = f" ({1024 / s:.0f} MiB/s)"
    print(f"| {r} | {n:.3f} | {b:.3f} | {s:.3f}{extra} | {b / n:.2f}x | {s / n:.2f}x | {faster} | {goal} |")
print()
print("seq read goal: throughput >= 0.8x native, i.e. time <= 1.25x")
print("goals missed: " + (", ".join(bad) if bad else "none"))
EOF
