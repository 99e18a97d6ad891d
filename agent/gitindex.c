/* SHA-1, the git index refresh and git names; see gitindex.h. */
#include "config.h"

#include <errno.h>
#include <string.h>

#include "gitindex.h"

/* ---- SHA-1 --------------------------------------------------------------- */

static uint32_t rol(uint32_t x, unsigned n)
{
	return (x << n) | (x >> (32 - n));
}

static void sha1_block(struct agent_sha1 *c, const unsigned char *p)
{
	uint32_t w[80], a, b, d, e, f, k, t, cc;

	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
		       (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
	for (int i = 16; i < 80; i++)
		w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
	a = c->h[0];
	b = c->h[1];
	cc = c->h[2];
	d = c->h[3];
	e = c->h[4];
	for (int i = 0; i < 80; i++) {
		if (i < 20) {
			f = (b & cc) | (~b & d);
			k = 0x5a827999;
		} else if (i < 40) {
			f = b ^ cc ^ d;
			k = 0x6ed9eba1;
		} else if (i < 60) {
			f = (b & cc) | (b & d) | (cc & d);
			k = 0x8f1bbcdc;
		} else {
			f = b ^ cc ^ d;
			k = 0xca62c1d6;
		}
		t = rol(a, 5) + f + e + k + w[i];
		e = d;
		d = cc;
		cc = rol(b, 30);
		b = a;
		a = t;
	}
	c->h[0] += a;
	c->h[1] += b;
	c->h[2] += cc;
	c->h[3] += d;
	c->h[4] += e;
}

void agent_sha1_init(struct agent_sha1 *c)
{
	static const uint32_t iv[5] = { 0x67452301, 0xefcdab89, 0x98badcfe,
					0x10325476, 0xc3d2e1f0 };

	memcpy(c->h, iv, sizeof(iv));
	c->len = 0;
	c->n = 0;
}

void agent_sha1_update(struct agent_sha1 *c, const void *data, size_t len)
{
	const unsigned char *p = data;

	c->len += len;
	if (c->n) {
		size_t take = 64 - c->n < len ? 64 - c->n : len;

		memcpy(c->blk + c->n, p, take);
		c->n += take;
		p += take;
		len -= take;
		if (c->n < 64)
			return;
		sha1_block(c, c->blk);
		c->n = 0;
	}
	for (; len >= 64; p += 64, len -= 64)
		sha1_block(c, p);
	memcpy(c->blk, p, len);
	c->n = len;
}

void agent_sha1_final(struct agent_sha1 *c, unsigned char out[20])
{
	uint64_t bits = c->len * 8;

	c->blk[c->n++] = 0x80;
	if (c->n > 56) {
		memset(c->blk + c->n, 0, 64 - c->n);
		sha1_block(c, c->blk);
		c->n = 0;
	}
	memset(c->blk + c->n, 0, 56 - c->n);
	for (int i = 0; i < 8; i++)
		c->blk[56 + i] = (unsigned char)(bits >> (56 - 8 * i));
	sha1_block(c, c->blk);
	for (int i = 0; i < 5; i++) {
		out[4 * i] = (unsigned char)(c->h[i] >> 24);
		out[4 * i + 1] = (unsigned char)(c->h[i] >> 16);
		out[4 * i + 2] = (unsigned char)(c->h[i] >> 8);
		out[4 * i + 3] = (unsigned char)c->h[i];
	}
}

/* ---- the index ----------------------------------------------------------- */

/*
 * Index format (git's Documentation/gitformat-index.txt), versions 2 and
 * 3: "DIRC", version, entry count (all 32-bit big endian); entries; then
 * extensions; then the SHA-1 of everything before it.  An entry: ctime
 * s/ns, mtime s/ns, dev, ino, mode, uid, gid, size (ten 32-bit fields),
 * the 20-byte object id, 16-bit flags (bit 14: extended flags follow, v3;
 * bits 12-13: stage; low 12 bits: name length, 0xfff when longer), the
 * name, NUL padding to a multiple of 8 bytes (at least one NUL).
 */
#define E_CTIME 0
#define E_CTIME_NS 4
#define E_MTIME 8
#define E_MTIME_NS 12
#define E_DEV 16
#define E_INO 20
#define E_MODE 24
#define E_UID 28
#define E_GID 32
#define E_SIZE 36
#define E_OID 40
#define E_FLAGS 60
#define E_FIXED 62
#define HASH_LEN 20

static uint32_t get32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static void put32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)(v >> 24);
	p[1] = (unsigned char)(v >> 16);
	p[2] = (unsigned char)(v >> 8);
	p[3] = (unsigned char)v;
}

static int bad(const char *why, size_t off)
{
	return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
			     "git index: %s at byte %zu", why, off);
}

int agent_gitindex_refresh(unsigned char *buf, size_t len,
			   agent_gitindex_stat_fn stat_fn, void *payload,
			   struct agent_gitindex_result *out)
{
	struct agent_gitindex_result res = { 0 };
	unsigned char sum[HASH_LEN];
	struct agent_sha1 c;
	uint32_t version, n;
	size_t off = 12, end;
	/* Set in a first pass, applied in a second: a malformed image stays
	 * untouched. */
	struct stat st;

