/*
 * POST /v1/fs/batch (docs/protocol.md, "Batch ops"): the request's ops
 * decoded into structs and encoded back, for both ends.  The agent
 * decodes requests (agent/handlers_batch.c); the remote provider fills a
 * struct sbx_batch_op and encodes it (providers/remote/premote_fs.c), so
 * the field names and their rules live here once.
 *
 * Pure functions over cJSON; no I/O, no threads, no global state.
 *
 * Errors.  A document that is not {"ops":[...]} fails as a whole
 * (-EINVAL, or -EFBIG beyond SBX_PROTO_MAX_BATCH ops; class
 * SBX_ERR_PROTO).  An op with missing or mistyped fields does not: it
 * keeps its own -EINVAL and message in `rc`/`msg` (the agent answers them
 * as that op's result), so one bad op does not fail the batch.
 *
 * Memory: strings and data in a struct sbx_batch_op are malloc'd and
 * owned by it; sbx_batch_op_fini() frees them.
 */
#ifndef SBX_PROTO_BATCH_H
#define SBX_PROTO_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbx/error.h"

struct cJSON;

enum sbx_batch_kind {
	SBX_BATCH_STAT = 1,
	SBX_BATCH_LIST,
	SBX_BATCH_MKDIR,
	SBX_BATCH_MKNOD,
	SBX_BATCH_CREATE,
	SBX_BATCH_SYMLINK,
	SBX_BATCH_LINK,
	SBX_BATCH_UNLINK,
	SBX_BATCH_RMDIR,
	SBX_BATCH_RENAME,
	SBX_BATCH_SETATTR,
	SBX_BATCH_WRITE,
	SBX_BATCH_READ,
	SBX_BATCH_READLINK,
	SBX_BATCH_FSYNC,
	SBX_BATCH_FALLOCATE,
	SBX_BATCH_LSEEK,
	SBX_BATCH_GETXATTR,
	SBX_BATCH_LISTXATTR,
	SBX_BATCH_SETXATTR,
	SBX_BATCH_REMOVEXATTR,
	SBX_BATCH_STATFS,
};

/* setattr times: not given, "now", or [s, ns]. */
enum sbx_batch_time {
	SBX_BATCH_TIME_OMIT = 0,
	SBX_BATCH_TIME_NOW,
	SBX_BATCH_TIME_SET,
};

/* A read op answers at most this much unless it asks for less. */
#define SBX_BATCH_MAX_READ (1024 * 1024)

/*
 * One op.  Which fields count depends on `kind` (the table in
 * docs/protocol.md); the others stay zero.  Decoded paths are normalised
 * with SBX_PATH_DOTDOT_KEEP (the agent confines them); the encoder sends
 * them as they are.
 */
struct sbx_batch_op {
	int kind;            /* enum sbx_batch_kind; 0 when unknown */
	int rc;              /* decode error (negative errno) or 0 */
	char *msg;           /* decode error message */
	char *path;          /* every kind but statfs */
	bool dir_slash;      /* path was given with a trailing '/' */
	char *newpath;       /* link, rename */
	char *target;        /* symlink, as given (not empty) */
	char *name;          /* xattr name (1-255 bytes) */
	unsigned char
		*data; /* write data, setxattr value (base64 on the wire) */
	size_t data_len;
	long long offset, length; /* write/read/lseek/fallocate */
	unsigned mode; /* mkdir/mknod/create (default 0755/0644), setattr */
	unsigned long long rdev; /* mknod */
	bool has_mode, has_uid, has_gid, has_size;
	unsigned uid, gid;   /* new objects' owner; setattr */
	long long size;      /* setattr */
	int atime_set, mtime_set; /* enum sbx_batch_time */
	long long atime_s, atime_ns, mtime_s, mtime_ns;
	bool excl, truncate, append, datasync;
	/* write, setattr: the inode number the path must still name (0:
	 * any); another one answers ESTALE. */
	uint64_t ino;
	unsigned flags;      /* rename: RENAME_*; setxattr: XATTR_* */
	int fmode;           /* fallocate: FALLOC_FL_* */
	int whence;          /* lseek: SEEK_DATA or SEEK_HOLE */
};

struct sbx_batch {
	struct sbx_batch_op *ops;
	size_t n;
	bool stop_on_error;
};

/* "mkdir" for SBX_BATCH_MKDIR; "?" for anything else. */
const char *sbx_batch_kind_name(int kind);
/* The kind named `name`, or 0. */
int sbx_batch_kind_from_name(const char *name);

/*
 * Decode op number `index` (for messages: "ops[3] (mkdir): ...") from the
 * JSON value `o` into `op` (zeroed first).  Never fails as a whole: a bad
 * op gets op->rc / op->msg.  Release with sbx_batch_op_fini().
 */
void sbx_batch_op_decode(struct sbx_batch_op *op, const struct cJSON *o,
			 size_t index);
void sbx_batch_op_fini(struct sbx_batch_op *op);

/*
 * Encode `op` (a valid one: kind set, rc 0) as its JSON object.  Only the
 * fields its kind uses, optional ones when their has_* flag (or a
 * non-default value) says so.  Returns a new object.
 */
struct cJSON *sbx_batch_op_encode(const struct sbx_batch_op *op);

/*
 * Decode a whole request body of `len` bytes.  -EINVAL when it is not a
 * JSON object with an "ops" array (or "stop_on_error" is not a boolean),
 * -EFBIG beyond SBX_PROTO_MAX_BATCH ops.  *out freed with sbx_batch_free().
 */
SBX_WUR int sbx_batch_decode(const char *body, size_t len,
			     struct sbx_batch **out);
void sbx_batch_free(struct sbx_batch *b);

/*
 * The request document {"ops":[...]} for `n` ops (and "stop_on_error"
 * when set).  Returns a new object.
 */
struct cJSON *sbx_batch_encode(const struct sbx_batch_op *ops, size_t n,
			       bool stop_on_error);

/*
 * The client's side of the answer {"results":[r0, r1, ...]}: check that
 * it holds `n` results and detach result `i`, an object, into *out (caller
 * deletes), leaving a null in its place: results may be taken in any
 * order, each once (a second take is -EPROTO).  An op that failed returns its errno with the agent's message
 * (sbx_proto_error_from_json, prefixed by `context`); a malformed answer
 * -EPROTO.  *out is set only on success.
 */
SBX_WUR int sbx_batch_result_take(struct cJSON *answer, size_t n, size_t i,
				  const char *context, struct cJSON **out);

#endif
