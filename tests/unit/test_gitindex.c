/* Unit tests: agent/gitindex.c (SHA-1, the index refresh, git names). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "sbx/buf.h"
#include "sbx/error.h"

#include "gitindex.h"

static void hex(const unsigned char *d, char *out)
{
	for (int i = 0; i < 20; i++)
		sprintf(out + 2 * i, "%02x", d[i]);
}

static void sha1_of(const void *p, size_t n, char *out)
{
	struct agent_sha1 c;
	unsigned char d[20];

	agent_sha1_init(&c);
	agent_sha1_update(&c, p, n);
	agent_sha1_final(&c, d);
	hex(d, out);
}

static void test_sha1_vectors(void **state)
{
	char out[41];
	struct agent_sha1 c;
	unsigned char d[20];
	char *a = malloc(1000000);

	(void)state;
	sha1_of("", 0, out);
	assert_string_equal(out, "da39a3ee5e6b4b0d3255bfef95601890afd80709");
	sha1_of("abc", 3, out);
	assert_string_equal(out, "a9993e364706816aba3e25717850c26c9cd0d89d");
	sha1_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56,
		out);
	assert_string_equal(out, "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
	/* a million 'a', fed in uneven pieces */
	memset(a, 'a', 1000000);
	agent_sha1_init(&c);
	for (size_t off = 0, step = 1; off < 1000000;
	     off += step, step = step * 7 % 997 + 1)
		agent_sha1_update(&c, a + off,
				  off + step > 1000000 ? 1000000 - off : step);
	agent_sha1_final(&c, d);
	hex(d, out);
	assert_string_equal(out, "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
	free(a);
}

/* ---- an index image built by hand ---------------------------------------- */

static void put32(struct sbx_buf *b, uint32_t v)
{
	unsigned char p[4] = { (unsigned char)(v >> 24),
			       (unsigned char)(v >> 16),
			       (unsigned char)(v >> 8), (unsigned char)v };

	assert_int_equal(sbx_buf_add(b, p, 4), 0);
}

/* One entry: stat fields all `stat_val` except mtime = `mtime`. */
static void entry(struct sbx_buf *b, const char *path, uint32_t mode,
		  uint32_t mtime, uint16_t stage)
{
	static const char zero[8];
	size_t n = strlen(path), len = (62 + n + 8) & ~(size_t)7;
	unsigned char oid[20];
	uint16_t flags = (uint16_t)(n | (stage << 12));

	put32(b, 0);
	put32(b, 0);
	put32(b, mtime);
	put32(b, 0);
	for (int i = 0; i < 2; i++)
		put32(b, 0); /* dev, ino */
	put32(b, mode);
	for (int i = 0; i < 3; i++)
		put32(b, 0); /* uid, gid, size */
	memset(oid, 0xab, sizeof(oid));
	assert_int_equal(sbx_buf_add(b, oid, 20), 0);
	assert_int_equal(sbx_buf_add(b, (char[]){ (char)(flags >> 8),
						  (char)flags }, 2), 0);
	assert_int_equal(sbx_buf_add(b, path, n), 0);
	assert_int_equal(sbx_buf_add(b, zero, len - 62 - n), 0);
}

static void finish(struct sbx_buf *b)
{
	struct agent_sha1 c;
	unsigned char d[20];

	/* an extension, kept as it is */
	assert_int_equal(sbx_buf_add(b, "TREE", 4), 0);
	put32(b, 3);
	assert_int_equal(sbx_buf_add(b, "xyz", 3), 0);
	agent_sha1_init(&c);
	agent_sha1_update(&c, b->data, b->len);
	agent_sha1_final(&c, d);
	assert_int_equal(sbx_buf_add(b, d, 20), 0);
}

static void header(struct sbx_buf *b, uint32_t version, uint32_t n)
{
	assert_int_equal(sbx_buf_add(b, "DIRC", 4), 0);
	put32(b, version);
	put32(b, n);
}

struct fake_fs {
	const char *path;
	mode_t mode;
	int calls;
};

static int fake_stat(const char *path, struct stat *st, void *payload)
{
	struct fake_fs *fs = payload;

	fs->calls++;
	for (; fs->path; fs++) {
		if (strcmp(fs->path, path) == 0) {
			memset(st, 0, sizeof(*st));
			st->st_mode = fs->mode;
			st->st_ctim.tv_sec = 1700000001;
			st->st_ctim.tv_nsec = 5;
			st->st_mtim.tv_sec = 1700000000;
			st->st_mtim.tv_nsec = 7;
			st->st_dev = 0x801;
			st->st_ino = 4242;
			st->st_uid = 1000;
			st->st_gid = 100;
			st->st_size = 123;
			return 0;
		}
	}
	return -ENOENT;
}

static uint32_t at32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | p[3];
}

/* Offset of the n-th entry (entries of known names). */
static const unsigned char *nth(const struct sbx_buf *b, int n)
{
	const unsigned char *p = (const unsigned char *)b->data + 12;

	while (n--) {
		size_t name = strlen((const char *)p + 62);

		p += (62 + name + 8) & ~(size_t)7;
	}
	return p;
}

