"""The documentation against the code: what README.md and docs/cli.md
promise is what the tree does.

- README.md's by-hand `apt-get install` line names exactly the packages
  scripts/install-deps.sh installs (it once lacked libyaml-dev and the
  protobuf-c packages, and `meson setup` failed by those instructions);
- every option `sbx help` and `sbx help CMD` print appears in docs/cli.md;
- errors carry the `sbx` prefix docs/cli.md promises, getopt's too.
"""
import re
import subprocess
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.nofuse


def install_deps_packages():
    """The PACKAGES array of scripts/install-deps.sh, and the packages it
    adds only on a condition (kubectl when none is installed)."""
    text = (TOP / "scripts" / "install-deps.sh").read_text()
    block = re.search(r"^PACKAGES=\((.*?)^\)", text, re.S | re.M).group(1)
    words = []
    for line in block.splitlines():
        words += line.split("#", 1)[0].split()
    extra = re.findall(r"PACKAGES\+=\(([^)]*)\)", text)
    return set(words), {w for e in extra for w in e.split()}


def readme_apt_packages():
    """The packages of README.md's `apt-get install` command (its
    continuation lines included); comments are dropped."""
    lines = (TOP / "README.md").read_text().splitlines()
    found = []
    for i, line in enumerate(lines):
        if "apt-get install" not in line:
            continue
        cmd = line
        while cmd.rstrip().endswith("\\"):
            i += 1
            cmd = cmd.rstrip()[:-1] + " " + lines[i]
        found.append(cmd.split("#", 1)[0])
    assert len(found) == 1, f"README.md: {len(found)} apt-get install lines"
    words = found[0].split()
    words = words[words.index("install") + 1:]
    return {w for w in words if not w.startswith("-")}


def test_readme_packages_are_install_deps():
    want, optional = install_deps_packages()
    got = readme_apt_packages()
    assert want, "no PACKAGES in scripts/install-deps.sh"
    assert want - got == set(), "in install-deps.sh, not in README.md"
    assert got - want - optional == set(), \
        "in README.md, not in install-deps.sh"


def help_text(build_dir, *args):
    r = subprocess.run([str(build_dir / "cli" / "sbx"), "help", *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


def commands(build_dir):
    text = help_text(build_dir)
    block = text.split("commands:", 1)[1].split("\n\n", 1)[0]
    return [ln.split()[0] for ln in block.splitlines() if ln.strip()]


# Options in the option lines of the help ("  -m, --message MSG ...",
# "  -t / -T ...", "  --socket PATH ..."): lines that start with
# blanks and a dash.  No description there has a word starting with "-".
OPT_RE = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def options_of(text):
    opts = set()
    for line in text.splitlines():
        if re.match(r"\s+-", line):
            opts.update(OPT_RE.findall(line))
    return opts


def test_help_options_are_documented(build_dir):
    doc = (TOP / "docs" / "cli.md").read_text()
    cmds = commands(build_dir)
    assert "up" in cmds and "exec" in cmds, cmds
    missing = []
    for cmd in [None] + cmds:
        text = help_text(build_dir, *([cmd] if cmd else []))
        for opt in sorted(options_of(text)):
            if not re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(opt),
                             doc):
                missing.append(f"sbx help {cmd or ''}: {opt}")
    assert not missing, "not in docs/cli.md:\n" + "\n".join(missing)


def test_options_parser_sees_every_option(build_dir):
    # The parser of this test finds what it should (a guard against a
    # help format change silently emptying the check above).
    up = options_of(help_text(build_dir, "up"))
    assert {"--provider", "--image", "--kubeconfig", "--json",
            "-h", "--help"} <= up, up
    assert {"-m", "--message"} <= options_of(help_text(build_dir,
                                                       "snapshot"))
    assert {"-C", "-e", "-t", "-T"} <= options_of(help_text(build_dir,
                                                           "exec"))


@pytest.mark.parametrize("args, prefix", [
    (["--bogus"], "sbx: "),
    (["up", "--bogus"], "sbx up: "),
    (["up", "--provider"], "sbx up: "),
    (["snapshot", "x", "-m"], "sbx snapshot: "),
    (["nosuchcommand"], "sbx: "),
])
def test_usage_errors_are_prefixed(build_dir, args, prefix):
    r = subprocess.run([str(build_dir / "cli" / "sbx"), *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r
    assert r.stderr.startswith(prefix), r.stderr
