#!/usr/bin/env python3
"""Run protoc-c for the Modal provider's .proto files (build helper).

usage: protoc_c_gen.py PROTOC_C OUTDIR PROTO_INCLUDE_DIR PROTO...

Generates <name>.pb-c.c/.h for each PROTO and for google/protobuf/empty.proto
(no distribution ships its protobuf-c code), all flat in OUTDIR: meson's
custom_target outputs cannot live in subdirectories, so the include of
"google/protobuf/empty.pb-c.h" is rewritten to "empty.pb-c.h".
"""
import os
import shutil
import subprocess
import sys
import tempfile


def main():
    protoc_c, outdir, pinc = sys.argv[1:4]
    protos = [os.path.abspath(p) for p in sys.argv[4:]]
    empty = os.path.join(pinc, 'google', 'protobuf', 'empty.proto')
    if not os.path.exists(empty):
        sys.exit('protoc_c_gen: %s not found (install libprotobuf-dev)'
                 % empty)
    srcdirs = sorted({os.path.dirname(p) for p in protos})
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [protoc_c, '--c_out=' + tmp]
        cmd += ['-I' + d for d in srcdirs] + ['-I' + pinc]
        cmd += protos + [empty]
        subprocess.run(cmd, check=True)
        gen = []
        for p in protos:
            base = os.path.splitext(os.path.basename(p))[0]
            gen += [(base + '.pb-c.c', base + '.pb-c.c'),
                    (base + '.pb-c.h', base + '.pb-c.h')]
        gen += [('google/protobuf/empty.pb-c.c', 'empty.pb-c.c'),
                ('google/protobuf/empty.pb-c.h', 'empty.pb-c.h')]
        for src, dst in gen:
            with open(os.path.join(tmp, src)) as f:
                text = f.read()
            text = text.replace('"google/protobuf/empty.pb-c.h"',
                                '"empty.pb-c.h"')
            tmpdst = os.path.join(outdir, dst + '.tmp')
            with open(tmpdst, 'w') as f:
                f.write(text)
            shutil.move(tmpdst, os.path.join(outdir, dst))


if __name__ == '__main__':
    main()
