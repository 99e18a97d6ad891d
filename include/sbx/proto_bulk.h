/*
 * Directory entries and GET /v1/fs/bulk frames (docs/protocol.md, "Bulk"),
 * encoded by the agent (agent/handlers_bulk.c, handlers_fs.c) and decoded
 * by the remote provider (providers/remote/).
 *
 * An entry {"name":N,"st":[...]} is the element of /v1/fs/list's
 * "entries", of a batch list result and of a bulk directory frame.
 *
 * Pure functions over cJSON; no I/O, no threads.  Decoders take untrusted
 * input and fail with -EPROTO (class SBX_ERR_PROTO) and a message.
 * Strings and arrays a decoder hands out are borrowed from the header.
 */
#ifndef SBX_PROTO_BULK_H
#define SBX_PROTO_BULK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "sbx/error.h"

struct cJSON;

/* ---- entries ------------------------------------------------------------- */

/* {"name":name,"st":[...]}.  Returns a new object. */
struct cJSON *sbx_proto_entry_encode(const char *name, const struct stat *st);

/*
 * Decode an entry: a non-empty name without '/' and a valid stat.
 * *name_out is borrowed from `e`.  Returns 0 or -EPROTO.
 */
SBX_WUR int sbx_proto_entry_decode(const struct cJSON *e,
				   const char **name_out, struct stat *st);

/* ---- bulk frames ----------------------------------------------------------- */

enum sbx_bulk_frame_kind {
	SBX_BULK_FRAME_OTHER = 0, /* a record of a later version: ignore */
	SBX_BULK_FRAME_DIR, /* {"dir","st","entries",["more"],["continued"]} */
	SBX_BULK_FRAME_DIR_ERROR, /* {"dir","error":{"errno","message"}} */
	SBX_BULK_FRAME_FILE,	  /* {"file","st","len"} + the content */
	SBX_BULK_FRAME_END,	  /* {"end":true,"watch_seq"} */
};

struct sbx_bulk_frame {
	int kind;               /* enum sbx_bulk_frame_kind */
	const char *path;       /* DIR, DIR_ERROR: "dir"; FILE: "file" */
	struct stat st;         /* DIR, FILE */
	const struct cJSON
		*entries;	/* DIR: the array (sbx_proto_entry_decode) */
	bool more, continued;	/* DIR */
	int error;              /* DIR_ERROR: negative errno */
	const char *message;    /* DIR_ERROR */
	uint64_t watch_seq;     /* END (0 when absent) */
};

/*
 * Decode a frame header; `len` is the payload's length (a FILE's must
 * equal its st_size).  Returns 0 or -EPROTO.
 */
SBX_WUR int sbx_bulk_frame_decode(const struct cJSON *hdr, size_t len,
				  struct sbx_bulk_frame *out);

/*
 * Encode `f` (kind not OTHER).  A DIR frame copies f->entries (NULL: an
 * empty array); a FILE frame carries "len" = st_size.  Returns a new
 * object for sbx_frame_encode().
 */
struct cJSON *sbx_bulk_frame_encode(const struct sbx_bulk_frame *f);

/*
 * Building a DIR frame entry by entry (the agent sizes frames as it goes):
 * sbx_bulk_frame_encode() of a DIR frame with entries NULL, then
 * sbx_bulk_dir_add() per entry.
 */
void sbx_bulk_dir_add(struct cJSON *hdr, const char *name,
		      const struct stat *st);

#endif
