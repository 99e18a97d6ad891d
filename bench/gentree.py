#!/usr/bin/env python3
"""Generated source trees for bench/remote.sh, every file different, their
text taken from /usr/include:

    gentree.py seed OUT N KB    N files of KB KiB, 100 a directory
                                (dNNN/fNNNNN.c): the repository of the
                                "seed repo" rows
    gentree.py scale OUT N KB   N files in a kernel-like shape: 100 a
                                directory, 20 directories a group
                                (gNNN/dNN/fNNNNNN.c), sizes from KB/4 to
                                7 KB/4 (mean KB): the "scale" trees
"""

import os
import sys


def text_blob(limit=64 << 20):
    """At least `limit` bytes of /usr/include (all of it if smaller), in a
    fixed order."""
    parts, total = [], 0
    for d, dns, fs in os.walk("/usr/include"):
        dns.sort()
        for f in sorted(fs):
            try:
                with open(os.path.join(d, f), "rb") as fh:
                    parts.append(fh.read())
            except OSError:
                continue
            total += len(parts[-1])
        if total > limit:
            break
    return b"".join(parts)


def write(path, i, blob, start, size):
    head = f"/* file {i} */\n".encode()
    with open(path, "wb") as f:
        f.write(head + blob[start:start + size - len(head)])


def seed(out, n, kb, blob):
    size = kb * 1024
    for i in range(n):
        p = os.path.join(out, f"d{i // 100:03d}", f"f{i:05d}.c")
        if i % 100 == 0:
            os.makedirs(os.path.dirname(p), exist_ok=True)
        write(p, i, blob, (i * 7919 * 1024) % (len(blob) - size), size)


def scale(out, n, kb, blob):
    for i in range(n):
        p = os.path.join(out, f"g{i // 2000:03d}",
                         f"d{(i // 100) % 20:02d}", f"f{i:06d}.c")
        if i % 100 == 0:
            os.makedirs(os.path.dirname(p), exist_ok=True)
        size = kb * 1024 // 4 + (i * 7919) % (kb * 1024 * 3 // 2)
        write(p, i, blob, (i * 104729) % (len(blob) - size), size)


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] not in ("seed", "scale"):
        sys.exit(__doc__)
    kind, out, n, kb = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
        int(sys.argv[4])
    (seed if kind == "seed" else scale)(out, n, kb, text_blob())
