#!/usr/bin/env bash
# Build sbx and run every test suite: unit (cmocka) + integration (pytest on
# real FUSE mounts), first in a normal build, then in an ASan/UBSan build,
# then the unit suite and the remote file operations in a ThreadSanitizer
# build.
#
#   scripts/test.sh [--install] [--no-asan] [--no-tsan] [--require-fuse]
#                   [-- MESON_TEST_ARGS]
#
#   --install       apt-get install the build and test dependencies first
#                   (scripts/install-deps.sh; needs root)
#   --no-asan       skip the ASan/UBSan build (faster local runs)
#   --no-tsan       skip the ThreadSanitizer build
#   --require-fuse  fail if an integration test was skipped for lack of a
#                   usable /dev/fuse (implied when CI=true)
#
# Build directories: $BUILD_DIR (default build/), $ASAN_BUILD_DIR (default
# build-asan/) and $TSAN_BUILD_DIR (default build-tsan/).  The sanitizer
# builds use clang when installed ($ASAN_CC, $TSAN_CC).
# Warnings are errors (-Dwerror=true) unless WERROR=false.
# The last line printed is "N passed, N failed, N skipped", counted per unit
# test case and per pytest test over all builds.  Exit status 0 only when
# nothing failed.
set -euo pipefail

cd "$(dirname "$0")/.."
top=$PWD

install=0 asan=1 tsan=1 require_fuse=0
[ "${CI:-}" = "true" ] && require_fuse=1
extra=()
while [ $# -gt 0 ]; do
	case $1 in
	--install) install=1 ;;
	--no-asan) asan=0 ;;
	--no-tsan) tsan=0 ;;
	--require-fuse) require_fuse=1 ;;
	--) shift; extra=("$@"); break ;;
	-h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "test.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
	esac
	shift
done

if [ "$install" = 1 ]; then
	if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then
		sudo scripts/install-deps.sh
	else
		scripts/install-deps.sh
	fi
fi

BUILD_DIR=${BUILD_DIR:-build}
WERROR=${WERROR:-true}
ASAN_BUILD_DIR=${ASAN_BUILD_DIR:-build-asan}
TSAN_BUILD_DIR=${TSAN_BUILD_DIR:-build-tsan}
PY=/usr/bin/python3
builds=()
times=()
status=0

section() { printf '\n==== %s ====\n' "$*"; }

# Lazily unmount whatever a crashed or timed-out pytest left behind.
cleanup_stale() {
	"$PY" - "$top" <<'EOF' || true
import sys
sys.path.insert(0, sys.argv[1] + "/tests/integration")
from testenv import mounts
left = mounts.cleanup_stale_runs()
if left:
    print("test.sh: unmounted leftovers:", *left)
EOF
}

# setup_build DIR [meson options...]: configure (or reconfigure) DIR.
setup_build() {
	local dir=$1
	shift
	if [ -f "$dir/build.ninja" ]; then
		meson configure "$dir" "$@" >/dev/null
	else
		meson setup "$dir" "$@" >/dev/null
	fi
}

# setup_sanitized DIR CC SANITIZERS BUILDTYPE: configure DIR with
# -Db_sanitize=SANITIZERS (compiler CC, chosen at the first setup only).
setup_sanitized() {
	local dir=$1 cc=$2 san=$3 type=$4
	if [ ! -f "$dir/build.ninja" ]; then
		CC=$cc meson setup "$dir" -Dbuildtype="$type" \
			-Db_sanitize="$san" -Db_lundef=false \
			-Dwerror="$WERROR" >/dev/null
	else
		meson configure "$dir" -Dwerror="$WERROR" >/dev/null
	fi
}

# run_suites DIR [MESON_TEST_ARGS]: build DIR and run its tests; records the
# result and how long it took.
run_suites() {
	local dir=$1 t0=$SECONDS
	shift
	section "build $dir"
	if ! ninja -C "$dir"; then
		echo "test.sh: build of $dir failed" >&2
		status=1
		return
	fi
	# stale per-test results must not be counted again
	find "$dir" -name 'pytest-*.xml' -delete
	rm -f "$dir/meson-logs/testlog.json"
	section "test $dir"
	if ! meson test -C "$dir" --print-errorlogs "$@" "${extra[@]}"; then
		status=1
	fi
	builds+=("$dir")
	cleanup_stale
	times+=("$dir: $((SECONDS - t0)) s")
}

