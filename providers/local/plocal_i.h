/*
 * Local provider internals: a git worktree on this machine.
 *
 *   plocal.c        provider/sandbox ops tables, construction, open()
 *   plocal_git*.c,  control plane on libgit2: create, get, list, terminate,
 *   plocal_create.c snapshot, snapshots, restore (plocal_git_i.h lists
 *   plocal_snap.c   the files)
 *   plocal_fsutil.c
 *   plocal_fs.c     data plane: passthrough on O_PATH descriptors
 *   plocal_watch.c  change stream: recursive inotify on the worktree
 *   plocal_exec.c   exec in the worktree, optionally under bubblewrap
 *
 * Sandbox identity: session <name> has branch sbx/<name> and a worktree at
 * $SBX_HOME/worktrees/<name> registered in the source repository under the
 * worktree name "sbx-<name>".  Everything else is derived from git, so the
 * provider needs no state file of its own.
 */
#ifndef PLOCAL_I_H
#define PLOCAL_I_H

#include <pthread.h>
#include <stdbool.h>
#include <dirent.h>
#include <stdint.h>

#include "sbx/provider.h"

#include "../backends.h"

struct cJSON;

struct plocal_provider {
	struct sbx_provider base;
	char *worktrees; /* $SBX_HOME/worktrees (owned) */
};

/*
 * A node: an O_PATH descriptor of the object (passthrough_hp).  Owned by
 * the caller of lookup; closed in forget.
 */
struct plocal_node {
	int fd;
	dev_t dev;
	ino_t ino;
};

/* An open file or directory. */
struct plocal_file {
	int fd;
	DIR *dir;        /* directories only, protected by `lock` */
	off_t dir_off;   /* cookie of the next entry in `dir` */
	pthread_mutex_t lock;
};

struct plocal_watch; /* plocal_watch.c */

struct plocal_sandbox {
	struct sbx_sandbox base;
	struct plocal_node root;
	char *root_path;   /* absolute worktree path (== base.workdir) */
	char *gitdir;      /* the repository's common git dir (for bwrap) */
	char *state_dir;   /* $SBX_HOME, resolved (bwrap hides it), or NULL */
	char *isolation;   /* "none" or "bwrap" */
	bool network;      /* bwrap: keep network */
	struct plocal_watch *watch;
};

/* plocal_provider_new(), the registry's entry: providers/backends.h. */

/* --- plocal_git.c: control plane ---------------------------------------- */
int plocal_create(struct sbx_provider *p, const struct sbx_create_opts *o,
		  struct sbx_sandbox_info *out);
int plocal_get(struct sbx_provider *p, const char *session,
	       struct sbx_sandbox_info *out);
int plocal_list(struct sbx_provider *p, sbx_list_cb cb, void *payload);
int plocal_terminate(struct sbx_provider *p, const char *session,
		     unsigned flags);
int plocal_snapshot(struct sbx_provider *p, const char *session,
		    const char *message, char **id_out);
int plocal_snapshots(struct sbx_provider *p, const char *session,
		     sbx_snapshot_cb cb, void *payload);
int plocal_restore(struct sbx_provider *p, const char *session,
		   const char *id, char **saved_out);
/*
 * The common git directory of the repository that owns the worktree at
 * `worktree` (for bwrap binds).  *out malloc'd.
 */
int plocal_git_commondir(const char *worktree, char **out);

/* --- plocal_fs.c: data plane --------------------------------------------- */
extern const struct sbx_sandbox_ops plocal_sandbox_ops;
/* Open the data plane of the worktree at `path` for `session`. */
SBX_WUR int plocal_sandbox_open(struct plocal_provider *p, const char *session,
				const char *path, struct sbx_sandbox **out);

/* --- plocal_watch.c ------------------------------------------------------ */
int plocal_watch_start(struct sbx_sandbox *sb, sbx_change_cb cb,
		       void *payload);
int plocal_watch_sync(struct sbx_sandbox *sb);
void plocal_watch_stop(struct sbx_sandbox *sb);

/*
 * Our own changes through the mount need no invalidation: the kernel
 * learnt of them from the FUSE reply.  Before an entry-changing system
 * call, the data plane registers the inotify event it will cause
 * (IN_CREATE, IN_DELETE, IN_MOVED_FROM, IN_MOVED_TO in directory `dir`),
 * and the watcher drops that one event instead of invalidating.  After
 * the call, plocal_expect_end() says whether it succeeded.  Returns NULL
 * (nothing to do) when no change stream runs.  Thread-safe.
 */
struct plocal_expect;
struct plocal_expect *plocal_expect_begin(struct plocal_sandbox *s,
					  const struct plocal_node *dir,
					  const char *name, uint32_t mask);
void plocal_expect_end(struct plocal_sandbox *s, struct plocal_expect *e,
		       bool ok);

/* --- plocal_exec.c ------------------------------------------------------- */
int plocal_exec_start(struct sbx_sandbox *sb,
		      const struct sbx_exec_request *req,
		      struct sbx_exec_handle **out);

#endif
