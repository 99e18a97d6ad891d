#!/usr/bin/env bash
# The real opencode agent running one scripted task on a plain directory,
# a local sbx mount and a remote sbx mount at 20 ms round trip.
#
#   sudo bench/opencode.sh [BUILD_DIR]     (after building; needs opencode:
#                                          npm install -g opencode-ai)
#
# The model is tests/fakes/fake_llm.py: the OpenAI chat-completions API
# answering a fixed script, one tool call per turn, instantly.  The task is
# what a coding agent does on a small C project: bash `make`, bash
# `./hello`, read hello.c, edit it, bash `make`, bash `git diff`, answer.
# With an instant model the times are opencode's own work plus the file
# system's, so the ratios are harsher than with a real model (whose turns
# take seconds).  The project is hello.c, a Makefile and a vendored copy of
# /usr/include/linux (~760 files, what opencode's start-up git runs and its
# snapshot of the work tree walk), committed to git.
#
# Each run starts opencode with a fresh data directory (no snapshot of the
# project yet, as for a new session) on a fresh copy of the project:
#   plain   the copy itself
#   local   `sbx up --provider local` of a repository made from the copy
#           (the mount shows the session's worktree)
#   remote  sbx-agent serving the copy behind the latency proxy
#           (DELAY_MS each way), `sbx up --provider remote --no-repo`, a
#           fresh daemon (cold cache)
# Each run checks the task's result (the edit is in `git diff`) and fails
# loudly otherwise.  Rows: wall time of `opencode run`, median of RUNS, and
# its ratio to plain.  One untimed run first installs opencode's own
# packages into the shared config directory.
#
# Environment: RUNS (3), DELAY_MS (10), OPENCODE (default: opencode on
# PATH), WORKDIR (/var/tmp), KEEP=1 keeps the work directory, REQLOG=FILE
# logs the remote runs' requests to the agent (bench/reqlog.py between the
# daemon and the latency proxy, one JSON line each, appended).
set -euo pipefail

BENCH=opencode.sh
. "$(dirname "$0")/common.sh"
bench_build "${1:-}" SBX AGENT
RUNS=${RUNS:-3}
OPENCODE=${OPENCODE:-$(command -v opencode || true)}
[ "$(id -u)" -eq 0 ] || die "run as root (FUSE mounts)"
[ -n "$OPENCODE" ] && [ -x "$OPENCODE" ] ||
	die "opencode not found: npm install -g opencode-ai (or OPENCODE=/path/to/opencode)"

bench_workdir sbx-bench-opencode
sessions=()
bench_cleanup_more() {
	for s in "${sessions[@]}"; do "$SBX" down "$s" --force >/dev/null 2>&1; done
}
export XDG_CONFIG_HOME=$work/xdg-config XDG_CACHE_HOME=$work/xdg-cache
mkdir -p "$XDG_CONFIG_HOME" "$XDG_CACHE_HOME"

# -- the project -----------------------------------------------------------------
proj=$work/project
mkdir -p "$proj"
cp -a /usr/include/linux "$proj/vendor"
cat >"$proj/hello.c" <<'EOF'
#include <stdio.h>
int main(void) { printf("Hello\n"); return 0; }
EOF
printf 'hello: hello.c\n\tcc -O2 -o hello hello.c\n' >"$proj/Makefile"
printf 'hello\n' >"$proj/.gitignore"
git -C "$proj" init -q -b main
git -C "$proj" add -A
git -C "$proj" -c user.name=bench -c user.email=bench@sbx.invalid commit -q -m project

# -- the model ---------------------------------------------------------------------
# script DIR: the task's steps for a project at DIR
script() {
	cat <<EOF
[{"tool": "bash", "args": {"command": "make", "description": "Build"}},
 {"tool": "bash", "args": {"command": "./hello", "description": "Run"}},
 {"tool": "read", "args": {"filePath": "$1/hello.c"}},
 {"tool": "edit", "args": {"filePath": "$1/hello.c",
   "oldString": "Hello\\\\n", "newString": "Hello, sbx\\\\n"}},
 {"tool": "bash", "args": {"command": "make", "description": "Build"}},
 {"tool": "bash", "args": {"command": "git diff", "description": "Diff"}},
 {"text": "Done."}]
EOF
}

