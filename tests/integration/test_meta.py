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
