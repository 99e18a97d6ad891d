#!/usr/bin/env bash
# Build (and optionally push) the sbx-agent image used by the kubernetes
# provider's init container (contrib/kubernetes/README.md).
#
#   1. ninja -C BUILD_DIR agent-bundle   -> BUILD_DIR/sbx-agent-bundle/
#   2. ENGINE build -f contrib/kubernetes/Containerfile.agent -t TAG BUILD_DIR/sbx-agent-bundle
#   3. with --push: ENGINE push TAG
#
# ENGINE is the first of podman, docker, buildah found on PATH, or --engine.
set -euo pipefail

prog=${0##*/}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
containerfile=$here/Containerfile.agent

tag=ghcr.io/sbx-dev/sbx-agent:0.1
build_dir=$root/build
engine=
push=0
skip_bundle=0

usage() {
	cat <<USAGE
usage: $prog [--tag IMAGE] [--push] [--build-dir DIR] [--engine podman|docker|buildah] [--skip-bundle]

Builds the sbx-agent bundle (ninja -C DIR agent-bundle) and the image
$containerfile
from it, with podman, docker or buildah (the first found, or --engine).

  --tag IMAGE     image name (default: $tag); set the same name as
                  "agent_image" in sbx's "kubernetes" configuration
  --push          push IMAGE after building (log in to the registry first)
  --build-dir DIR meson build directory (default: $build_dir)
  --engine NAME   use this container engine
  --skip-bundle   do not run ninja; use DIR/sbx-agent-bundle as it is
  -h, --help      this text

The bundle holds binaries for this machine's architecture ($(uname -m)):
the image only works on nodes of the same architecture.
USAGE
}

die() {
	echo "$prog: $*" >&2
	exit 1
}

while [ $# -gt 0 ]; do
	case $1 in
	--tag) [ $# -ge 2 ] || die "--tag needs an image name"; tag=$2; shift 2 ;;
	--tag=*) tag=${1#--tag=}; shift ;;
	--push) push=1; shift ;;
	--build-dir) [ $# -ge 2 ] || die "--build-dir needs a directory"; build_dir=$2; shift 2 ;;
	--build-dir=*) build_dir=${1#--build-dir=}; shift ;;
	--engine) [ $# -ge 2 ] || die "--engine needs a name"; engine=$2; shift 2 ;;
	--engine=*) engine=${1#--engine=}; shift ;;
	--skip-bundle) skip_bundle=1; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "$prog: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
	esac
done

[ -n "$tag" ] || die "--tag: empty image name"

if [ -n "$engine" ]; then
	case $engine in
	podman | docker | buildah) ;;
	*) die "--engine: unknown engine '$engine' (use podman, docker or buildah)" ;;
	esac
	command -v "$engine" >/dev/null 2>&1 || die "--engine $engine: not found on PATH"
else
	for e in podman docker buildah; do
		if command -v "$e" >/dev/null 2>&1; then
			engine=$e
			break
		fi
	done
	[ -n "$engine" ] || die "no container engine found: install podman, docker or buildah
(Debian: apt-get install podman), or build $containerfile elsewhere
with build context $build_dir/sbx-agent-bundle"
fi

case $build_dir in
/*) ;;
*) build_dir=$PWD/$build_dir ;;
esac
bundle=$build_dir/sbx-agent-bundle

if [ "$skip_bundle" -eq 0 ]; then
	[ -f "$build_dir/build.ninja" ] || die "$build_dir is not a meson build directory (run: meson setup $build_dir)"
	command -v ninja >/dev/null 2>&1 || die "ninja not found (Debian: apt-get install ninja-build)"
	ninja -C "$build_dir" agent-bundle
fi
if [ ! -x "$bundle/bin/sbx-agent" ] || [ ! -x "$bundle/lib/ld.so" ]; then
	die "$bundle: no agent bundle (bin/sbx-agent, lib/ld.so); run: ninja -C $build_dir agent-bundle"
fi

version=$(sed -n "s/^[[:space:]]*version:[[:space:]]*'\([^']*\)'.*/\1/p" "$root/meson.build" | head -n 1)
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)

build_args=(--build-arg "VERSION=${version:-unknown}" --build-arg "REVISION=$revision")
case $engine in
buildah) buildah build -f "$containerfile" -t "$tag" "${build_args[@]}" "$bundle" ;;
*) "$engine" build -f "$containerfile" -t "$tag" "${build_args[@]}" "$bundle" ;;
esac
echo "$prog: built $tag with $engine"

if [ "$push" -eq 1 ]; then
	"$engine" push "$tag"
	echo "$prog: pushed $tag"
else
	echo "$prog: not pushed (use --push, or: $engine push $tag)"
fi
