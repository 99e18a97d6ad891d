/*
 * The FUSE daemon: serves one session's sandbox at a mountpoint.
 *
 * fs_daemon_run() mounts, serves until unmounted or signalled (SIGINT,
 * SIGTERM, SIGHUP end it cleanly), and unmounts.  The CLI calls it in the
 * foreground (`sbx mount -f`) or in a detached child (`sbx up`, `sbx mount`).
 */
#ifndef SBX_FS_H
#define SBX_FS_H

#include <stdbool.h>

#include "sbx/error.h"

struct sbx_sandbox;

struct fs_options {
	const char *session;    /* session name (mount name sbx:<session>) */
	const char *mountpoint; /* existing, empty directory */
	const char *control_socket; /* unix socket path for the exec shim
				     * (NULL: no control socket) */
	struct sbx_sandbox *sandbox; /* borrowed; must outlive the call */
	int ready_fd;   /* >= 0: write one byte once mounted, then close */
	bool debug;     /* libfuse debug output */
	/*
	 * Mount with allow_other: other users (a build running as another
	 * uid, root-owned tools) may use the mount; the kernel still checks
	 * modes (default_permissions).  A non-root daemon needs
	 * user_allow_other in /etc/fuse.conf.
	 */
	bool allow_other;
	unsigned max_threads; /* 0: default */
	/*
	 * Serve the sandbox through the caching layer (fs/cache.h), a
	 * decorator the caller chooses: only for a sandbox that
	 * fs_cache_supported() accepts (fs_daemon_run() fails with -EINVAL
	 * otherwise).  cli/daemon.c caches every such sandbox: the cache is
	 * part of the remote data plane's correctness (docs/design.md).
	 */
	bool cache;
};

/*
 * Can `sb` be served through the caching layer?  True for a path-based
 * sandbox, one that offers node_at (sbx/provider.h): the remote ones.
 */
bool fs_cache_supported(const struct sbx_sandbox *sb);

/*
 * Serve until unmounted.  Returns 0 after a clean unmount, or a negative
 * errno with sbx_error_last() set when the mount could not be set up.
 */
SBX_WUR int fs_daemon_run(const struct fs_options *o);

#endif
