/*
 * Private declarations shared by the pieces of the remote data plane:
 * premote_fs.c (request helpers, node operations, files, the ops table),
 * premote_nodes.c (identities and the node table) and premote_fs_dir.c
 * (directories, xattrs, bulk).  Not for anything outside
 * providers/remote/.
 *
 * Locking: the node table (premote_node_*, premote_npath, premote_cpath,
 * premote_ino_at) takes s->nodes_lock itself, except the *_locked
 * functions, whose caller holds it.  Errors: negative errno with
 * sbx_error_last(), as everywhere.
 */
#ifndef SBX_PREMOTE_FS_I_H
#define SBX_PREMOTE_FS_I_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "premote_i.h"

struct cJSON;
struct sbx_batch_op;

#define RSB(sb) PREMOTE_SB(sb)
#define RNODE(n) ((struct premote_node *)(n))

/* An open file: a reference on its node (so renames follow it). */
struct premote_file {
	struct premote_node *node;
	int flags;
	/* directories: the listing fetched at the first readdir */
	pthread_mutex_t lock;
	bool is_dir;
	bool fetched, served;
	struct cJSON *listing;          /* the answer ({"entries": [...]}) */
	const struct cJSON **entries;   /* borrowed from listing */
	size_t nentries;
	struct stat dot;         /* attributes of the directory itself */
};

#define RFILE(f) ((struct premote_file *)(f))

/* A 64-bit mixer (splitmix64's finaliser): spreads inode numbers. */
static inline uint64_t mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

/* ---- node table (premote_nodes.c) ---------------------------------------- */

/*
 * A tracked node for the object with (fixed) attributes `st` found at
 * `path`: the known one (path updated) or a new one.  One reference,
 * dropped with premote_node_put() (NULL and the root are ignored).
 */
struct premote_node *premote_node_get(struct premote_sandbox *s,
				      const char *path, const struct stat *st);
void premote_node_put(struct premote_sandbox *s, struct premote_node *n);
void premote_node_ref(struct premote_sandbox *s, struct premote_node *n);
/* The node's current path; `name` in directory `parent` ("." and ".."
 * resolved).  malloc'd. */
char *premote_npath(struct premote_sandbox *s, struct sbx_node *node);
char *premote_cpath(struct premote_sandbox *s, struct sbx_node *parent,
		    const char *name);
/* Every tracked node at or below `from` now lives below `to` (and the
 * other way round with `swap`).  Caller holds nodes_lock. */
void premote_move_locked(struct premote_sandbox *s, const char *from,
			 const char *to, bool swap);

/* ---- requests (premote_fs.c) ---------------------------------------------- */

/* A decoded, fixed stat from member `key` of `j`. */
SBX_WUR int premote_get_st(struct premote_sandbox *s, const struct cJSON *j,
			   const char *key, struct stat *st);
/* GET route?path=P (no query when NULL) and its JSON answer. */
SBX_WUR int premote_get_json(struct premote_sandbox *s, const char *route,
			     const char *path, struct cJSON **out);
/* Run one batch op; *res (may be NULL) gets its result object. */
SBX_WUR int premote_batch1(struct premote_sandbox *s,
			   const struct sbx_batch_op *op, struct cJSON **res);
struct premote_file *premote_file_new(struct premote_sandbox *s,
				      struct premote_node *n, int flags);
void premote_file_free(struct premote_sandbox *s, struct premote_file *f);
SBX_WUR int premote_fsync_path(struct premote_sandbox *s,
			       struct premote_node *n, bool datasync);

/* ---- directories, xattrs, bulk (premote_fs_dir.c): ops of the table ------ */

int premote_opendir(struct sbx_sandbox *sb, struct sbx_node *node,
		    struct sbx_file **out);
int premote_readdir(struct sbx_sandbox *sb, struct sbx_file *dh, off_t off,
		    unsigned flags, sbx_dirent_cb cb, void *payload);
int premote_fsyncdir(struct sbx_sandbox *sb, struct sbx_file *dh,
		     bool datasync);
int premote_releasedir(struct sbx_sandbox *sb, struct sbx_file *dh);
int premote_statfs(struct sbx_sandbox *sb, struct sbx_node *node,
		   struct statvfs *out);
ssize_t premote_getxattr(struct sbx_sandbox *sb, struct sbx_node *node,
			 const char *name, void *buf, size_t size);
ssize_t premote_listxattr(struct sbx_sandbox *sb, struct sbx_node *node,
			  char *buf, size_t size);
int premote_setxattr(struct sbx_sandbox *sb, struct sbx_node *node,
		     const char *name, const void *value, size_t size,
		     int flags);
int premote_removexattr(struct sbx_sandbox *sb, struct sbx_node *node,
			const char *name);
int premote_bulk(struct sbx_sandbox *sb, const char *dir,
		 const struct sbx_bulk_opts *o, sbx_bulk_cb cb, void *payload);

#endif
