/* The sbx-agent wire protocol; see sbx/proto.h and docs/protocol.md. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/buf.h"
#include "sbx/json.h"
#include "sbx/proto.h"
#include "sbx/xmalloc.h"

/* ---- stat ---------------------------------------------------------------- */

/* Field order of the stat array (docs/protocol.md, "Encodings"). */
enum {
	ST_INO,
	ST_MODE,
	ST_NLINK,
	ST_UID,
	ST_GID,
	ST_RDEV,
	ST_SIZE,
	ST_BLOCKS,
	ST_ATIME_S,
	ST_ATIME_NS,
	ST_MTIME_S,
	ST_MTIME_NS,
	ST_CTIME_S,
	ST_CTIME_NS,
	ST_DEV,
	ST_FIELDS,
};

/* Largest integer a JSON double carries exactly. */
#define JSON_INT_MAX 9007199254740992.0

cJSON *sbx_proto_u64_to_json(uint64_t v)
{
	char s[24];

	snprintf(s, sizeof(s), "%" PRIu64, v);
	return cJSON_CreateString(s);
}

cJSON *sbx_proto_stat_to_json(const struct stat *st)
{
	cJSON *a = cJSON_CreateArray();
	double v[ST_FIELDS] = {
		[ST_MODE] = st->st_mode,
		[ST_NLINK] = (double)st->st_nlink,
		[ST_UID] = st->st_uid,
		[ST_GID] = st->st_gid,
		[ST_RDEV] = (double)st->st_rdev,
		[ST_SIZE] = (double)st->st_size,
		[ST_BLOCKS] = (double)st->st_blocks,
		[ST_ATIME_S] = (double)st->st_atim.tv_sec,
		[ST_ATIME_NS] = (double)st->st_atim.tv_nsec,
		[ST_MTIME_S] = (double)st->st_mtim.tv_sec,
		[ST_MTIME_NS] = (double)st->st_mtim.tv_nsec,
		[ST_CTIME_S] = (double)st->st_ctim.tv_sec,
		[ST_CTIME_NS] = (double)st->st_ctim.tv_nsec,
	};

	if (!a)
		abort();
	for (int i = 0; i < ST_FIELDS; i++) {
		cJSON *item;

		if (i == ST_INO)
			item = sbx_proto_u64_to_json(st->st_ino);
		else if (i == ST_DEV)
			item = sbx_proto_u64_to_json(st->st_dev);
		else
			item = cJSON_CreateNumber(v[i]);
		if (!item)
			abort();
		cJSON_AddItemToArray(a, item);
	}
	return a;
}

static int bad_field(const char *what, const char *field)
{
	return sbx_error_set(SBX_ERR_PROTO, -EPROTO, "%s: bad field \"%s\"",
			     what, field);
}

