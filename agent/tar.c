/*
 * POSIX tar writer and incremental reader (tar.h).  Formats: IEEE Std
 * 1003.1-2001 "pax" (ustar blocks plus 'x' extended headers), GNU tar's
 * extensions (old GNU magic, 'L'/'K' long names, base-256 numbers) and
 * v7 for reading.
 */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sbx/xmalloc.h"

#include "tar.h"

/* ustar header field offsets and widths */
#define F_NAME 0, 100
#define F_MODE 100, 8
#define F_UID 108, 8
#define F_GID 116, 8
#define F_SIZE 124, 12
#define F_MTIME 136, 12
#define F_CHKSUM 148, 8
#define O_TYPE 156
#define F_LINK 157, 100
#define O_MAGIC 257
#define F_PREFIX 345, 155

/* Extended records ('x', 'g', 'L', 'K') larger than this are refused. */
#define MAX_META (1024 * 1024)

/* ---- writer ----------------------------------------------------------------- */

size_t agent_tar_padding(uint64_t size)
{
	return (size_t)((AGENT_TAR_BLOCK - size % AGENT_TAR_BLOCK) %
			AGENT_TAR_BLOCK);
}

/* Octal with a NUL terminator in a field of `w` bytes; false if too big. */
static bool put_octal(unsigned char *h, size_t off, size_t w, uint64_t v)
{
	char tmp[32];

	if (w - 1 < 22 && v >> (3 * (w - 1)))
		return false;
	snprintf(tmp, sizeof(tmp), "%0*" PRIo64, (int)(w - 1), v);
	memcpy(h + off, tmp, w - 1);
	h[off + w - 1] = '\0';
	return true;
}

static void put_str(unsigned char *h, size_t off, size_t w, const char *s)
{
	size_t n = strlen(s);

	memcpy(h + off, s, n < w ? n : w);
}

static void put_checksum(unsigned char *h)
{
	unsigned sum = 0;
	char tmp[16];

	memset(h + 148, ' ', 8);
	for (size_t i = 0; i < AGENT_TAR_BLOCK; i++)
		sum += h[i];
	snprintf(tmp, sizeof(tmp), "%06o", sum);
	memcpy(h + 148, tmp, 6);
	h[154] = '\0';
	h[155] = ' ';
}

/* One "LEN key=value\n" record; LEN counts itself. */
static void pax_record(struct sbx_buf *p, const char *key, const char *val)
{
	size_t base = strlen(key) + strlen(val) + 3, len = base + 1;

	while (len != base + (size_t)snprintf(NULL, 0, "%zu", len))
		len = base + (size_t)snprintf(NULL, 0, "%zu", len);
	/* The cap of `p` is SIZE_MAX: cannot fail. */
	if (sbx_buf_addf(p, "%zu %s=%s\n", len, key, val) < 0)
		abort();
}

/* "s.nnnnnnnnn" (negative times as -s.fraction). */
static void fmt_time(char *out, size_t n, int64_t s, long ns)
{
	if (ns == 0)
		snprintf(out, n, "%" PRId64, s);
	else if (s < 0)
		snprintf(out, n, "-%" PRId64 ".%09ld", -(s + 1),
			 1000000000L - ns);
	else
		snprintf(out, n, "%" PRId64 ".%09ld", s, ns);
}

/* Split `name` into ustar prefix + name; false when it cannot be. */
static bool split_name(const char *name, size_t len, size_t *cut)
{
	if (len <= 100) {
		*cut = 0;
		return true;
	}
	for (size_t i = len - 1; i > 0; i--) {
		if (name[i] != '/')
			continue;
		if (len - i - 1 > 100)
			return false; /* further left only gets longer */
		if (i <= 155 && len - i - 1 > 0) {
			*cut = i;
			return true;
		}
	}
	return false;
}

static int add_block(struct sbx_buf *out, const unsigned char *h)
{
	return sbx_buf_add(out, h, AGENT_TAR_BLOCK);
}

