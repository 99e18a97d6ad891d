/*
 * The sbx-agent wire protocol (docs/protocol.md), defined once for both
 * ends: the agent (agent/) and the remote provider (providers/remote/).
 *
 * Pure functions over cJSON and sbx_buf; no I/O, no threads.  Every
 * decoder takes untrusted input: it checks types and bounds and fails with
 * -EPROTO (class SBX_ERR_PROTO) and a message naming the field.
 */
#ifndef SBX_PROTO_H
#define SBX_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "sbx/error.h"

struct cJSON;
struct sbx_buf;

#define SBX_PROTO_VERSION 1

#define SBX_HDR_TOKEN "X-Sbx-Token"
#define SBX_HDR_AGENT "X-Sbx-Agent"
#define SBX_HDR_SIZE "X-Sbx-Size"
#define SBX_HDR_MTIME "X-Sbx-Mtime"
#define SBX_HDR_INO "X-Sbx-Ino"

#define SBX_CT_JSON "application/json"
#define SBX_CT_OCTET "application/octet-stream"

/* Limits (docs/protocol.md, "Transport"). */
#define SBX_PROTO_MAX_HEADERS (16 * 1024)
#define SBX_PROTO_MAX_JSON_BODY (1024 * 1024)
#define SBX_PROTO_MAX_WRITE_BODY (16 * 1024 * 1024)
#define SBX_PROTO_MAX_BATCH 256
#define SBX_PROTO_MAX_FRAME_JSON (64 * 1024)
#define SBX_PROTO_MAX_FRAME_DATA (1024 * 1024)

/* ---- stat ---------------------------------------------------------------- */

/* Encode `st` as the compact stat array.  Returns a new cJSON array. */
struct cJSON *sbx_proto_stat_to_json(const struct stat *st);

/* Decode a stat array into *st (zeroed first).  -EPROTO on bad input. */
SBX_WUR int sbx_proto_stat_from_json(const struct cJSON *j, struct stat *st);

/*
 * A 64-bit unsigned value (an inode or device number) as JSON: a decimal
 * string, digits only, since a JSON number holds only 53 bits exactly.
 * from_json: -1 (no error set) when `item` is not such a string.
 */
struct cJSON *sbx_proto_u64_to_json(uint64_t v);
SBX_WUR int sbx_proto_u64_from_json(const struct cJSON *item, uint64_t *out);

/* statvfs as an object and back. */
struct cJSON *sbx_proto_statvfs_to_json(const struct statvfs *sv);
SBX_WUR int sbx_proto_statvfs_from_json(const struct cJSON *j,
					struct statvfs *sv);

/* ---- errors -------------------------------------------------------------- */

/*
 * The error body {"error":{"errno":NAME,"message":MSG}} for a negative
 * errno `code`.  Returns a new object.
 */
struct cJSON *sbx_proto_error_to_json(int code, const char *message);

/*
 * If `j` is (or contains at top level) an error object, record it with
 * sbx_error_set(SBX_ERR_REMOTE, -errno, "<context>: <message>") and return
 * the negative errno; unknown names map to -EIO.  Returns 0 when `j` holds
 * no error.
 */
int sbx_proto_error_from_json(const struct cJSON *j, const char *context);

/* HTTP status for a negative errno (docs/protocol.md, "Errors"). */
int sbx_proto_http_status(int code);

/* ---- frames --------------------------------------------------------------- */

/*
 * Append one frame to `out`: 4-byte big-endian JSON length, the JSON text
 * of `hdr`, then `len` bytes of `data` (the caller must have set "len" in
 * hdr when len > 0).  Returns 0 or -EFBIG when the buffer cap is hit.
 */
SBX_WUR int sbx_frame_encode(struct sbx_buf *out, const struct cJSON *hdr,
			     const void *data, size_t len);

/* Convenience: encode hdr (adding "len") and data in one call. */
SBX_WUR int sbx_frame_encode_data(struct sbx_buf *out, struct cJSON *hdr,
				  const void *data, size_t len);

