"""System calls Python's os module lacks, through ctypes.

Each raises OSError with the errno on failure, like os functions do.
"""

import ctypes
import os
import platform
import struct

_libc = ctypes.CDLL(None, use_errno=True)

AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
FALLOC_FL_KEEP_SIZE = 1
FALLOC_FL_PUNCH_HOLE = 2
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2

_SYS_getdents64 = {"x86_64": 217, "aarch64": 61, "riscv64": 61}.get(
    platform.machine())

DT_NAMES = {0: "unknown", 1: "fifo", 2: "chr", 4: "dir", 6: "blk",
            8: "reg", 10: "lnk", 12: "sock"}


def _check(rc, what, *paths):
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}", *paths[:1])
    return rc


def renameat2(old, new, flags=0):
    _libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int,
                                ctypes.c_char_p, ctypes.c_uint]
    return _check(_libc.renameat2(AT_FDCWD, os.fsencode(old), AT_FDCWD,
                                  os.fsencode(new), flags),
                  "renameat2", old)


def fallocate(fd, mode, offset, length):
    _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                                ctypes.c_int64]
    return _check(_libc.fallocate(fd, mode, offset, length), "fallocate")


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def utimensat(path, atime, mtime, follow=True):
    """atime/mtime: (sec, nsec), or UTIME_NOW / UTIME_OMIT."""
    def ts(t):
        if t in (UTIME_NOW, UTIME_OMIT):
            return _Timespec(0, t)
        return _Timespec(*t)

    times = (_Timespec * 2)(ts(atime), ts(mtime))
    _libc.utimensat.argtypes = [ctypes.c_int, ctypes.c_char_p,
                                ctypes.POINTER(_Timespec), ctypes.c_int]
    return _check(_libc.utimensat(AT_FDCWD, os.fsencode(path), times,
                                  0 if follow else AT_SYMLINK_NOFOLLOW),
                  "utimensat", path)


def getdents(path):
    """[(name, d_type name)] of a directory read with raw getdents64."""
    if _SYS_getdents64 is None:
        raise OSError(38, "getdents64 number unknown on this architecture")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    res = []
    buf = ctypes.create_string_buffer(64 * 1024)
    try:
        while True:
            n = _libc.syscall(ctypes.c_long(_SYS_getdents64), fd, buf,
                              ctypes.c_long(len(buf)))
            _check(n, "getdents64", path)
            if n == 0:
                break
            raw = buf.raw[:n]
            off = 0
            while off < n:
                _ino, _doff, reclen, dtype = struct.unpack_from("<QqHB", raw,
                                                                off)
                name = raw[off + 19:off + reclen].split(b"\0", 1)[0]
                res.append((os.fsdecode(name), DT_NAMES.get(dtype, dtype)))
                off += reclen
    finally:
        os.close(fd)
    return res
