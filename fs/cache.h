/*
 * The caching layer: a sandbox that wraps a path-based sandbox (one with
 * node_at, i.e. the remote providers) and keeps what the daemon asked for,
 * so that repeated work costs no round trip.  A decorator chosen by whoever
 * opens the sandbox: fs_daemon_run() wraps it when fs_options.cache says so
 * (sbx/fs.h; cli/daemon.c decides).  See docs/design.md, "Remote
 * cache and consistency".
 *
 * Caches: attributes, entries (positive and negative), complete directory
 * listings, file contents (memory, spilling large ones to disk under
 * $SBX_HOME/cache/<session>/), symlink targets.  Prefetch: the first time
 * a directory is looked into, one bulk call brings the metadata of its
 * whole subtree and the content of its small files; contents past that
 * call's budget come ahead of a walk's reads, many files a request.
 *
 * Writes are buffered per open file (write-back, not write-through) and
 * pushed on close, fsync, the exec barrier, before any operation that must
 * see the file's real size, and at the latest about one second after they
 * were made.  A push that fails keeps its bytes and its error with the open
 * file: the owner's next fsync() or close() retries them and reports the
 * error if it persists; only the last RELEASE drops what cannot be pushed
 * (and logs it).
 *
 * Touches (setattr of atime/mtime to now only) of files whose attributes
 * are known are answered at once and sent in batches by a sender thread
 * (the wrapped sandbox's setattr_many); every other call into the wrapped
 * sandbox waits for the touches queued before it.  A touch that fails
 * when sent is logged and the file's attributes invalidated: the caller,
 * already answered, is not told.
 *
 * Invalidation comes from the wrapped sandbox's change stream (paths),
 * which the cache turns into identity-based changes for the daemon.  While
 * the stream is healthy everything is cached until invalidated; otherwise
 * cached data is trusted for CACHE_BLIND_TTL seconds only and revalidated
 * on open (close-to-open).  A path that the sandbox says is gone while the
 * cache still had it yields ESTALE, so the kernel looks it up again and
 * retries the system call once.
 *
 * Threads: every operation may run concurrently.  One mutex protects the
 * tree and is never held across I/O on the wrapped sandbox or the disk;
 * per open file, one mutex orders its pushes.  The lock order, the
 * lifetimes and the parts are in cache_i.h.  The cache runs threads of
 * its own: the write-back flusher, from fs_cache_new() to
 * sbx_sandbox_free(), and the look-ahead prefetch's workers (three), from
 * the first read that needs them to sbx_sandbox_free(), and the touch
 * sender, from the first deferred touch to sbx_sandbox_free().
 */
#ifndef FS_CACHE_H
#define FS_CACHE_H

#include <stddef.h>

#include "sbx/error.h"

struct sbx_sandbox;

/*
 * Wrap `inner` (borrowed; must outlive the cache, which never frees it).
 * `disk_dir` (may be NULL) is where large contents spill; created if
 * missing and emptied at start.  *out is released with sbx_sandbox_free().
 */
SBX_WUR int fs_cache_new(struct sbx_sandbox **out, struct sbx_sandbox *inner,
			 const char *disk_dir);

/*
 * How many entry events of its own calls the cache `sb` (made by
 * fs_cache_new()) still waits for: each is dropped when it comes or its
 * call fails.  For tests and debugging: once the change stream has caught
 * up (watch_sync) and no call is out, it is 0.
 */
size_t fs_cache_expected_events(struct sbx_sandbox *sb);

#endif