int sbx_proto_u64_from_json(const cJSON *item, uint64_t *out)
{
	const char *s;
	uint64_t v = 0;

	if (!cJSON_IsString(item) || !item->valuestring)
		return -1;
	s = item->valuestring;
	if (!*s || strlen(s) > 20)
		return -1;
	for (; *s; s++) {
		unsigned d;

		if (*s < '0' || *s > '9')
			return -1;
		d = (unsigned)(*s - '0');
		if (v > (UINT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

/* An integral JSON number within [lo, hi]. */
static int parse_int(const cJSON *item, double lo, double hi, double *out)
{
	double d;

	if (!cJSON_IsNumber(item))
		return -1;
	d = item->valuedouble;
	/* No floor(): libsbx does not link libm.  |d| <= 2^53 fits int64. */
	if (!isfinite(d) || d < lo || d > hi || d != (double)(int64_t)d)
		return -1;
	*out = d;
	return 0;
}

int sbx_proto_stat_from_json(const cJSON *j, struct stat *st)
{
	static const char *const names[ST_FIELDS] = {
		"ino",	    "mode",	"nlink",    "uid",	"gid",
		"rdev",	    "size",	"blocks",   "atime_s",	"atime_ns",
		"mtime_s",  "mtime_ns", "ctime_s",  "ctime_ns", "dev",
	};
	/* Bounds per field: ids and modes are 32-bit, sizes non-negative. */
	static const double lo[ST_FIELDS] = {
		[ST_ATIME_S] = -JSON_INT_MAX,
		[ST_MTIME_S] = -JSON_INT_MAX,
		[ST_CTIME_S] = -JSON_INT_MAX,
	};
	static const double hi[ST_FIELDS] = {
		[ST_MODE] = 4294967295.0,      [ST_NLINK] = JSON_INT_MAX,
		[ST_UID] = 4294967295.0,       [ST_GID] = 4294967295.0,
		[ST_RDEV] = JSON_INT_MAX,      [ST_SIZE] = JSON_INT_MAX,
		[ST_BLOCKS] = JSON_INT_MAX,    [ST_ATIME_S] = JSON_INT_MAX,
		[ST_ATIME_NS] = 999999999.0,   [ST_MTIME_S] = JSON_INT_MAX,
		[ST_MTIME_NS] = 999999999.0,   [ST_CTIME_S] = JSON_INT_MAX,
		[ST_CTIME_NS] = 999999999.0,
	};
	double v[ST_FIELDS] = { 0 };
	uint64_t ino = 0, dev = 0;
	const cJSON *item;
	int i = 0;

	memset(st, 0, sizeof(*st));
	/* More fields than we know are allowed: additive protocol changes. */
	if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) < ST_FIELDS)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "stat: expected an array of %d fields",
				     ST_FIELDS);
	cJSON_ArrayForEach(item, j)
	{
		if (i >= ST_FIELDS)
			break;
		if (i == ST_INO) {
			if (sbx_proto_u64_from_json(item, &ino) < 0)
				return bad_field("stat", names[i]);
		} else if (i == ST_DEV) {
			if (sbx_proto_u64_from_json(item, &dev) < 0)
				return bad_field("stat", names[i]);
		} else if (parse_int(item, lo[i], hi[i], &v[i]) < 0) {
			return bad_field("stat", names[i]);
		}
		i++;
	}
	st->st_ino = (ino_t)ino;
	st->st_dev = (dev_t)dev;
	st->st_mode = (mode_t)v[ST_MODE];
	st->st_nlink = (nlink_t)v[ST_NLINK];
	st->st_uid = (uid_t)v[ST_UID];
	st->st_gid = (gid_t)v[ST_GID];
	st->st_rdev = (dev_t)v[ST_RDEV];
	st->st_size = (off_t)v[ST_SIZE];
	st->st_blocks = (blkcnt_t)v[ST_BLOCKS];
	st->st_atim.tv_sec = (time_t)v[ST_ATIME_S];
	st->st_atim.tv_nsec = (long)v[ST_ATIME_NS];
	st->st_mtim.tv_sec = (time_t)v[ST_MTIME_S];
	st->st_mtim.tv_nsec = (long)v[ST_MTIME_NS];
	st->st_ctim.tv_sec = (time_t)v[ST_CTIME_S];
	st->st_ctim.tv_nsec = (long)v[ST_CTIME_NS];
	st->st_blksize = 4096;
	return 0;
}

/* Field names of the statfs object (docs/protocol.md, "Files"). */
#define STATVFS_FIELDS(X)                                                      \
	X(bsize, f_bsize)                                                      \
	X(frsize, f_frsize)                                                    \
	X(blocks, f_blocks)                                                    \
	X(bfree, f_bfree)                                                      \
	X(bavail, f_bavail)                                                    \
	X(files, f_files)                                                      \
	X(ffree, f_ffree)                                                      \
	X(namemax, f_namemax)

cJSON *sbx_proto_statvfs_to_json(const struct statvfs *sv)
{
	cJSON *o = cJSON_CreateObject();

	if (!o)
		abort();
#define X(key, field)                                                          \
	if (!cJSON_AddNumberToObject(o, #key, (double)sv->field))              \
		abort();
	STATVFS_FIELDS(X)
#undef X
	return o;
}

int sbx_proto_statvfs_from_json(const cJSON *j, struct statvfs *sv)
{
	double d;

	memset(sv, 0, sizeof(*sv));
	if (!cJSON_IsObject(j))
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "statfs: expected an object");
#define X(key, field)                                                          \
	if (parse_int(cJSON_GetObjectItemCaseSensitive(j, #key), 0,            \
		      JSON_INT_MAX, &d) < 0)                                   \
		return bad_field("statfs", #key);                              \
	sv->field = (__typeof__(sv->field))d;
	STATVFS_FIELDS(X)
#undef X
	sv->f_favail = sv->f_ffree;
	return 0;
}

/* ---- errors -------------------------------------------------------------- */

cJSON *sbx_proto_error_to_json(int code, const char *message)
{
	const char *name = sbx_errno_name(code < 0 ? -code : code);
	cJSON *root = cJSON_CreateObject();
	cJSON *e = cJSON_CreateObject();

	if (!root || !e)
		abort();
	if (!name)
		name = "EIO";
	if (!message || !*message)
		message = strerror(code < 0 ? -code : (code ? code : EIO));
	if (!cJSON_AddStringToObject(e, "errno", name) ||
	    !cJSON_AddStringToObject(e, "message", message))
		abort();
	cJSON_AddItemToObject(root, "error", e);
	return root;
}

int sbx_proto_error_from_json(const cJSON *j, const char *context)
{
	const cJSON *e, *name, *msg;
	int err;

	if (!context)
		context = "agent";
	if (!cJSON_IsObject(j))
		return 0;
	e = cJSON_GetObjectItemCaseSensitive(j, "error");
	if (!e) {
		/* The bare {"errno":..,"message":..} object itself. */
		if (!cJSON_IsString(
			    cJSON_GetObjectItemCaseSensitive(j, "errno")))
			return 0;
		e = j;
	}
	if (!cJSON_IsObject(e))
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "%s: malformed error object", context);
	name = cJSON_GetObjectItemCaseSensitive(e, "errno");
	msg = cJSON_GetObjectItemCaseSensitive(e, "message");
	err = cJSON_IsString(name) ? sbx_errno_from_name(name->valuestring)
				   : 0;
	if (err <= 0)
		err = EIO;
	return sbx_error_set(SBX_ERR_REMOTE, -err, "%s: %s", context,
			     cJSON_IsString(msg) && msg->valuestring
				     ? msg->valuestring
				     : strerror(err));
}

int sbx_proto_http_status(int code)
{
	switch (code < 0 ? -code : code) {
	case 0:
		return 200;
	case EINVAL:
	case EPROTO:
		return 400;
	case EACCES:
	case EPERM:
		return 403;
	case ENOENT:
		return 404;
	case EEXIST:
	case ENOTEMPTY:
	case EBUSY:
		return 409;
	case EFBIG:
	case E2BIG:
	case EMSGSIZE:
		return 413;
	default:
		return 500;
	}
}

/* ---- frames --------------------------------------------------------------- */

int sbx_frame_encode(struct sbx_buf *out, const cJSON *hdr, const void *data,
		     size_t len)
{
	size_t old = out->len;
	unsigned char be[4];
	char *text;
	size_t n;
	int rc;

	text = cJSON_PrintUnformatted(hdr);
	if (!text)
		abort();
	n = strlen(text);
	if (n > SBX_PROTO_MAX_FRAME_JSON || len > SBX_PROTO_MAX_FRAME_DATA) {
		cJSON_free(text);
		return sbx_error_set(SBX_ERR_PROTO, -EFBIG,
				     "frame too large (%zu JSON, %zu data)", n,
				     len);
	}
	be[0] = (unsigned char)(n >> 24);
	be[1] = (unsigned char)(n >> 16);
	be[2] = (unsigned char)(n >> 8);
	be[3] = (unsigned char)n;
	rc = sbx_buf_add(out, be, 4);
	if (rc == 0)
		rc = sbx_buf_add(out, text, n);
	if (rc == 0 && len)
		rc = sbx_buf_add(out, data, len);
	cJSON_free(text);
	if (rc < 0) {
		/* All or nothing: a half frame would corrupt the stream. */
		out->len = old;
		if (out->data)
			out->data[old] = '\0';
	}
	return rc;
}

int sbx_frame_encode_data(struct sbx_buf *out, cJSON *hdr, const void *data,
			  size_t len)
{
	cJSON *n = cJSON_CreateNumber((double)len);

	if (!n)
		abort();
	sbx_json_set_take(hdr, "len", n);
	return sbx_frame_encode(out, hdr, data, len);
}

void sbx_frame_parser_init(struct sbx_frame_parser *p, sbx_frame_cb cb,
			   void *payload)
{
	memset(p, 0, sizeof(*p));
	p->cb = cb;
	p->payload = payload;
}

void sbx_frame_parser_fini(struct sbx_frame_parser *p)
{
	if (!p)
		return;
	free(p->buf);
	p->buf = NULL;
	p->len = p->cap = 0;
}

static int proto_err(const char *what)
{
	return sbx_error_set(SBX_ERR_PROTO, -EPROTO, "frame stream: %s", what);
}

/*
 * Try to decode one frame at the start of `b` (`have` bytes).  On a
 * complete frame: calls the callback, sets *consumed.  On a partial one:
 * *consumed = 0 and *need = the total size needed so far known (it grows
 * as the header becomes readable).
 */
static int try_frame(struct sbx_frame_parser *p, const unsigned char *b,
		     size_t have, size_t *consumed, size_t *need)
{
	const char *end = NULL;
	const cJSON *lenj;
	size_t hlen, dlen = 0;
	cJSON *hdr;
	double d;
	int rc = 0;

	*consumed = 0;
	if (p->ended)
		return proto_err("data after the end record");
	if (have < 4) {
		*need = 4;
		return 0;
	}
	hlen = (size_t)b[0] << 24 | (size_t)b[1] << 16 | (size_t)b[2] << 8 |
	       (size_t)b[3];
	if (hlen < 2 || hlen > SBX_PROTO_MAX_FRAME_JSON)
		return proto_err("bad header length");
	if (have < 4 + hlen) {
		*need = 4 + hlen;
		return 0;
	}
	hdr = cJSON_ParseWithLengthOpts((const char *)b + 4, hlen, &end, 0);
	if (!hdr)
		return proto_err("header is not JSON");
	/* Only whitespace may follow the object inside the record. */
	while (end && end < (const char *)b + 4 + hlen &&
	       (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t'))
		end++;
	if (!cJSON_IsObject(hdr) || end != (const char *)b + 4 + hlen) {
		cJSON_Delete(hdr);
		return proto_err("header is not a JSON object");
	}
	lenj = cJSON_GetObjectItemCaseSensitive(hdr, "len");
	if (lenj) {
		if (parse_int(lenj, 0, SBX_PROTO_MAX_FRAME_DATA, &d) < 0) {
			cJSON_Delete(hdr);
			return proto_err("bad \"len\"");
		}
		dlen = (size_t)d;
	}
	if (have < 4 + hlen + dlen) {
		cJSON_Delete(hdr);
		*need = 4 + hlen + dlen;
		return 0;
	}
	*consumed = 4 + hlen + dlen;
	if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(hdr, "end")))
		p->ended = true;
	if (p->cb)
		rc = p->cb(hdr, dlen ? b + 4 + hlen : NULL, dlen, p->payload);
	cJSON_Delete(hdr);
	return rc;
}

static void stash(struct sbx_frame_parser *p, const void *data, size_t n)
{
	if (p->len + n > p->cap) {
		size_t c = p->cap ? p->cap : 256;

		while (c < p->len + n)
			c *= 2;
		p->buf = sbx_xrealloc(p->buf, c);
		p->cap = c;
	}
	memcpy(p->buf + p->len, data, n);
	p->len += n;
}

int sbx_frame_parser_feed(struct sbx_frame_parser *p, const void *data,
			  size_t n)
{
	const unsigned char *in = data;
	size_t consumed, need = 0;
	int rc;

	if (n == 0)
		return 0;
	/*
	 * Finish a frame split across feeds first, taking only the bytes it
	 * needs, so the pending buffer stays bounded by one frame.
	 */
	while (p->len) {
		rc = try_frame(p, p->buf, p->len, &consumed, &need);
		if (consumed)
			p->len = 0;
		if (rc)
			return rc;
		if (consumed)
			break;
		if (n == 0)
			return 0;
		size_t take = need - p->len < n ? need - p->len : n;

		stash(p, in, take);
		in += take;
		n -= take;
	}
	/* Then decode straight from the caller's bytes, without copying. */
	while (n) {
		rc = try_frame(p, in, n, &consumed, &need);
		if (rc)
			return rc;
		if (!consumed) {
			stash(p, in, n);
			return 0;
		}
		in += consumed;
		n -= consumed;
	}
	return 0;
}

/* ---- paths ---------------------------------------------------------------- */

/*
 * The one path normaliser.  Components are split on '/'; empty ones
 * (leading, trailing, repeated '/') and "." are dropped; ".." follows the
 * caller's rule (sbx/proto.h).
 */
int sbx_proto_path_norm(const char *in, int dotdot, char **out)
{
	size_t n = strlen(in), o = 0;
	char *res;

	*out = NULL;
	if (n >= PATH_MAX)
		return sbx_error_set(SBX_ERR_PROTO, -ENAMETOOLONG,
				     "path too long (%zu bytes)", n);
	res = sbx_xmalloc(n + 1);
	for (size_t i = 0; i < n;) {
		size_t j = i;

		while (j < n && in[j] != '/')
			j++;
		size_t clen = j - i;
		bool up = clen == 2 && in[i] == '.' && in[i + 1] == '.';

		if (clen == 0 || (clen == 1 && in[i] == '.')) {
			/* empty (repeated '/') or "." */
		} else if (up && dotdot == SBX_PATH_DOTDOT_REFUSE) {
			free(res);
			return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
					     "path \"%s\": \"..\" not allowed",
					     in);
		} else if (up && dotdot == SBX_PATH_DOTDOT_RESOLVE) {
			if (o == 0) {
				free(res);
				return sbx_error_set(SBX_ERR_PROTO, -EXDEV,
						     "\"..\" in \"%s\" leaves "
						     "the starting directory",
						     in);
			}
			/* drop the last component and its '/' */
			while (o && res[o - 1] != '/')
				o--;
			if (o)
				o--;
		} else {
			if (o)
				res[o++] = '/';
			memcpy(res + o, in + i, clen);
			o += clen;
		}
		i = j + 1;
	}
	res[o] = '\0';
	*out = res;
	return 0;
}

int sbx_proto_path_clean(const char *in, char **out)
{
	return sbx_proto_path_norm(in, SBX_PATH_DOTDOT_REFUSE, out);
}

char *sbx_proto_path_join(const char *dir, const char *name)
{
	if (!dir || !*dir)
		return sbx_xstrdup(name ? name : "");
	if (!name || !*name)
		return sbx_xstrdup(dir);
	return sbx_xasprintf("%s/%s", dir, name);
}

char *sbx_proto_query_escape(const char *s)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t n = strlen(s), o = 0;
	char *res = sbx_xmalloc(3 * n + 1);

	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		    (c >= '0' && c <= '9') || c == '-' || c == '.' ||
		    c == '_' || c == '~') {
			res[o++] = (char)c;
		} else {
			res[o++] = '%';
			res[o++] = hex[c >> 4];
			res[o++] = hex[c & 15];
		}
	}
	res[o] = '\0';
	return res;
}

