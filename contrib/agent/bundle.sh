#!/bin/sh
# Build a self-contained sbx-agent bundle (contrib/agent/README.md):
#
#   DIR/bin/sbx-agent     the agent
#   DIR/lib/*.so*         every shared library `ldd` lists for it
#   DIR/lib/ld.so         the dynamic loader (a copy, under a fixed name)
#   DIR/sbx-agent.sh      a launcher, for images that have /bin/sh
#
# Start it in any image (ubuntu, alpine, distroless, scratch) with
#
#   DIR/lib/ld.so --library-path DIR/lib DIR/bin/sbx-agent serve ...
#
# A fully static link is not possible on Debian 12 (GnuTLS's closure needs
# libp11-kit, which has no static library); the bundle carries the same
# closure as shared objects instead.  Commands the agent runs do not see
# the bundle's libraries: --library-path applies to the agent only.
#
# usage: bundle.sh SBX_AGENT_BINARY OUTPUT_DIR [TARBALL]
set -eu

bin=${1:?usage: bundle.sh SBX_AGENT_BINARY OUTPUT_DIR [TARBALL]}
out=${2:?usage: bundle.sh SBX_AGENT_BINARY OUTPUT_DIR [TARBALL]}
tarball=${3:-}

[ -x "$bin" ] || { echo "bundle.sh: $bin: not an executable" >&2; exit 1; }
command -v ldd >/dev/null || { echo "bundle.sh: ldd not found" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp -L "$bin" "$out/bin/sbx-agent"

loader=
# ldd lines: "libx.so.1 => /path/libx.so.1 (0x...)", "/lib64/ld-linux-x86-64.so.2 (0x...)",
# "linux-vdso.so.1 (0x...)" (virtual: skipped).
ldd "$bin" | while read -r first second third rest; do
	case "$second" in
	"=>")
		case "$third" in
		/*) cp -L "$third" "$out/lib/" ;;
		*) echo "bundle.sh: $first not found by ldd" >&2; exit 1 ;;
		esac
		;;
	*)
		case "$first" in
		/*) cp -L "$first" "$out/lib/ld.so"
		    echo "$first" >"$out/lib/.loader" ;;
		esac
		;;
	esac
done
[ -f "$out/lib/ld.so" ] || { echo "bundle.sh: no dynamic loader in ldd output" >&2; exit 1; }
rm -f "$out/lib/.loader"
chmod 0755 "$out/lib/ld.so" "$out/bin/sbx-agent"

cat >"$out/sbx-agent.sh" <<'EOS'
#!/bin/sh
# Run the bundled sbx-agent through its own loader and libraries.
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/lib/ld.so" --library-path "$here/lib" "$here/bin/sbx-agent" "$@"
EOS
chmod 0755 "$out/sbx-agent.sh"

if [ -n "$tarball" ]; then
	tar -C "$out" -czf "$tarball" .
fi
echo "bundle: $out ($(du -sh "$out" | cut -f1))"