cleanup_stale

# 1. The normal build: warnings are errors.
setup_build "$BUILD_DIR" -Dbuildtype=debugoptimized -Dwerror="$WERROR"
run_suites "$BUILD_DIR"

# 2. AddressSanitizer + UndefinedBehaviorSanitizer over both suites.
#    Leak checking stays on: the daemon exits normally on unmount, so its
#    leaks are reported too (the integration fixtures send every sbx
#    process's sanitizer report to a file and fail the test on it).
if [ "$asan" = 1 ]; then
	setup_sanitized "$ASAN_BUILD_DIR" \
		"${ASAN_CC:-$(command -v clang || command -v gcc)}" \
		address,undefined debug
	export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1:print_summary=1
	export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
	export LSAN_OPTIONS=suppressions=$top/scripts/lsan.supp:print_suppressions=0
	# Sanitized code is slower: give the daemon's visibility window and
	# per-test timeouts room, not the assertions.
	export SBX_TEST_TIMEOUT=${SBX_TEST_TIMEOUT:-400}
	# The file-operation suites run on local and remote here; their
	# kubernetes and modal copies (the same cache and agent code behind
	# another transport) ran in the normal build, and the kubernetes and
	# modal suites themselves still run.  This keeps CI near 20 minutes.
	export SBX_TEST_MIRROR=0
	run_suites "$ASAN_BUILD_DIR" --timeout-multiplier 3
	unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS SBX_TEST_MIRROR
fi

# 3. ThreadSanitizer: the unit suite and the file operations on the remote
#    provider, whose daemon is the most threaded (FUSE workers, the cache,
#    the change stream, curl transfers).  The daemon is forked by the CLI,
#    so TSAN_OPTIONS reach it; the integration fixtures give every process
#    a log_path and fail the test on any report (testenv/env.py), and
#    halt_on_error makes a racing daemon die at once, which the test sees.
#    tests/tsan.supp suppresses only races inside third-party libraries.
if [ "$tsan" = 1 ]; then
	# -O2: the remote churn test takes 40 s instead of 120 s at -O0.
	setup_sanitized "$TSAN_BUILD_DIR" \
		"${TSAN_CC:-$(command -v clang || command -v gcc)}" thread \
		debugoptimized
	# The list of unit tests, after meson.build changes too.
	ninja -C "$TSAN_BUILD_DIR" build.ninja >/dev/null
	tsan_tests=()
	while IFS= read -r t; do
		tsan_tests+=("${t##* / }")
	done < <(meson test -C "$TSAN_BUILD_DIR" --no-rebuild --list \
		--suite unit 2>/dev/null)
	tsan_tests+=(pytest-fileops)
	export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$top/tests/tsan.supp:print_suppressions=0"
	export SBX_TEST_PROVIDERS=remote
	export SBX_TEST_TIMEOUT=${SBX_TEST_TIMEOUT:-400}
	run_suites "$TSAN_BUILD_DIR" --timeout-multiplier 3 "${tsan_tests[@]}"
	unset TSAN_OPTIONS SBX_TEST_PROVIDERS
fi

section "summary"
args=()
[ "$require_fuse" = 1 ] && args+=(--require-fuse)
set +e
"$PY" scripts/test-summary.py "${args[@]}" "${builds[@]}" >/tmp/sbx-test-summary.$$
sum_rc=$?
set -e
head -n -1 /tmp/sbx-test-summary.$$
[ ${#times[@]} -gt 0 ] && printf 'time: %s\n' "${times[@]}"
last=$(tail -n 1 /tmp/sbx-test-summary.$$)
rm -f /tmp/sbx-test-summary.$$
[ "$sum_rc" -ne 0 ] && status=1
if [ "$status" -ne 0 ]; then
	echo "test.sh: FAILED (see the errors above)"
fi
echo "$last"
exit "$status"
