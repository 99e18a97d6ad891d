"""The test tree itself: every integration test file runs in CI."""
import re
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.nofuse
def test_every_test_file_is_registered():
    # A test_<area>.py missing from meson.build's integration_areas never
    # runs under `meson test` (scripts/test.sh, CI): it once happened to
    # two new files.
    text = (HERE / "meson.build").read_text()
    block = re.search(r"integration_areas = \[(.*?)\]", text, re.S).group(1)
    areas = set(re.findall(r"'([a-z_]+)'", block))
    files = {p.stem[len("test_"):] for p in HERE.glob("test_*.py")}
    assert files - areas == set(), "not in tests/integration/meson.build"
    assert areas - files == set(), "registered but missing"


# The layers, lowest first: a file may include headers of its own layer or
# a lower one (docs/design.md, "Layout and layers").
LAYERS = {"include": 0, "lib": 0, "providers": 1,
          "fs": 2, "shim": 2, "agent": 2, "cli": 2}
SOURCE_DIRS = list(LAYERS)


def _includes(path):
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        if m:
            yield n, m.group(1)


def _resolve(top, src, name, by_suffix):
    """The header a quoted include names: relative to the includer first,
    then include/, then the one file in the tree whose path ends so."""
    for base in (src.parent, top / "include"):
        cand = (base / name).resolve()
        if cand.is_file():
            return cand
    hits = by_suffix.get(name.split("/")[-1], [])
    hits = [h for h in hits if str(h).endswith("/" + name)]
    return hits[0] if len(hits) == 1 else None


@pytest.mark.nofuse
def test_include_graph_is_layered():
    """lib -> providers -> fs/shim/agent/cli, and no private header (*_i.h,
    or any header of another provider's directory) crosses its directory."""
    top = HERE.parent.parent
    files = [p for d in SOURCE_DIRS for p in (top / d).rglob("*.[ch]")]
    by_suffix = {}
    for p in files:
        by_suffix.setdefault(p.name, []).append(p.resolve())
    bad = []
    for src in files:
        rel = src.relative_to(top)
        layer = LAYERS[rel.parts[0]]
        for n, name in _includes(src):
            hdr = _resolve(top, src, name, by_suffix)
            if hdr is None:
                continue  # generated (config.h, *.pb-c.h) or system
            hrel = hdr.relative_to(top.resolve())
            where = f"{rel}:{n}: includes {hrel}"
            if LAYERS[hrel.parts[0]] > layer:
                bad.append(where + " (a higher layer)")
            if hrel.name.endswith("_i.h") and hdr.parent != src.resolve().parent:
                bad.append(where + " (a private header of another directory)")
            # The registry (providers/provider.c) names every provider's
            # public header; a provider itself reaches another one only
            # through include/sbx (e.g. sbx/remote.h) or providers/common.
            if (hrel.parts[0] == "providers" and rel.parts[0] == "providers"
                    and len(rel.parts) > 2 and len(hrel.parts) > 2
                    and hrel.parts[1] != "common"
                    and rel.parts[1] != hrel.parts[1]):
                bad.append(where + " (another provider's header)")
    assert bad == [], "\n".join(bad)