int agent_tar_header(struct sbx_buf *out, const struct agent_tar_entry *e)
{
	unsigned char h[AGENT_TAR_BLOCK];
	struct sbx_buf pax, full;
	uint64_t size = e->type == AGENT_TAR_REG ? e->size : 0;
	const char *link = e->linkname ? e->linkname : "";
	size_t cut = 0, nlen;
	char tmp[64];
	int rc = 0;

	if (!e->name || !*e->name)
		return sbx_error_set(SBX_ERR_INTERNAL, -EINVAL,
				     "tar: an entry without a name");
	sbx_buf_init(&pax, SIZE_MAX);
	sbx_buf_init(&full, SIZE_MAX);
	if (sbx_buf_adds(&full, e->name) < 0 ||
	    (e->type == AGENT_TAR_DIR &&
	     full.data[full.len - 1] != '/' && sbx_buf_adds(&full, "/") < 0))
		abort();
	nlen = full.len;

	memset(h, 0, sizeof(h));
	if (!split_name(full.data, nlen, &cut)) {
		pax_record(&pax, "path", full.data);
		put_str(h, F_NAME, full.data);
	} else if (cut) {
		memcpy(h + 345, full.data, cut);
		memcpy(h, full.data + cut + 1, nlen - cut - 1);
	} else {
		memcpy(h, full.data, nlen);
	}
	if (strlen(link) > 100)
		pax_record(&pax, "linkpath", link);
	put_str(h, F_LINK, link);
	put_octal(h, F_MODE, e->mode & 07777);
	if (!put_octal(h, F_UID, e->uid)) {
		snprintf(tmp, sizeof(tmp), "%" PRIu64, e->uid);
		pax_record(&pax, "uid", tmp);
		put_octal(h, F_UID, 0);
	}
	if (!put_octal(h, F_GID, e->gid)) {
		snprintf(tmp, sizeof(tmp), "%" PRIu64, e->gid);
		pax_record(&pax, "gid", tmp);
		put_octal(h, F_GID, 0);
	}
	if (!put_octal(h, F_SIZE, size)) {
		snprintf(tmp, sizeof(tmp), "%" PRIu64, size);
		pax_record(&pax, "size", tmp);
		put_octal(h, F_SIZE, 0);
	}
	if (e->mtime_s < 0 || e->mtime_ns != 0 ||
	    !put_octal(h, F_MTIME, (uint64_t)e->mtime_s)) {
		fmt_time(tmp, sizeof(tmp), e->mtime_s, e->mtime_ns);
		pax_record(&pax, "mtime", tmp);
		if (e->mtime_s < 0)
			put_octal(h, F_MTIME, 0);
		else if (!put_octal(h, F_MTIME, (uint64_t)e->mtime_s))
			put_octal(h, F_MTIME, 077777777777ULL);
	}
	h[O_TYPE] = (unsigned char)e->type;
	memcpy(h + O_MAGIC, "ustar\0" "00", 8);
	put_checksum(h);

	if (pax.len) {
		unsigned char x[AGENT_TAR_BLOCK];
		const char *base = strrchr(e->name, '/');
		static const unsigned char zero[AGENT_TAR_BLOCK];
		char xname[101];

		base = base && base[1] ? base + 1 : e->name;
		snprintf(xname, sizeof(xname), "PaxHeaders/%s", base);
		memset(x, 0, sizeof(x));
		put_str(x, F_NAME, xname);
		put_octal(x, F_MODE, 0644);
		put_octal(x, F_UID, 0);
		put_octal(x, F_GID, 0);
		put_octal(x, F_SIZE, pax.len);
		memcpy(x + 136, h + 136, 12); /* the entry's (clamped) mtime */
		x[O_TYPE] = 'x';
		memcpy(x + O_MAGIC, "ustar\0" "00", 8);
		put_checksum(x);
		rc = add_block(out, x);
		if (rc == 0)
			rc = sbx_buf_add(out, pax.data, pax.len);
		if (rc == 0)
			rc = sbx_buf_add(out, zero, agent_tar_padding(pax.len));
	}
	if (rc == 0)
		rc = add_block(out, h);
	sbx_buf_fini(&pax);
	sbx_buf_fini(&full);
	return rc;
}

int agent_tar_end(struct sbx_buf *out)
{
	static const unsigned char zero[2 * AGENT_TAR_BLOCK];

	return sbx_buf_add(out, zero, sizeof(zero));
}