/* ---- signals -------------------------------------------------------------- */

#define S(x) { x, #x }
static const struct {
	int sig;
	const char *name;
} signals[] = {
	S(SIGHUP),  S(SIGINT),	  S(SIGQUIT), S(SIGILL),    S(SIGTRAP),
	S(SIGABRT), S(SIGBUS),	  S(SIGFPE),  S(SIGKILL),   S(SIGUSR1),
	S(SIGSEGV), S(SIGUSR2),	  S(SIGPIPE), S(SIGALRM),   S(SIGTERM),
	S(SIGCHLD), S(SIGCONT),	  S(SIGSTOP), S(SIGTSTP),   S(SIGTTIN),
	S(SIGTTOU), S(SIGURG),	  S(SIGXCPU), S(SIGXFSZ),   S(SIGVTALRM),
	S(SIGPROF), S(SIGWINCH), S(SIGIO),   S(SIGSYS),
};
#undef S

const char *sbx_proto_signal_name(int sig)
{
	for (size_t i = 0; i < sizeof(signals) / sizeof(signals[0]); i++)
		if (signals[i].sig == sig)
			return signals[i].name;
	return NULL;
}

int sbx_proto_signal_from_name(const char *name)
{
	if (!name)
		return 0;
	for (size_t i = 0; i < sizeof(signals) / sizeof(signals[0]); i++) {
		const char *n = signals[i].name;

		/* "SIGINT" or "INT"; numbers differ by arch, so none. */
		if (strcmp(n, name) == 0 || strcmp(n + 3, name) == 0)
			return signals[i].sig;
	}
	return 0;
}