	memset(out, 0, sizeof(*out));
	if (len < 12 + HASH_LEN || memcmp(buf, "DIRC", 4) != 0)
		return bad("no index header", 0);
	version = get32(buf + 4);
	n = get32(buf + 8);
	if (version == 4)
		return sbx_error_set(SBX_ERR_PROTO, -EOPNOTSUPP,
				     "git index: version 4 is not supported");
	if (version != 2 && version != 3)
		return bad("unknown version", 4);
	end = len - HASH_LEN;
	/* Pass 1: check the shape of every entry. */
	for (uint32_t i = 0; i < n; i++) {
		size_t fixed = E_FIXED, name, elen;
		uint16_t flags;

		if (off + E_FIXED > end)
			return bad("entry past the end", off);
		flags = (uint16_t)(buf[off + E_FLAGS] << 8 |
				   buf[off + E_FLAGS + 1]);
		if (flags & 0x4000) {
			if (version < 3)
				return bad("extended flags in a version 2 "
					   "index", off);
			fixed += 2;
		}
		if (off + fixed > end)
			return bad("entry past the end", off);
		name = strnlen((const char *)buf + off + fixed,
			       end - off - fixed);
		if (off + fixed + name >= end)
			return bad("unterminated name", off);
		if ((flags & 0xfff) != 0xfff && (flags & 0xfff) != name)
			return bad("name length mismatch", off);
		elen = (fixed + name + 8) & ~(size_t)7;
		if (off + elen > end)
			return bad("entry padding past the end", off);
		off += elen;
	}
	/* What follows must be extensions (4-byte name, 4-byte size). */
	for (size_t x = off; x < end;) {
		uint32_t sz;

		if (x + 8 > end)
			return bad("truncated extension", x);
		sz = get32(buf + x + 4);
		if (sz > end - x - 8)
			return bad("extension past the end", x);
		x += 8 + sz;
	}
	/* Pass 2: refresh. */
	off = 12;
	res.entries = n;
	for (uint32_t i = 0; i < n; i++) {
		static const unsigned char zero[E_OID] = { 0 };
		unsigned char *e = buf + off;
		uint16_t flags = (uint16_t)(e[E_FLAGS] << 8 | e[E_FLAGS + 1]);
		size_t fixed = E_FIXED + ((flags & 0x4000) ? 2 : 0);
		const char *path = (const char *)e + fixed;
		size_t name = strlen(path);
		uint32_t mode = get32(e + E_MODE);
		bool want_reg = (mode & 0170000) == 0100000;
		bool want_lnk = (mode & 0170000) == 0120000;

		off += (fixed + name + 8) & ~(size_t)7;
		/* Only what the client vouches for: stage 0, no
		 * assume-valid, a file or symlink, stat data all zero. */
		if ((flags & 0x3000) || (flags & 0x8000) ||
		    (!want_reg && !want_lnk) ||
		    memcmp(e, zero, E_MODE) != 0 ||
		    memcmp(e + E_UID, zero, E_OID - E_UID) != 0)
			continue;
		if (stat_fn(path, &st, payload) < 0) {
			sbx_error_clear();
			continue;
		}
		if ((want_reg && !S_ISREG(st.st_mode)) ||
		    (want_lnk && !S_ISLNK(st.st_mode)) ||
		    (want_reg && !(mode & 0100) != !(st.st_mode & S_IXUSR)))
			continue;
		put32(e + E_CTIME, (uint32_t)st.st_ctim.tv_sec);
		put32(e + E_CTIME_NS, (uint32_t)st.st_ctim.tv_nsec);
		put32(e + E_MTIME, (uint32_t)st.st_mtim.tv_sec);
		put32(e + E_MTIME_NS, (uint32_t)st.st_mtim.tv_nsec);
		put32(e + E_DEV, (uint32_t)st.st_dev);
		put32(e + E_INO, (uint32_t)st.st_ino);
		put32(e + E_UID, (uint32_t)st.st_uid);
		put32(e + E_GID, (uint32_t)st.st_gid);
		put32(e + E_SIZE, (uint32_t)st.st_size);
		if ((int64_t)st.st_mtim.tv_sec > res.max_mtime_s)
			res.max_mtime_s = (int64_t)st.st_mtim.tv_sec;
		res.refreshed++;
	}
	agent_sha1_init(&c);
	agent_sha1_update(&c, buf, end);
	agent_sha1_final(&c, sum);
	memcpy(buf + end, sum, HASH_LEN);
	*out = res;
	return 0;
}

/* ---- names --------------------------------------------------------------- */

static bool hex(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

bool agent_git_oid_hex_ok(const char *s, size_t len)
{
	if (len != 40)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!hex(s[i]))
			return false;
	return true;
}

bool agent_git_loose_name_ok(const char *name)
{
	if (strlen(name) != 41 || name[2] != '/')
		return false;
	for (int i = 0; i < 41; i++)
		if (i != 2 && !hex(name[i]))
			return false;
	return true;
}

bool agent_git_pack_name_ok(const char *name)
{
	static const char *const ext[] = { ".pack", ".idx", ".keep" };
	const char *p = name;

	if (strncmp(p, "pack/pack-", 10) != 0)
		return false;
	p += 10;
	for (int i = 0; i < 40; i++)
		if (!hex(p[i]))
			return false;
	p += 40;
	for (size_t i = 0; i < sizeof(ext) / sizeof(ext[0]); i++)
		if (strcmp(p, ext[i]) == 0)
			return true;
	return false;
}

bool agent_git_ref_name_ok(const char *name)
{
	size_t n = strlen(name);

	if (strncmp(name, "refs/", 5) != 0 || n > 1024 ||
	    name[n - 1] == '/' || name[n - 1] == '.' ||
	    strstr(name, "..") || strstr(name, "//") || strstr(name, "@{") ||
	    strstr(name, "/."))
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)name[i];

		if (c < 0x20 || c == 0x7f || strchr(" ~^:?*[\\", c))
			return false;
	}
	return true;
}
