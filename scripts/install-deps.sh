#!/usr/bin/env bash
# Install every Debian 12 package sbx needs to build, test, demo and bench.
# Used by scripts/test.sh --install, scripts/demo.sh and .ci/run.
set -euo pipefail

PACKAGES=(
	# build
	meson ninja-build pkg-config gcc clang libclang-rt-14-dev
	libfuse3-dev libgit2-dev libcurl4-openssl-dev libcjson-dev
	libmicrohttpd-dev libcmocka-dev libyaml-dev
	protobuf-c-compiler libprotobuf-c-dev protobuf-compiler libprotobuf-dev
	# run
	fuse3 bubblewrap git
	# tests
	python3 python3-pytest python3-pytest-timeout python3-yaml python3-protobuf python3-grpcio openssl vim tmux attr
	# benchmarks
	bindfs sshfs hyperfine
)

# tests: the kubectl cross-check of the fake Kubernetes API server
# (tests/integration/test_kubefake.py; under CI=true a missing kubectl
# fails it).  Debian 12's kubectl is kubernetes-client (1.20).  Another
# kubectl already installed (a cloud SDK's) is used instead: both packages
# ship /usr/bin/kubectl.
if ! command -v kubectl >/dev/null 2>&1; then
	PACKAGES+=(kubernetes-client)
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: run as root (sudo $0)" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
echo "install-deps: ${#PACKAGES[@]} packages installed"