/* ---- base64 --------------------------------------------------------------- */

static const char b64[] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *sbx_proto_base64_encode(const void *data, size_t len)
{
	const unsigned char *in = data;
	char *out = sbx_xmalloc((len + 2) / 3 * 4 + 1);
	size_t o = 0, i;

	for (i = 0; i + 2 < len; i += 3) {
		uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 |
			     in[i + 2];

		out[o++] = b64[v >> 18];
		out[o++] = b64[(v >> 12) & 63];
		out[o++] = b64[(v >> 6) & 63];
		out[o++] = b64[v & 63];
	}
	if (i < len) {
		uint32_t v = (uint32_t)in[i] << 16;

		if (i + 1 < len)
			v |= (uint32_t)in[i + 1] << 8;
		out[o++] = b64[v >> 18];
		out[o++] = b64[(v >> 12) & 63];
		out[o++] = i + 1 < len ? b64[(v >> 6) & 63] : '=';
		out[o++] = '=';
	}
	out[o] = '\0';
	return out;
}

static int b64_val(unsigned char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+')
		return 62;
	if (c == '/')
		return 63;
	return -1;
}

int sbx_proto_base64_decode(const char *text, unsigned char **out,
			    size_t *len_out)
{
	size_t n = strlen(text), o = 0, pad = 0;
	unsigned char *res;
	uint32_t acc = 0;
	int bits = 0;

	*out = NULL;
	*len_out = 0;
	while (n > 0 && text[n - 1] == '=' && pad < 2) {
		n--;
		pad++;
	}
	if ((pad && (n + pad) % 4) || n % 4 == 1)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "bad base64 length");
	res = sbx_xmalloc(n / 4 * 3 + 3);
	for (size_t i = 0; i < n; i++) {
		int v = b64_val((unsigned char)text[i]);

		if (v < 0) {
			free(res);
			return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					     "bad base64 character at %zu", i);
		}
		acc = acc << 6 | (uint32_t)v;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			res[o++] = (unsigned char)(acc >> bits);
			acc &= (1u << bits) - 1;
		}
	}
	*out = res;
	*len_out = o;
	return 0;
}
