#!/usr/bin/python3
"""Count test results of one or more meson build directories.

Reads <build>/meson-logs/testlog.json.  Unit tests (TAP) count per TAP case;
integration tests (pytest) count per pytest test, from the JUnit XML files
pytest wrote (<build>/tests/integration/pytest-<area>.xml).  A meson test
that failed without per-case results (crash, timeout) counts as one failure.

Prints one line per build and suite, then, last, the plain summary line
"N passed, N failed, N skipped".  Exit status: 0 when nothing failed; 1 on
failures; 2 when --require-fuse is given and a test was skipped for lack of
FUSE (a skip is never a pass in CI).

usage: test-summary.py [--require-fuse] BUILD_DIR...
"""

import glob
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

TAP_RE = re.compile(r"^(not ok|ok)\b(.*)$", re.M)
NO_FUSE_TAG = "SBX-NO-FUSE"


EXCERPT_LINES = 40


def excerpt(elem):
    """The first lines of a JUnit failure, indented under its FAILED line:
    CI shows only the tail of the output, where the summary is, so the
    reason (a finding, a seed, an assertion) must be there too."""
    text = (elem.get("message") or "").strip()
    body = (elem.text or "").strip()
    if body and body not in text:
        text = (text + "\n" + body).strip() if text else body
    lines = [l for l in text.splitlines() if l.strip()]
    if not lines:
        return ""
    more = len(lines) - EXCERPT_LINES
    lines = lines[:EXCERPT_LINES]
    if more > 0:
        lines.append(f"... ({more} more lines in the JUnit XML)")
    return "".join("\n        | " + l[:200] for l in lines)


def junit_counts(path):
    c = {"passed": 0, "failed": 0, "skipped": 0, "nofuse": 0, "failures": []}
    root = ET.parse(path).getroot()
    for tc in root.iter("testcase"):
        name = f"{tc.get('classname')}::{tc.get('name')}"
        bad = tc.find("failure")
        if bad is None:
            bad = tc.find("error")
        if bad is not None:
            c["failed"] += 1
            c["failures"].append(name + excerpt(bad))
        elif tc.find("skipped") is not None:
            c["skipped"] += 1
            sk = tc.find("skipped")
            if NO_FUSE_TAG in (sk.get("message") or "") + (sk.text or ""):
                c["nofuse"] += 1
        else:
            c["passed"] += 1
    return c


def tap_counts(stdout):
    c = {"passed": 0, "failed": 0, "skipped": 0, "nofuse": 0, "failures": []}
    for m in TAP_RE.finditer(stdout or ""):
        rest = m.group(2)
        if "# SKIP" in rest.upper():
            c["skipped"] += 1
        elif m.group(1) == "ok" or "# TODO" in rest.upper():
            c["passed"] += 1
        else:
            c["failed"] += 1
            c["failures"].append(rest.strip())
    return c


def build_counts(build):
    log = os.path.join(build, "meson-logs", "testlog.json")
    per_suite = {}
    if not os.path.exists(log):
        return {"(no testlog.json)": {"passed": 0, "failed": 1, "skipped": 0,
                                      "nofuse": 0,
                                      "failures": [f"{log} missing"]}}
    with open(log) as f:
        entries = [json.loads(line) for line in f if line.strip()]
    for e in entries:
        # meson 1.0 names a test "project:suite / name"
        full = e["name"]
        prefix, _, name = full.rpartition(" / ")
        suites = [x.split(":", 1)[-1] for x in e.get("suite") or []]
        if prefix:
            suites.append(prefix.split(":", 1)[-1])
        suite = next((x for x in suites if x in ("unit", "integration")),
                     suites[0] if suites else "other")
        res = e.get("result", "ERROR")
        if name.startswith("pytest-"):
            xml = glob.glob(os.path.join(build, "**", name + ".xml"),
                            recursive=True)
            c = junit_counts(xml[0]) if xml else None
        else:
            c = tap_counts(e.get("stdout", ""))
            if not (c["passed"] + c["failed"] + c["skipped"]):
                c = None
        if c is None:  # no per-case results: count the meson test itself
            c = {"passed": 0, "failed": 0, "skipped": 0, "nofuse": 0,
                 "failures": []}
            if res in ("OK", "EXPECTEDFAIL"):
                c["passed"] = 1
            elif res == "SKIP":
                c["skipped"] = 1
            else:
                c["failed"] = 1
                c["failures"].append(f"{name}: {res}")
        elif res not in ("OK", "SKIP", "EXPECTEDFAIL") and not c["failed"]:
            # e.g. a timeout or a crash after some cases had passed
            c["failed"] += 1
            c["failures"].append(f"{name}: {res}")
        if c["failures"] and not c["failures"][0].startswith(name):
            c["failures"] = [f"{name}: {x}" for x in c["failures"]]
        s = per_suite.setdefault(suite, {"passed": 0, "failed": 0,
                                         "skipped": 0, "nofuse": 0,
                                         "failures": []})
        for k in ("passed", "failed", "skipped", "nofuse"):
            s[k] += c[k]
        s["failures"] += c["failures"]
    return per_suite


def main(argv):
    require_fuse = "--require-fuse" in argv
    builds = [a for a in argv if not a.startswith("--")]
    total = {"passed": 0, "failed": 0, "skipped": 0, "nofuse": 0}
    for b in builds:
        for suite, c in sorted(build_counts(b).items()):
            print(f"{os.path.basename(os.path.normpath(b))}/{suite}: "
                  f"{c['passed']} passed, {c['failed']} failed, "
                  f"{c['skipped']} skipped")
            for f in c["failures"]:
                print(f"    FAILED {f}")
            for k in total:
                total[k] += c[k]
    rc = 1 if total["failed"] else 0
    if total["nofuse"]:
        print(f"{total['nofuse']} integration tests were skipped: no usable "
              f"/dev/fuse" + (" (not allowed here)" if require_fuse else ""))
        if require_fuse:
            rc = rc or 2
    if not (total["passed"] + total["failed"]):
        print("no test ran")
        rc = rc or 1
    print(f"{total['passed']} passed, {total['failed']} failed, "
          f"{total['skipped']} skipped")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