# start_model DIR: a fake model for a project at DIR; sets model_port and
# model_pid (not in a $(...) subshell: see common.sh)
start_model() {
	local tag=$RANDOM
	script "$1" >"$work/steps.$tag.json"
	"$PY" "$top/tests/fakes/fake_llm.py" --script "$work/steps.$tag.json" \
		--port-file "$work/model.$tag.port" --log "$work/model.log" \
		>"$work/model.$tag.out" 2>&1 &
	model_pid=$!
	pids+=($!)
	wait_port "$work/model.$tag.port" "$work/model.$tag.out"
	model_port=$port
}

# run_task DIR: one timed opencode run in DIR; sets secs
run_task() {
	local dir=$1 t0 t1
	start_model "$dir"
	cat >"$work/opencode.json" <<EOF
{"\$schema": "https://opencode.ai/config.json",
 "provider": {"fake": {"npm": "@ai-sdk/openai-compatible", "name": "Fake",
   "options": {"baseURL": "http://127.0.0.1:$model_port/v1", "apiKey": "x"},
   "models": {"scripted": {"name": "scripted", "tool_call": true}}}},
 "model": "fake/scripted", "small_model": "fake/scripted",
 "autoupdate": false, "share": "disabled",
 "permission": {"edit": "allow", "bash": "allow"}}
EOF
	rm -rf "$work/xdg-data"
	t0=$(date +%s.%N)
	(cd "$dir" && XDG_DATA_HOME=$work/xdg-data \
		OPENCODE_CONFIG=$work/opencode.json \
		timeout 600 "$OPENCODE" run --model fake/scripted "do the task" \
		>"$work/opencode.out" 2>&1) ||
		die "opencode failed in $dir: $(tail -n 20 "$work/opencode.out")"
	t1=$(date +%s.%N)
	git -C "$dir" diff | grep -q '^+.*Hello, sbx' ||
		die "the task did not happen in $dir: $(tail -n 20 "$work/opencode.out")"
	kill "$model_pid" 2>/dev/null || true
	secs=$(echo "$t1 - $t0" | bc)
}

# fresh_copy NAME: a copy of the project; prints its path
fresh_copy() {
	rm -rf "$work/$1"
	cp -a "$proj" "$work/$1"
	echo "$work/$1"
}

note "warm-up run (installs opencode's packages) ..."
run_task "$(fresh_copy warmup)"

declare -A times
for kind in plain local remote; do
	times[$kind]=""
done
for i in $(seq "$RUNS"); do
	note "run $i/$RUNS: plain ..."
	run_task "$(fresh_copy plain)"
	times[plain]+="$secs "

	note "run $i/$RUNS: local mount ..."
	repo=$(fresh_copy localrepo)
	s=oclocal$i
	mnt=$("$SBX" up "$s" --provider local --repo "$repo" | tail -n1) ||
		die "sbx up $s failed: $(cat "$SBX_HOME/logs/$s.log" 2>/dev/null)"
	sessions+=("$s")
	run_task "$mnt"
	times[local]+="$secs "
	"$SBX" down "$s" --force >/dev/null

	note "run $i/$RUNS: remote mount (${DELAY_MS:-10} ms each way) ..."
	root=$(fresh_copy remoteroot)
	start_agent "$root" agent
	start_proxy "$agent_port"
	url_port=$proxy_port
	if [ -n "${REQLOG:-}" ]; then
		"$PY" "$top/bench/reqlog.py" --listen 127.0.0.1:0 \
			--target "127.0.0.1:$proxy_port" --log "$REQLOG" \
			>"$work/reqlog.$i.port" 2>"$work/reqlog.$i.log" &
		pids+=($!)
		wait_port "$work/reqlog.$i.port" "$work/reqlog.$i.log"
		url_port=$port
	fi
	s=ocremote$i
	mnt=$(bench_up_remote "$s" "$url_port") ||
		die "sbx up $s failed: $(cat "$SBX_HOME/logs/$s.log" 2>/dev/null)"
	sessions+=("$s")
	run_task "$mnt"
	times[remote]+="$secs "
	"$SBX" down "$s" --force >/dev/null
	kill "$agent_pid" "$proxy_pid" 2>/dev/null || true
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
plain=$(echo "${times[plain]}" | median)
printf '\nopencode scripted task (make, run, read, edit, make, git diff), median of %s\n' "$RUNS"
printf '%-8s %9s %8s   %s\n' view seconds ratio runs
for kind in plain local remote; do
	m=$(echo "${times[$kind]}" | median)
	printf '%-8s %9.2f %7.2fx   %s\n' "$kind" "$m" "$(echo "$m / $plain" | bc -l)" "${times[$kind]}"
done