/*
 * Incremental frame decoder for streamed responses: feed bytes as they
 * arrive; complete frames are handed to the callback.  The parser owns its
 * partial state; the callback borrows hdr (freed after it returns) and
 * data (NULL when the frame has no payload).  A callback returning
 * non-zero stops the parser and that value is returned by feed.
 */
typedef int (*sbx_frame_cb)(const struct cJSON *hdr, const void *data,
			    size_t len, void *payload);

struct sbx_frame_parser {
	unsigned char *buf; /* pending bytes */
	size_t len, cap;
	sbx_frame_cb cb;
	void *payload;
	bool ended; /* saw {"end":true} */
};

void sbx_frame_parser_init(struct sbx_frame_parser *p, sbx_frame_cb cb,
			   void *payload);
void sbx_frame_parser_fini(struct sbx_frame_parser *p);
/*
 * Consume `n` bytes.  Returns 0, the callback's non-zero value, or -EPROTO
 * for a malformed stream (oversized or invalid JSON header).
 */
int sbx_frame_parser_feed(struct sbx_frame_parser *p, const void *data,
			  size_t n);

/* ---- paths ---------------------------------------------------------------- */

/*
 * The one path normaliser of the tree.  Strips leading, trailing and
 * repeated '/' and drops "." components; "" is the root (or the starting
 * directory).  `dotdot` chooses what ".." means:
 *   SBX_PATH_DOTDOT_REFUSE   -EINVAL.  The client's rule: a protocol path
 *                            it sends never climbs (sbx_proto_path_clean).
 *   SBX_PATH_DOTDOT_KEEP     kept as a component.  The agent's rule for
 *                            client paths: confine.c resolves them beneath
 *                            the root, so "a/../b" works and "../x" is
 *                            -EXDEV there.
 *   SBX_PATH_DOTDOT_RESOLVE  removes the component before it; -EXDEV when
 *                            it would climb above the start.  For names
 *                            inside an archive, relative to its target.
 * -ENAMETOOLONG for `in` of PATH_MAX bytes or more.  Errors are class
 * SBX_ERR_PROTO.  NUL cannot occur (C string).  *out malloc'd.
 */
enum sbx_path_dotdot {
	SBX_PATH_DOTDOT_REFUSE = 0,
	SBX_PATH_DOTDOT_KEEP,
	SBX_PATH_DOTDOT_RESOLVE,
};

SBX_WUR int sbx_proto_path_norm(const char *in, int dotdot, char **out);

/* sbx_proto_path_norm(in, SBX_PATH_DOTDOT_REFUSE, out). */
SBX_WUR int sbx_proto_path_clean(const char *in, char **out);

/* Join a directory path and a name ("" + "a" → "a").  malloc'd. */
char *sbx_proto_path_join(const char *dir, const char *name);

/* Percent-encode for a query value (RFC 3986 unreserved kept). malloc'd. */
char *sbx_proto_query_escape(const char *s);

/* ---- signals -------------------------------------------------------------- */

/* "SIGINT" ↔ SIGINT for the signals the shim forwards and a few more. */
const char *sbx_proto_signal_name(int sig);
int sbx_proto_signal_from_name(const char *name); /* 0 when unknown */

/* ---- additions (lib/proto.c) ---------------------------------------------- */

/*
 * Base64 (RFC 4648, with padding) for the batch ops' "data" and "value"
 * fields.  sbx_proto_base64_encode returns a malloc'd NUL-terminated
 * string.  sbx_proto_base64_decode accepts padded or unpadded input,
 * rejects anything else with -EPROTO; *out is malloc'd (at least 1 byte,
 * so an empty result is not NULL) and *len_out its length.
 */
char *sbx_proto_base64_encode(const void *data, size_t len);
SBX_WUR int sbx_proto_base64_decode(const char *text, unsigned char **out,
				    size_t *len_out);

#endif
