/*
 * Contract between the FUSE daemon core (fs.c, ops.c, inode.c) and the
 * control-socket server (ctl_server.c) that serves the exec shim.
 */
#ifndef FS_CTL_H
#define FS_CTL_H

#include "sbx/error.h"

struct fs;
struct fs_ctl;
struct sbx_sandbox;

/* The sandbox served by this daemon (borrowed). */
struct sbx_sandbox *fs_sandbox(struct fs *fs);
/* The session name and mountpoint (borrowed strings). */
const char *fs_session(struct fs *fs);
const char *fs_mountpoint(struct fs *fs);

/*
 * Liveness: returns once the inode table lock could be taken (the answer to
 * a control PING).  Thread-safe.
 */
void fs_ping(struct fs *fs);

/*
 * Exec barrier, before a command starts: data written through the mount
 * reaches the sandbox.  Thread-safe; may block on I/O.
 */
SBX_WUR int fs_barrier_before(struct fs *fs);

/*
 * Exec barrier, after a command exits: every change the sandbox made up to
 * now is applied to the kernel caches (entries/attributes/pages invalidated)
 * before this returns.  Thread-safe.
 */
SBX_WUR int fs_barrier_after(struct fs *fs);

/*
 * Start serving the control socket at `path` (created 0600; a stale socket
 * file is replaced, a live one refused with -EADDRINUSE).  Serves on its
 * own threads until fs_ctl_stop().  *out owned by the caller.
 */
SBX_WUR int fs_ctl_start(struct fs *fs, const char *path, struct fs_ctl **out);

/* Stop serving, wait for the server threads, unlink the socket.  Accepts
 * NULL.  Running commands are signalled (SIGHUP) and their clients told. */
void fs_ctl_stop(struct fs_ctl *ctl);

#endif
