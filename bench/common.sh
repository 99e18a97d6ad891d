# The setup the benchmark scripts share; sourced, not run:
#
#   BENCH=remote.sh                   # names the script in messages
#   . "$(dirname "$0")/common.sh"
#
# What it gives (every function dies with a message on failure):
#   top                  the repository's top directory
#   PY                   /usr/bin/python3
#   die MSG, note MSG    "bench/$BENCH: MSG" on stderr (die exits 1)
#   bench_build DIR BIN...
#                        sets build (DIR made absolute; "" is
#                        $top/build), SBX, SHIM and AGENT (its binaries);
#                        dies unless each BIN named (SBX, SHIM, AGENT) is
#                        built
#   bench_workdir PREFIX [BASE]
#                        a fresh $work (mode 755) under $WORKDIR, else BASE,
#                        else /var/tmp, with SBX_HOME, SBX_MOUNT_ROOT,
#                        SBX_CONFIG ('{}') and HOME inside it (exported);
#                        installs the EXIT trap (bench_cleanup) and empties
#                        pids (the background processes to stop at exit)
#   bench_cleanup        (the EXIT trap) `sbx down bench` when $sbxmnt is
#                        set, bench_cleanup_more if the script defines it,
#                        unmounts whatever is mounted under $work, stops
#                        $pids, removes $work unless KEEP=1
#   free_port            prints a free TCP port of 127.0.0.1
#   wait_port FILE LOG   waits for a process that prints its port on the
#                        first line of FILE; sets $port (dies with LOG)
#   start_agent ROOT NAME
#                        sbx-agent serving ROOT on a free port with the
#                        token $work/agent.token (made on the first call),
#                        its output in $work/NAME.log; waits for
#                        /v1/health; sets agent_port and agent_pid
#   start_proxy PORT     the latency proxy (tests/integration/testenv/
#                        latency_proxy.py, DELAY_MS each way, default 10)
#                        in front of 127.0.0.1:PORT; sets proxy_port and
#                        proxy_pid
#   bench_up_remote NAME PORT
#                        `sbx up NAME --provider remote --no-repo` of
#                        http://127.0.0.1:PORT; prints the mountpoint
#   make_linux_tree TREE BIG_MB
#                        TREE: a copy of $SRC at linux/ in a fresh git repository
#                        (core.checkStat=minimal, core.trustctime=false),
#                        plus an ignored BIG_MB MiB file blob/big.bin
#                        (none when BIG_MB is 0)
#   cold_sbx_script FILE NAME MNT
#                        writes FILE, a script that restarts session NAME
#                        cold: umount, its cache removed, page cache
#                        dropped, mount, wait for MNT
# start_agent and start_proxy set variables instead of printing, so that
# they are not run in a $(...) subshell: the pid must be recorded in this
# shell for bench_cleanup to stop it.

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=/usr/bin/python3

die() { echo "bench/$BENCH: $*" >&2; exit 1; }
note() { echo "bench/$BENCH: $*" >&2; }

bench_build() {
	local dir=${1:-$top/build} b
	shift
	build=$(cd "$dir" 2>/dev/null && pwd) ||
		{ echo "bench/$BENCH: no build directory $dir" >&2; exit 2; }
	SBX=$build/cli/sbx
	SHIM=$build/shim/sbx-exec
	AGENT=$build/agent/sbx-agent
	for b in "$@"; do
		[ -x "${!b}" ] || die "${!b} not built: meson setup build && ninja -C build"
	done
}

bench_workdir() {
	work=$(mktemp -d "${WORKDIR:-${2:-/var/tmp}}/$1.XXXXXX")
	chmod 755 "$work"
	pids=()
	export SBX_HOME=$work/state SBX_MOUNT_ROOT=$work/mnt
	export SBX_CONFIG=$work/config.json HOME=$work/home
	mkdir -p "$HOME" "$SBX_MOUNT_ROOT"
	echo '{}' >"$SBX_CONFIG"
	trap bench_cleanup EXIT
	trap 'exit 130' INT TERM
}

bench_cleanup() {
	local p
	set +e
	[ -n "${sbxmnt:-}" ] && "$SBX" down bench --force >/dev/null 2>&1
	declare -F bench_cleanup_more >/dev/null && bench_cleanup_more
	grep -F " $work/" /proc/self/mountinfo | awk '{print $5}' |
		while read -r m; do fusermount3 -u -z "$m" 2>/dev/null ||
			umount -l "$m"; done
	if [ ${#pids[@]} -gt 0 ]; then
		for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
		sleep 0.2
		for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
	fi
	if [ "${KEEP:-0}" = 1 ]; then
		echo "kept $work" >&2
	else
		rm -rf "$work"
	fi
}

free_port() {
	"$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_port() {
	for _ in $(seq 100); do
		if [ -s "$1" ]; then
			port=$(head -n1 "$1")
			return
		fi
		sleep 0.05
	done
	die "$(basename "$1" .port) did not start: $(cat "$2")"
}

start_agent() {
	if [ ! -s "$work/agent.token" ]; then
		head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' \
			>"$work/agent.token"
		chmod 600 "$work/agent.token"
	fi
	agent_port=$(free_port)
	"$AGENT" serve --root "$1" --listen "127.0.0.1:$agent_port" \
		--token-file "$work/agent.token" >"$work/$2.log" 2>&1 &
	agent_pid=$!
	pids+=($!)
	for _ in $(seq 200); do
		curl -fsS "http://127.0.0.1:$agent_port/v1/health" \
			>/dev/null 2>&1 && return
		sleep 0.05
	done
	die "sbx-agent did not start: $(cat "$work/$2.log")"
}

start_proxy() {
	local out=$work/proxy.$1.port
	(cd "$top/tests/integration" && exec "$PY" -m testenv.latency_proxy \
		--listen 127.0.0.1:0 --target "127.0.0.1:$1" \
		--delay-ms "${DELAY_MS:-10}" >"$out" 2>"$work/proxy.$1.log") &
	proxy_pid=$!
	pids+=($!)
	wait_port "$out" "$work/proxy.$1.log"
	proxy_port=$port
}

bench_up_remote() {
	"$SBX" up "$1" --provider remote --no-repo \
		--url "http://127.0.0.1:$2" \
		--token-file "$work/agent.token" | tail -n1
}

make_linux_tree() {
	local tree=$1
	note "preparing: $SRC -> git repository in $tree ..."
	mkdir -p "$tree/blob"
	cp -a "$SRC" "$tree/linux"
	printf 'blob/\n' >"$tree/.gitignore"
	git -C "$tree" init -q -b main
	git -C "$tree" config core.checkStat minimal
	git -C "$tree" config core.trustctime false
	git -C "$tree" add -A
	git -C "$tree" -c user.name=bench -c user.email=bench@sbx.invalid \
		commit -q -m "bench tree"
	git -C "$tree" status --porcelain >/dev/null
	if [ "$2" -gt 0 ]; then
		dd if=/dev/urandom of="$tree/blob/big.bin" bs=1M count="$2" \
			status=none
	fi
	sync
}

cold_sbx_script() {
	cat >"$1" <<EOF
set -e
"$SBX" umount $2 >/dev/null
rm -rf "$SBX_HOME/cache/$2"
sync; echo 3 >/proc/sys/vm/drop_caches
"$SBX" mount $2 >/dev/null
for i in \$(seq 200); do mountpoint -q "$3" && break; sleep 0.05; done
mountpoint -q "$3"
EOF
}
