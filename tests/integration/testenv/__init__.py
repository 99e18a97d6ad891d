"""Helpers for sbx integration tests (see conftest.py for the fixtures)."""

from .compare import (attempt, err_of, ename, lstat_facts, read_bytes,
                      same_as_plain, st_facts, tree)
from .env import GIT_ENV, Result, Sandbox, SbxEnv, SbxError, find_build_dir
from .fuse import NO_FUSE_TAG, fuse_unusable_reason
from .mounts import (all_mounts, is_mounted, lazy_unmount, mounts_at,
                     mounts_under, pid_alive, sbx_mount_at, stat_errno,
                     wait_for_mount, wait_for_unmount)

__all__ = [
    "attempt", "err_of", "ename", "lstat_facts", "read_bytes",
    "same_as_plain", "st_facts", "tree", "GIT_ENV", "Result", "Sandbox",
    "SbxEnv", "SbxError", "find_build_dir", "NO_FUSE_TAG",
    "fuse_unusable_reason", "is_mounted", "lazy_unmount", "all_mounts",
    "mounts_at", "mounts_under", "pid_alive", "sbx_mount_at", "stat_errno",
    "wait_for_mount", "wait_for_unmount",
]