static void test_refresh(void **state)
{
	struct fake_fs fs[] = {
		{ "a.txt", S_IFREG | 0644, 0 },
		{ "b.sh", S_IFREG | 0755, 0 },
		{ "c.sh", S_IFREG | 0644, 0 },   /* lost its x bit */
		{ "dir/link", S_IFLNK | 0777, 0 },
		{ "e.txt", S_IFDIR | 0755, 0 },  /* not a file any more */
		{ NULL, 0, 0 },
	};
	struct agent_gitindex_result res;
	struct agent_sha1 c;
	unsigned char d[20];
	struct sbx_buf b;
	const unsigned char *e;

	(void)state;
	sbx_buf_init(&b, 1 << 20);
	header(&b, 2, 7);
	entry(&b, "a.txt", 0100644, 0, 0);
	entry(&b, "b.sh", 0100755, 1, 0);      /* vouched dirty */
	entry(&b, "c.sh", 0100755, 0, 0);
	entry(&b, "dir/link", 0120000, 0, 0);
	entry(&b, "e.txt", 0100644, 0, 0);
	entry(&b, "f.txt", 0100644, 0, 0);     /* missing */
	entry(&b, "sub", 0160000, 0, 0);       /* a submodule */
	finish(&b);

	assert_int_equal(agent_gitindex_refresh((unsigned char *)b.data, b.len,
						fake_stat, fs, &res),
			 0);
	assert_int_equal(res.entries, 7);
	assert_int_equal(res.refreshed, 2);
	assert_int_equal(res.max_mtime_s, 1700000000);
	e = nth(&b, 0); /* a.txt: filled */
	assert_int_equal(at32(e + 0), 1700000001);
	assert_int_equal(at32(e + 4), 5);
	assert_int_equal(at32(e + 8), 1700000000);
	assert_int_equal(at32(e + 12), 7);
	assert_int_equal(at32(e + 16), 0x801);
	assert_int_equal(at32(e + 20), 4242);
	assert_int_equal(at32(e + 24), 0100644);
	assert_int_equal(at32(e + 28), 1000);
	assert_int_equal(at32(e + 32), 100);
	assert_int_equal(at32(e + 36), 123);
	e = nth(&b, 1); /* b.sh: kept */
	assert_int_equal(at32(e + 8), 1);
	assert_int_equal(at32(e + 20), 0);
	e = nth(&b, 2); /* c.sh: mode differs */
	assert_int_equal(at32(e + 20), 0);
	e = nth(&b, 3); /* the symlink: filled */
	assert_int_equal(at32(e + 20), 4242);
	e = nth(&b, 4); /* e.txt: a directory now */
	assert_int_equal(at32(e + 20), 0);
	/* the checksum covers the new content */
	agent_sha1_init(&c);
	agent_sha1_update(&c, b.data, b.len - 20);
	agent_sha1_final(&c, d);
	assert_memory_equal(d, b.data + b.len - 20, 20);
	assert_memory_equal(b.data + b.len - 31, "TREE", 4);
	sbx_buf_fini(&b);
}

static void test_refresh_refuses(void **state)
{
	struct fake_fs fs[] = { { NULL, 0, 0 } };
	struct agent_gitindex_result res;
	struct sbx_buf b;
	char *copy;

	(void)state;
	/* version 4 */
	sbx_buf_init(&b, 1 << 20);
	header(&b, 4, 0);
	finish(&b);
	assert_int_equal(agent_gitindex_refresh((unsigned char *)b.data, b.len,
						fake_stat, fs, &res),
			 -EOPNOTSUPP);
	sbx_buf_fini(&b);
	/* entries past the end: unchanged, no stat at all */
	sbx_buf_init(&b, 1 << 20);
	header(&b, 2, 3);
	entry(&b, "a.txt", 0100644, 0, 0);
	finish(&b);
	copy = malloc(b.len);
	memcpy(copy, b.data, b.len);
	assert_int_equal(agent_gitindex_refresh((unsigned char *)b.data, b.len,
						fake_stat, fs, &res),
			 -EINVAL);
	assert_memory_equal(copy, b.data, b.len);
	assert_int_equal(fs[0].calls, 0);
	free(copy);
	sbx_buf_fini(&b);
	/* not an index */
	assert_int_equal(agent_gitindex_refresh((unsigned char *)"DIRX0000"
						"000000000000000000000000",
						32, fake_stat, fs, &res),
			 -EINVAL);
	sbx_error_clear();
}

static void test_names(void **state)
{
	(void)state;
	assert_true(agent_git_loose_name_ok(
		"ab/cdef0123456789abcdef0123456789abcdef01"));
	assert_false(agent_git_loose_name_ok(
		"ab/cdef0123456789abcdef0123456789abcdef0"));
	assert_false(agent_git_loose_name_ok(
		"AB/cdef0123456789abcdef0123456789abcdef01"));
	assert_false(agent_git_loose_name_ok(
		"../cdef0123456789abcdef0123456789abcdef01"));
	assert_true(agent_git_pack_name_ok(
		"pack/pack-0123456789abcdef0123456789abcdef01234567.idx"));
	assert_true(agent_git_pack_name_ok(
		"pack/pack-0123456789abcdef0123456789abcdef01234567.pack"));
	assert_false(agent_git_pack_name_ok(
		"pack/pack-0123456789abcdef0123456789abcdef01234567.idx/x"));
	assert_false(agent_git_pack_name_ok("pack/../../x"));
	assert_true(agent_git_ref_name_ok("refs/heads/sbx/t1"));
	assert_false(agent_git_ref_name_ok("refs/heads/../../config"));
	assert_false(agent_git_ref_name_ok("HEAD"));
	assert_false(agent_git_ref_name_ok("refs/heads/a b"));
	assert_false(agent_git_ref_name_ok("refs/heads/x/"));
	assert_false(agent_git_ref_name_ok("refs/heads/.hidden"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sha1_vectors),
		cmocka_unit_test(test_refresh),
		cmocka_unit_test(test_refresh_refuses),
		cmocka_unit_test(test_names),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
