/*
 * Directory entries and bulk frames on the wire; see sbx/proto_bulk.h
 * and docs/protocol.md ("Bulk").
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/proto.h"
#include "sbx/proto_bulk.h"

/* Largest integer a JSON double carries exactly. */
#define JSON_INT_MAX 9007199254740992.0

/* ---- entries ------------------------------------------------------------- */

cJSON *sbx_proto_entry_encode(const char *name, const struct stat *st)
{
	cJSON *o = cJSON_CreateObject();

	if (!o)
		abort();
	sbx_json_set_str(o, "name", name);
	cJSON_AddItemToObject(o, "st", sbx_proto_stat_to_json(st));
	return o;
}

int sbx_proto_entry_decode(const cJSON *e, const char **name_out,
			   struct stat *st)
{
	const char *name = sbx_json_str(e, "name");

	*name_out = NULL;
	if (!name || !*name || strchr(name, '/'))
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "entry: bad \"name\"");
	if (sbx_proto_stat_from_json(cJSON_GetObjectItemCaseSensitive(e, "st"),
				     st) < 0)
		return sbx_error_prefix(-EPROTO, "entry \"%s\"", name);
	*name_out = name;
	return 0;
}

/* ---- frames -------------------------------------------------------------- */

static bool flag(const cJSON *hdr, const char *key)
{
	return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(hdr, key));
}

static int get_st(const cJSON *hdr, const char *what, const char *path,
		  struct stat *st)
{
	if (sbx_proto_stat_from_json(cJSON_GetObjectItemCaseSensitive(hdr, "s"
									   "t"),
				     st) < 0)
		return sbx_error_prefix(-EPROTO, "bulk %s %s", what, path);
	return 0;
}

static int decode_error(const cJSON *hdr, struct sbx_bulk_frame *out)
{
	const cJSON *e = cJSON_GetObjectItemCaseSensitive(hdr, "error");
	const char *name = sbx_json_str(e, "errno");
	int err = name ? sbx_errno_from_name(name) : 0;

	if (!cJSON_IsObject(e) || !name)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "bulk %s: malformed error", out->path);
	out->kind = SBX_BULK_FRAME_DIR_ERROR;
	out->error = err > 0 ? -err : -EIO;
	out->message = sbx_json_str(e, "message");
	return 0;
}

int sbx_bulk_frame_decode(const cJSON *hdr, size_t len,
			  struct sbx_bulk_frame *out)
{
	const char *dir = sbx_json_str(hdr, "dir");
	const char *file = sbx_json_str(hdr, "file");

	memset(out, 0, sizeof(*out));
	if (dir) {
		out->path = dir;
		if (cJSON_GetObjectItemCaseSensitive(hdr, "error"))
			return decode_error(hdr, out);
		out->entries = cJSON_GetObjectItemCaseSensitive(hdr, "entries");
		if (!cJSON_IsArray(out->entries))
			return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					     "bulk %s: no \"entries\"", dir);
		if (get_st(hdr, "dir", dir, &out->st) < 0)
			return -EPROTO;
		out->more = flag(hdr, "more");
		out->continued = flag(hdr, "continued");
		out->kind = SBX_BULK_FRAME_DIR;
		return 0;
	}
	if (file) {
		out->path = file;
		if (get_st(hdr, "file", file, &out->st) < 0)
			return -EPROTO;
		if (out->st.st_size < 0 || (uint64_t)out->st.st_size != len)
			return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					     "bulk %s: %zu bytes for a file "
					     "of %lld", file, len,
					     (long long)out->st.st_size);
		out->kind = SBX_BULK_FRAME_FILE;
		return 0;
	}
	if (flag(hdr, "end")) {
		const cJSON *ws = cJSON_GetObjectItemCaseSensitive(hdr,
								  "watch_seq");

		if (cJSON_IsNumber(ws) && ws->valuedouble >= 0 &&
		    ws->valuedouble <= JSON_INT_MAX)
			out->watch_seq = (uint64_t)ws->valuedouble;
		out->kind = SBX_BULK_FRAME_END;
	}
	return 0; /* records we do not know */
}

void sbx_bulk_dir_add(cJSON *hdr, const char *name, const struct stat *st)
{
	cJSON *arr = cJSON_GetObjectItemCaseSensitive(hdr, "entries");

	cJSON_AddItemToArray(arr, sbx_proto_entry_encode(name, st));
}

cJSON *sbx_bulk_frame_encode(const struct sbx_bulk_frame *f)
{
	cJSON *h;

	if (f->kind == SBX_BULK_FRAME_DIR_ERROR) {
		h = sbx_proto_error_to_json(f->error, f->message);
		sbx_json_set_str(h, "dir", f->path ? f->path : "");
		return h;
	}
	h = cJSON_CreateObject();
	if (!h)
		abort();
	switch (f->kind) {
	case SBX_BULK_FRAME_DIR:
		sbx_json_set_str(h, "dir", f->path ? f->path : "");
		cJSON_AddItemToObject(h, "st", sbx_proto_stat_to_json(&f->st));
		if (f->continued)
			cJSON_AddBoolToObject(h, "continued", 1);
		cJSON_AddItemToObject(h, "entries",
				      f->entries ? cJSON_Duplicate(f->entries,
								   true)
						 : cJSON_CreateArray());
		if (f->more)
			cJSON_AddBoolToObject(h, "more", 1);
		break;
	case SBX_BULK_FRAME_FILE:
		sbx_json_set_str(h, "file", f->path ? f->path : "");
		cJSON_AddItemToObject(h, "st", sbx_proto_stat_to_json(&f->st));
		cJSON_AddNumberToObject(h, "len", (double)f->st.st_size);
		break;
	case SBX_BULK_FRAME_END:
		cJSON_AddBoolToObject(h, "end", 1);
		cJSON_AddNumberToObject(h, "watch_seq", (double)f->watch_seq);
		break;
	default:
		break;
	}
	return h;
}