/* ---- reader ----------------------------------------------------------------- */

enum rstate { R_HEADER, R_DATA, R_META, R_PAD, R_END, R_ERROR };

struct agent_tar_reader {
	agent_tar_entry_cb on_entry;
	agent_tar_data_cb on_data;
	void *payload;
	enum rstate state;
	int err;
	unsigned char blk[AGENT_TAR_BLOCK];
	size_t blen;
	uint64_t off;       /* bytes consumed */
	uint64_t blk_off;   /* offset of the block being parsed */
	uint64_t remaining; /* data or meta bytes left in this member */
	size_t pad;
	unsigned zeros;     /* consecutive zero blocks */
	char meta_type;
	struct sbx_buf meta;
	/* What the extended records said about the next entry. */
	bool pending;       /* an extended record was read */
	uint64_t first_off; /* where the first of them started */
	char *x_path, *x_link, *l_name, *k_link;
	bool x_size_set, x_mtime_set, x_uid_set, x_gid_set;
	uint64_t x_size, x_uid, x_gid;
	int64_t x_mtime_s;
	long x_mtime_ns;
	char *cur;          /* the current entry's name, for messages */
};

static int bad(struct agent_tar_reader *r, uint64_t off, const char *fmt, ...)
	SBX_PRINTF(3, 4);

