#!/usr/bin/env bash
# Build sbx and run every test suite: unit (cmocka) + integration (pytest on
# real FUSE mounts), first in a normal build, then in an ASan/UBSan build.
#
#   scripts/test.sh [--install] [--no-asan] [--require-fuse] [-- MESON_TEST_ARGS]
#
#   --install       apt-get install the build and test dependencies first
#                   (scripts/install-deps.sh; needs root)
#   --no-asan       skip the sanitizer build (faster local runs)
#   --require-fuse  fail if an integration test was skipped for lack of a
#                   usable /dev/fuse (implied when CI=true)
#
# Build directories: $BUILD_DIR (default build/) and $ASAN_BUILD_DIR (default
# build-asan/).  The ASan build uses clang when installed ($ASAN_CC).
# Warnings are errors (-Dwerror=true) unless WERROR=false.
# The last line printed is "N passed, N failed, N skipped", counted per unit
# test case and per pytest test over both builds.  Exit status 0 only when
# nothing failed.
set -euo pipefail

cd "$(dirname "$0")/.."
top=$PWD

install=0 asan=1 require_fuse=0
[ "${CI:-}" = "true" ] && require_fuse=1
extra=()
while [ $# -gt 0 ]; do
	case $1 in
	--install) install=1 ;;
	--no-asan) asan=0 ;;
	--require-fuse) require_fuse=1 ;;
	--) shift; extra=("$@"); break ;;
	-h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
PY=/usr/bin/python3
builds=()
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

# run_suites DIR: build DIR and run its tests; records the result.
run_suites() {
	local dir=$1
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
	asan_cc=${ASAN_CC:-$(command -v clang || command -v gcc)}
	if [ ! -f "$ASAN_BUILD_DIR/build.ninja" ]; then
		CC=$asan_cc meson setup "$ASAN_BUILD_DIR" -Dbuildtype=debug \
			-Db_sanitize=address,undefined -Db_lundef=false \
			-Dwerror="$WERROR" >/dev/null
	else
		meson configure "$ASAN_BUILD_DIR" -Dwerror="$WERROR" >/dev/null
	fi
	export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1:print_summary=1
	export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
	export LSAN_OPTIONS=suppressions=$top/scripts/lsan.supp:print_suppressions=0
	# Sanitized code is slower: give the daemon's visibility window and
	# per-test timeouts room, not the assertions.
	export SBX_TEST_TIMEOUT=${SBX_TEST_TIMEOUT:-400}
	run_suites "$ASAN_BUILD_DIR" --timeout-multiplier 3
	unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
fi

section "summary"
args=()
[ "$require_fuse" = 1 ] && args+=(--require-fuse)
set +e
"$PY" scripts/test-summary.py "${args[@]}" "${builds[@]}" >/tmp/sbx-test-summary.$$
sum_rc=$?
set -e
head -n -1 /tmp/sbx-test-summary.$$
last=$(tail -n 1 /tmp/sbx-test-summary.$$)
rm -f /tmp/sbx-test-summary.$$
[ "$sum_rc" -ne 0 ] && status=1
if [ "$status" -ne 0 ]; then
	echo "test.sh: FAILED (see the errors above)"
fi
echo "$last"
exit "$status"
