#!/usr/bin/env bash
# The sbx demo: install the packages, build, create a local sandbox of a git
# repository, mount it, and show it working.
#
#   scripts/demo.sh [--repo DIR] [--keep] [--no-install]
#
#   --repo DIR     use this repository (default: a small sample repository)
#   --keep         leave the session up at the end (prints how to reach it)
#   --no-install   do not apt-get install anything
#
# Runs as root (apt, FUSE); re-runs itself with sudo when started as a user.
set -euo pipefail

repo="" keep=0 install=1
while [ $# -gt 0 ]; do
	case $1 in
	--repo) repo=$(cd "$2" && pwd); shift ;;
	--keep) keep=1 ;;
	--no-install) install=0 ;;
	-h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "demo.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
	esac
	shift
done

if [ "$(id -u)" -ne 0 ]; then
	command -v sudo >/dev/null ||
		{ echo "demo.sh: run as root (apt, FUSE)" >&2; exit 1; }
	exec sudo -E "$0" "$@"
fi

cd "$(dirname "$0")/.."
top=$PWD
if [ -t 1 ]; then
	step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
else
	step() { printf '\n== %s\n' "$*"; }
fi
show() { printf '$ %s\n' "$*"; "$@"; }

if [ "$install" = 1 ]; then
	step "installing packages"
	scripts/install-deps.sh
fi

step "building"
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null
sbx=$top/build/cli/sbx
"$sbx" --version

demo=$(mktemp -d /tmp/sbx-demo.XXXXXX)
export SBX_HOME=${SBX_HOME:-$demo/state}
export SBX_MOUNT_ROOT=${SBX_MOUNT_ROOT:-$demo/mnt}
export PATH=$top/build/cli:$PATH

finish() {
	if [ "$keep" = 1 ]; then
		step "kept: the session is still up"
		echo "export SBX_HOME=$SBX_HOME SBX_MOUNT_ROOT=$SBX_MOUNT_ROOT PATH=$top/build/cli:\$PATH"
		echo "sbx status demo; cd $SBX_MOUNT_ROOT/demo; sbx down demo --force"
	else
		"$sbx" down demo --force >/dev/null 2>&1 || true
		rm -rf "$demo"
	fi
}
trap finish EXIT

if [ -z "$repo" ]; then
	step "creating a sample repository"
	repo=$demo/sample
	mkdir -p "$repo"
	git -C "$repo" init -q -b main
	printf '#include <stdio.h>\n\nint main(void)\n{\n\tputs("hello");\n\treturn 0;\n}\n' >"$repo/hello.c"
	printf 'hello: hello.c\n\tcc -o $@ $<\n' >"$repo/Makefile"
	printf '# sample\n' >"$repo/README.md"
	git -C "$repo" add -A
	git -C "$repo" -c user.name=demo -c user.email=demo@sbx.invalid \
		commit -q -m "sample project"
	echo "$repo"
fi

step "sbx up demo: a git worktree on branch sbx/demo, mounted through FUSE"
echo "\$ sbx up demo --repo $repo"
mnt=$(sbx up demo --repo "$repo")
echo "$mnt"

step "the mount is an ordinary directory"
show ls -la "$mnt"
show findmnt -n -o SOURCE,FSTYPE "$mnt"

step "editing a file through the mount"
if [ -f "$mnt/README.md" ]; then
	file=README.md
else
	file=$(cd "$mnt" && git ls-files | head -n 1)
fi
echo "// edited through sbx" >>"$mnt/$file"
show tail -n 2 "$mnt/$file"
show git -C "$mnt" status --short
echo "(the source checkout is untouched:)"
show git -C "$repo" status --short --branch

step "every path knows its session (virtual xattrs)"
show getfattr -n user.sbx.session "$mnt/$file"
show getfattr -n user.sbx.path "$mnt/$file"

step "snapshot, status, list"
show sbx snapshot demo -m "demo edit"
show sbx status demo
show sbx ls

if [ "$keep" = 0 ]; then
	step "sbx down demo --force"
	show sbx down demo --force
	echo "branch sbx/demo is kept in $repo: $(git -C "$repo" log --oneline -1 sbx/demo)"
fi
