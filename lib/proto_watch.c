/* Watch frames on the wire; see sbx/proto_watch.h and docs/protocol.md. */
#include "config.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/proto_watch.h"

/* Largest integer a JSON double carries exactly. */
#define JSON_INT_MAX 9007199254740992.0

static const char *const kind_names[] = {
	[SBX_WATCH_HELLO] = "hello",	     [SBX_WATCH_ENTRY] = "entry",
	[SBX_WATCH_DATA] = "data",	     [SBX_WATCH_ATTR] = "attr",
	[SBX_WATCH_OVERFLOW] = "overflow", [SBX_WATCH_HEARTBEAT] = "heartbeat",
};

#define NKINDS (sizeof(kind_names) / sizeof(kind_names[0]))

const char *sbx_watch_kind_name(int kind)
{
	return kind > 0 && (size_t)kind < NKINDS ? kind_names[kind] : NULL;
}

static void put_u64(cJSON *o, const char *key, uint64_t v)
{
	if (!cJSON_AddNumberToObject(o, key, (double)v))
		abort();
}

cJSON *sbx_watch_frame_encode(const struct sbx_watch_frame *f)
{
	cJSON *h = cJSON_CreateObject();

	if (!h)
		abort();
	if (f->kind != SBX_WATCH_HEARTBEAT)
		put_u64(h, "seq", f->seq);
	sbx_json_set_str(h, "kind", sbx_watch_kind_name(f->kind));
	switch (f->kind) {
	case SBX_WATCH_HELLO:
		sbx_json_set_str(h, "boot_id", f->boot_id ? f->boot_id : "");
		put_u64(h, "watch_seq", f->watch_seq);
		break;
	case SBX_WATCH_ENTRY:
		if (f->ino && f->ino <= (1ULL << 53))
			put_u64(h, "ino", f->ino);
		if (f->from && *f->from)
			sbx_json_set_str(h, "from", f->from);
		/* fall through */
	case SBX_WATCH_DATA:
	case SBX_WATCH_ATTR:
		sbx_json_set_str(h, "path", f->path ? f->path : "");
		break;
	case SBX_WATCH_HEARTBEAT:
		put_u64(h, "watch_seq", f->watch_seq);
		break;
	default:
		break;
	}
	return h;
}

/* An integer in [0, 2^53] at `key`. */
static bool get_u64(const cJSON *hdr, const char *key, uint64_t *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(hdr, key);

	if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) ||
	    v->valuedouble > JSON_INT_MAX)
		return false;
	*out = (uint64_t)v->valuedouble;
	return true;
}

int sbx_watch_frame_decode(const cJSON *hdr, struct sbx_watch_frame *out)
{
	const char *kind = sbx_json_str(hdr, "kind");
	const char *path;
	int k = 0;

	memset(out, 0, sizeof(*out));
	for (size_t i = 1; kind && i < NKINDS; i++)
		if (!strcmp(kind, kind_names[i]))
			k = (int)i;
	switch (k) {
	case SBX_WATCH_OTHER:
		return 0; /* kinds of later versions */
	case SBX_WATCH_HELLO:
		out->boot_id = sbx_json_str(hdr, "boot_id");
		if (!out->boot_id ||
		    !get_u64(hdr, "watch_seq", &out->watch_seq))
			return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					     "watch: malformed hello");
		/* "seq" is informational here (older agents may omit it) */
		if (!get_u64(hdr, "seq", &out->seq))
			out->seq = 0;
		out->kind = k;
		return 0;
	case SBX_WATCH_HEARTBEAT:
		/* Without a usable watch_seq it says nothing. */
		if (get_u64(hdr, "watch_seq", &out->watch_seq))
			out->kind = k;
		return 0;
	default:
		break;
	}
	if (!get_u64(hdr, "seq", &out->seq))
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "watch: %s event without a valid \"seq\"",
				     kind);
	out->kind = k;
	if (k == SBX_WATCH_OVERFLOW)
		return 0;
	path = sbx_json_str(hdr, "path");
	if (!path || path[0] == '/' || (k == SBX_WATCH_ENTRY && !*path))
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "watch: %s event with a bad \"path\"",
				     kind);
	out->path = path;
	if (k == SBX_WATCH_ENTRY) {
		const char *slash = strrchr(path, '/');

		out->name = slash ? slash + 1 : path;
		if (!*out->name)
			return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					     "watch: entry event for \"%s\"",
					     path);
		if (!get_u64(hdr, "ino", &out->ino))
			out->ino = 0;
		out->from = sbx_json_str(hdr, "from");
		if (out->from && (!*out->from || out->from[0] == '/'))
			out->from = NULL;
	}
	return 0;
}