static int bad(struct agent_tar_reader *r, uint64_t off, const char *fmt, ...)
{
	char msg[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	r->state = R_ERROR;
	r->err = sbx_error_set(SBX_ERR_PROTO, -EINVAL,
			       "bad tar archive at offset %" PRIu64 ": %s", off,
			       msg);
	return r->err;
}

struct agent_tar_reader *agent_tar_reader_new(agent_tar_entry_cb on_entry,
					      agent_tar_data_cb on_data,
					      void *payload)
{
	struct agent_tar_reader *r = sbx_xcalloc(1, sizeof(*r));

	r->on_entry = on_entry;
	r->on_data = on_data;
	r->payload = payload;
	sbx_buf_init(&r->meta, MAX_META);
	return r;
}

static void clear_pending(struct agent_tar_reader *r)
{
	free(r->x_path);
	free(r->x_link);
	free(r->l_name);
	free(r->k_link);
	r->x_path = r->x_link = r->l_name = r->k_link = NULL;
	r->x_size_set = r->x_mtime_set = r->x_uid_set = r->x_gid_set = false;
	r->pending = false;
}

void agent_tar_reader_free(struct agent_tar_reader *r)
{
	if (!r)
		return;
	clear_pending(r);
	sbx_buf_fini(&r->meta);
	free(r->cur);
	free(r);
}

uint64_t agent_tar_offset(const struct agent_tar_reader *r)
{
	return r->off;
}

bool agent_tar_ended(const struct agent_tar_reader *r)
{
	return r->state == R_END;
}

/*
 * A numeric field: octal (leading spaces allowed, ended by NUL or space)
 * or GNU base-256 (first byte 0x80 positive, 0xff negative).
 */
static bool get_num(const unsigned char *h, size_t off, size_t w,
		    int64_t *out)
{
	const unsigned char *p = h + off, *end = p + w;
	uint64_t v = 0;

	if (*p & 0x80) {
		bool neg = *p == 0xff;

		if (*p != 0x80 && *p != 0xff)
			return false;
		for (const unsigned char *q = p + 1; q < end; q++) {
			if ((size_t)(end - q) > 8) {
				if (*q != (neg ? 0xff : 0))
					return false;
				continue;
			}
			v = (v << 8) | *q;
		}
		if (neg) {
			if (w - 1 < 8)
				v |= ~0ULL << (8 * (w - 1));
			*out = (int64_t)v;
			return *out < 0;
		}
		if (v > INT64_MAX)
			return false;
		*out = (int64_t)v;
		return true;
	}
	while (p < end && *p == ' ')
		p++;
	for (; p < end && *p >= '0' && *p <= '7'; p++) {
		if (v >> 60)
			return false;
		v = v * 8 + (uint64_t)(*p - '0');
	}
	if (p < end && *p != ' ' && *p != '\0')
		return false;
	*out = (int64_t)v;
	return true;
}

/* A string field, NUL-terminated or filling the field. */
static char *get_str(const unsigned char *h, size_t off, size_t w)
{
	size_t n = strnlen((const char *)h + off, w);

	return sbx_xstrndup((const char *)h + off, n);
}

static bool parse_u64(const char *s, uint64_t *out)
{
	char *end;

	if (*s < '0' || *s > '9')
		return false;
	errno = 0;
	*out = strtoull(s, &end, 10);
	return !errno && !*end;
}

/* "[-]S[.F]" into seconds and nanoseconds. */
static bool parse_time(const char *s, int64_t *sec, long *nsec)
{
	bool neg = *s == '-';
	uint64_t whole = 0;
	long ns = 0, scale = 100000000L;
	const char *p = s + neg;

	if (*p < '0' || *p > '9')
		return false;
	for (; *p >= '0' && *p <= '9'; p++) {
		if (whole > (uint64_t)INT64_MAX / 10)
			return false;
		whole = whole * 10 + (uint64_t)(*p - '0');
	}
	if (*p == '.') {
		for (p++; *p >= '0' && *p <= '9'; p++) {
			ns += (long)(*p - '0') * scale;
			scale /= 10;
		}
	}
	if (*p)
		return false;
	if (whole > (uint64_t)INT64_MAX - 1)
		return false;
	if (neg && ns) {
		*sec = -(int64_t)whole - 1;
		*nsec = 1000000000L - ns;
	} else {
		*sec = neg ? -(int64_t)whole : (int64_t)whole;
		*nsec = ns;
	}
	return true;
}

/* Apply the records of a pax extended header ('x'; 'g' is checked only). */
static int parse_pax(struct agent_tar_reader *r, bool global)
{
	const char *p = r->meta.data ? r->meta.data : "";
	size_t left = r->meta.len;

	while (left) {
		size_t len = 0, i = 0;
		const char *key, *eq, *val;
		char *v;
		bool ok = true;

		while (i < left && p[i] >= '0' && p[i] <= '9' && len < MAX_META)
			len = len * 10 + (size_t)(p[i++] - '0');
		if (i == 0 || i >= left || p[i] != ' ' || len > left ||
		    len <= i + 1 || p[len - 1] != '\n')
			return bad(r, r->first_off,
				   "malformed pax extended header");
		key = p + i + 1;
		eq = memchr(key, '=', (size_t)(p + len - 1 - key));
		if (!eq)
			return bad(r, r->first_off,
				   "pax record without '='");
		val = eq + 1;
		v = sbx_xstrndup(val, (size_t)(p + len - 1 - val));
		if (strlen(v) != (size_t)(p + len - 1 - val)) {
			free(v);
			return bad(r, r->first_off,
				   "pax record with a NUL byte");
		}
#define KEY(k) ((size_t)(eq - key) == strlen(k) && !memcmp(key, k, strlen(k)))
		if (KEY("GNU.sparse.major") || KEY("GNU.sparse.size") ||
		    KEY("GNU.sparse.map") || KEY("GNU.sparse.numblocks")) {
			free(v);
			return bad(r, r->first_off,
				   "sparse files are not supported");
		}
		if (global) {
			free(v);
		} else if (KEY("path")) {
			free(r->x_path);
			r->x_path = v;
		} else if (KEY("linkpath")) {
			free(r->x_link);
			r->x_link = v;
		} else if (KEY("size")) {
			ok = parse_u64(v, &r->x_size) &&
			     r->x_size <= (uint64_t)INT64_MAX;
			r->x_size_set = true;
			free(v);
		} else if (KEY("mtime")) {
			ok = parse_time(v, &r->x_mtime_s, &r->x_mtime_ns);
			r->x_mtime_set = true;
			free(v);
		} else if (KEY("uid")) {
			ok = parse_u64(v, &r->x_uid);
			r->x_uid_set = true;
			free(v);
		} else if (KEY("gid")) {
			ok = parse_u64(v, &r->x_gid);
			r->x_gid_set = true;
			free(v);
		} else {
			free(v); /* atime, ctime, charset, ...: not kept */
		}
#undef KEY
		if (!ok)
			return bad(r, r->first_off,
				   "bad number in a pax record");
		p += len;
		left -= len;
	}
	return 0;
}

static int meta_done(struct agent_tar_reader *r)
{
	char **slot = NULL;

	switch (r->meta_type) {
	case 'x':
		return parse_pax(r, false);
	case 'g':
		return parse_pax(r, true);
	case 'L':
		slot = &r->l_name;
		break;
	case 'K':
		slot = &r->k_link;
		break;
	default:
		return 0;
	}
	free(*slot);
	/* GNU stores the name with a trailing NUL (counted in the size). */
	*slot = sbx_xstrndup(r->meta.data ? r->meta.data : "",
			     strnlen(r->meta.data ? r->meta.data : "",
				     r->meta.len));
	return 0;
}

static int header(struct agent_tar_reader *r)
{
	const unsigned char *h = r->blk;
	struct agent_tar_entry e = { 0 };
	int64_t mode, uid, gid, size, mtime, sum;
	unsigned usum = 0;
	int ssum = 0;
	bool posix;
	char *name = NULL, *link = NULL, type;
	size_t i;
	int rc;

	for (i = 0; i < AGENT_TAR_BLOCK && !h[i]; i++)
		;
	if (i == AGENT_TAR_BLOCK) {
		if (r->pending)
			return bad(r, r->blk_off,
				   "end of archive after an extended "
				   "header");
		if (++r->zeros == 2)
			r->state = R_END;
		return 0;
	}
	/* GNU tar calls a single zero block "lone" and reads on; so do we. */
	r->zeros = 0;
	for (i = 0; i < AGENT_TAR_BLOCK; i++) {
		unsigned char c = i >= 148 && i < 156 ? ' ' : h[i];

		usum += c;
		ssum += (signed char)c;
	}
	if (!get_num(h, F_CHKSUM, &sum))
		return bad(r, r->blk_off,
			   "not a tar header (bad checksum field)");
	if (sum != (int64_t)usum && sum != (int64_t)ssum)
		return bad(r, r->blk_off, "header checksum mismatch");
	if (!get_num(h, F_MODE, &mode) || !get_num(h, F_UID, &uid) ||
	    !get_num(h, F_GID, &gid) || !get_num(h, F_SIZE, &size) ||
	    !get_num(h, F_MTIME, &mtime) || size < 0)
		return bad(r, r->blk_off, "bad number in a header field");
	posix = !memcmp(h + O_MAGIC, "ustar\0", 6);
	type = (char)h[O_TYPE];
	if (!r->pending)
		r->first_off = r->blk_off;

	if (type == 'x' || type == 'g' || type == 'L' || type == 'K') {
		if (size > MAX_META)
			return bad(r, r->blk_off,
				   "extended header larger than 1 MiB");
		r->pending = r->pending || type != 'g';
		r->meta_type = type;
		sbx_buf_reset(&r->meta);
		r->remaining = (uint64_t)size;
		r->pad = agent_tar_padding((uint64_t)size);
		r->state = R_META;
		if (size == 0) {
			rc = meta_done(r);
			if (rc < 0)
				return rc;
			r->state = R_HEADER;
		}
		return 0;
	}
	if (type == 'S' || type == 'M')
		return bad(r, r->blk_off,
			   "GNU sparse and multi-volume entries are not "
			   "supported");

	if (r->x_size_set)
		size = (int64_t)r->x_size;
	if (r->l_name)
		name = sbx_xstrdup(r->l_name);
	else if (r->x_path)
		name = sbx_xstrdup(r->x_path);
	else if (posix && h[345]) {
		char *pre = get_str(h, F_PREFIX), *nm = get_str(h, F_NAME);

		name = sbx_xasprintf("%s/%s", pre, nm);
		free(pre);
		free(nm);
	} else {
		name = get_str(h, F_NAME);
	}
	if (r->k_link)
		link = sbx_xstrdup(r->k_link);
	else if (r->x_link)
		link = sbx_xstrdup(r->x_link);
	else
		link = get_str(h, F_LINK);

	if (type == '\0' || type == '7')
		type = AGENT_TAR_REG;
	if (type == AGENT_TAR_REG && *name && name[strlen(name) - 1] == '/')
		type = AGENT_TAR_DIR; /* v7 and old GNU directories */
	if (!*name) {
		free(name);
		free(link);
		return bad(r, r->blk_off, "an entry without a name");
	}
	e.name = name;
	e.linkname = link;
	e.type = type;
	e.mode = (unsigned)mode & 07777;
	e.uid = r->x_uid_set ? r->x_uid : (uint64_t)uid;
	e.gid = r->x_gid_set ? r->x_gid : (uint64_t)gid;
	e.size = (uint64_t)size;
	if (r->x_mtime_set) {
		e.mtime_s = r->x_mtime_s;
		e.mtime_ns = r->x_mtime_ns;
	} else {
		e.mtime_s = mtime;
	}
	e.offset = r->first_off;
	clear_pending(r);
	free(r->cur);
	r->cur = name;
	rc = r->on_entry ? r->on_entry(&e, r->payload) : 0;
	free(link);
	if (rc < 0) {
		r->state = R_ERROR;
		r->err = rc;
		return rc;
	}
	r->remaining = e.size;
	r->pad = agent_tar_padding(e.size);
	r->state = e.size ? R_DATA : R_HEADER;
	return 0;
}

int agent_tar_feed(struct agent_tar_reader *r, const void *data, size_t len)
{
	const unsigned char *p = data;
	int rc;

	while (len) {
		size_t n;

		switch (r->state) {
		case R_ERROR:
			return r->err;
		case R_END:
			r->off += len;
			return 0;
		case R_HEADER:
			if (r->blen == 0)
				r->blk_off = r->off;
			n = AGENT_TAR_BLOCK - r->blen;
			n = n < len ? n : len;
			memcpy(r->blk + r->blen, p, n);
			r->blen += n;
			r->off += n;
			p += n;
			len -= n;
			if (r->blen == AGENT_TAR_BLOCK) {
				r->blen = 0;
				rc = header(r);
				if (rc < 0)
					return rc;
			}
			break;
		case R_DATA:
		case R_META:
			n = r->remaining < len ? (size_t)r->remaining : len;
			if (r->state == R_META) {
				if (sbx_buf_add(&r->meta, p, n) < 0)
					abort(); /* sized below MAX_META */
			} else if (r->on_data) {
				rc = r->on_data(p, n, r->payload);
				if (rc < 0) {
					r->state = R_ERROR;
					r->err = rc;
					return rc;
				}
			}
			r->remaining -= n;
			r->off += n;
			p += n;
			len -= n;
			if (r->remaining == 0) {
				if (r->state == R_META) {
					rc = meta_done(r);
					if (rc < 0)
						return rc;
				}
				r->state = r->pad ? R_PAD : R_HEADER;
			}
			break;
		case R_PAD:
			n = r->pad < len ? r->pad : len;
			r->pad -= n;
			r->off += n;
			p += n;
			len -= n;
			if (r->pad == 0)
				r->state = R_HEADER;
			break;
		}
	}
	return r->state == R_ERROR ? r->err : 0;
}

int agent_tar_finish(struct agent_tar_reader *r)
{
	const char *where;
	bool named = false;

	if (r->state == R_ERROR)
		return r->err;
	if (r->state == R_END ||
	    (r->state == R_HEADER && r->blen == 0 && r->zeros == 1))
		return 0;
	switch (r->state) {
	case R_DATA:
		where = "in the data of";
		named = r->cur != NULL;
		break;
	case R_PAD:
		where = "in the padding after";
		named = r->cur != NULL;
		break;
	case R_META:
		where = "in an extended header";
		break;
	default:
		where = r->blen ? "in a header block" : "before the end marker";
		break;
	}
	r->state = R_ERROR;
	r->err = sbx_error_set(SBX_ERR_PROTO, -EINVAL,
			       "truncated tar archive at offset %" PRIu64
			       " (%s%s%s%s)",
			       r->off, where, named ? " \"" : "",
			       named ? r->cur : "", named ? "\"" : "");
	return r->err;
}
