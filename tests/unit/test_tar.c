/* Unit tests: agent/tar.c (pax writer, incremental reader), against GNU tar. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "sbx/buf.h"
#include "sbx/error.h"

#include "tar.h"
#include "test_helpers_i.h"

#define MAXE 64

struct got {
	char *name, *link;
	char type;
	unsigned mode;
	uint64_t uid, size, offset;
	int64_t mtime_s;
	long mtime_ns;
	struct sbx_buf data;
};

struct coll {
	struct got e[MAXE];
	size_t n;
};

static int c_entry(const struct agent_tar_entry *e, void *payload)
{
	struct coll *c = payload;
	struct got *g;

	assert_true(c->n < MAXE);
	g = &c->e[c->n++];
	g->name = strdup(e->name);
	g->link = strdup(e->linkname);
	g->type = e->type;
	g->mode = e->mode;
	g->uid = e->uid;
	g->size = e->size;
	g->offset = e->offset;
	g->mtime_s = e->mtime_s;
	g->mtime_ns = e->mtime_ns;
	sbx_buf_init(&g->data, 1 << 20);
	return 0;
}

static int c_data(const void *data, size_t len, void *payload)
{
	struct coll *c = payload;

	assert_true(c->n > 0 && len > 0);
	/* Big entries are only checked by size. */
	if (c->e[c->n - 1].data.len + len <= c->e[c->n - 1].data.cap)
		assert_int_equal(sbx_buf_add(&c->e[c->n - 1].data, data, len),
				 0);
	return 0;
}

static void coll_free(struct coll *c)
{
	for (size_t i = 0; i < c->n; i++) {
		free(c->e[i].name);
		free(c->e[i].link);
		sbx_buf_fini(&c->e[i].data);
	}
	c->n = 0;
}

/* Read `len` bytes in chunks of `step` (0: all at once); returns rc. */
static int read_all(struct coll *c, const void *p, size_t len, size_t step,
		    int *finish_rc)
{
	struct agent_tar_reader *r = agent_tar_reader_new(c_entry, c_data, c);
	int rc = 0;

	if (!step)
		step = len ? len : 1;
	for (size_t off = 0; off < len && rc == 0; off += step)
		rc = agent_tar_feed(r, (const char *)p + off,
				    len - off < step ? len - off : step);
	*finish_rc = rc == 0 ? agent_tar_finish(r) : rc;
	agent_tar_reader_free(r);
	return rc;
}

static void add_file(struct sbx_buf *b, const char *name, const char *data,
		     unsigned mode, int64_t s, long ns)
{
	struct agent_tar_entry e = { .name = name, .type = AGENT_TAR_REG,
				     .mode = mode, .size = strlen(data),
				     .mtime_s = s, .mtime_ns = ns, .uid = 1000,
				     .gid = 1000 };
	static const char zero[512];

	assert_int_equal(agent_tar_header(b, &e), 0);
	assert_int_equal(sbx_buf_add(b, data, strlen(data)), 0);
	assert_int_equal(sbx_buf_add(b, zero, agent_tar_padding(e.size)), 0);
}

static void add_other(struct sbx_buf *b, const char *name, char type,
		      const char *link)
{
	struct agent_tar_entry e = { .name = name, .type = type,
				     .linkname = link, .mode = 0755,
				     .mtime_s = 1700000000 };

	assert_int_equal(agent_tar_header(b, &e), 0);
}

static char *long_name(size_t n, const char *prefix)
{
	char *s = malloc(n + 1);

	assert_non_null(s);
	for (size_t i = 0; i < n; i++)
		s[i] = (i % 20 == 19) ? '/' : (char)('a' + i % 26);
	memcpy(s, prefix, strlen(prefix));
	s[n] = '\0';
	if (s[n - 1] == '/')
		s[n - 1] = 'z';
	return s;
}

/* The sample archive of the round-trip tests. */
static void sample(struct sbx_buf *b, char **n150, char **n300, char **flat)
{
	*n150 = long_name(150, "p150");  /* fits ustar prefix + name */
	*n300 = long_name(300, "p300");  /* needs pax path */
	*flat = malloc(121);
	memset(*flat, 'f', 120);         /* > 100 without a '/': pax */
	(*flat)[120] = '\0';
	add_other(b, "dir", AGENT_TAR_DIR, "");
	add_file(b, "dir/hello.txt", "hello, world\n", 0640, 1700000000, 0);
	add_file(b, "dir/sub.txt", "x", 0600, 1700000001, 123456789);
	add_file(b, "old", "", 0644, -2, 500000000);
	add_other(b, "dir/link", AGENT_TAR_SYM, "hello.txt");
	add_other(b, "dir/hard", AGENT_TAR_LNK, "dir/hello.txt");
	add_file(b, *n150, "150", 0644, 1, 0);
	add_file(b, *n300, "300", 0644, 1, 0);
	add_file(b, *flat, "flat", 0644, 1, 0);
	add_other(b, "longlink", AGENT_TAR_SYM, *n300);
	assert_int_equal(agent_tar_end(b), 0);
}

static void check_sample(struct coll *c, const char *n150, const char *n300,
			 const char *flat)
{
	assert_int_equal(c->n, 10);
	assert_string_equal(c->e[0].name, "dir/");
	assert_int_equal(c->e[0].type, AGENT_TAR_DIR);
	assert_int_equal(c->e[0].mode, 0755);
	assert_string_equal(c->e[1].name, "dir/hello.txt");
	assert_int_equal(c->e[1].type, AGENT_TAR_REG);
	assert_int_equal(c->e[1].mode, 0640);
	assert_int_equal(c->e[1].uid, 1000);
	assert_int_equal(c->e[1].size, 13);
	assert_string_equal(c->e[1].data.data, "hello, world\n");
	assert_int_equal(c->e[1].mtime_s, 1700000000);
	assert_int_equal(c->e[2].mtime_s, 1700000001);
	assert_int_equal(c->e[2].mtime_ns, 123456789);
	assert_string_equal(c->e[3].name, "old");
	assert_int_equal(c->e[3].mtime_s, -2);
	assert_int_equal(c->e[3].mtime_ns, 500000000);
	assert_int_equal(c->e[3].size, 0);
	assert_int_equal(c->e[4].type, AGENT_TAR_SYM);
	assert_string_equal(c->e[4].link, "hello.txt");
	assert_int_equal(c->e[5].type, AGENT_TAR_LNK);
	assert_string_equal(c->e[5].link, "dir/hello.txt");
	assert_string_equal(c->e[6].name, n150);
	assert_string_equal(c->e[6].data.data, "150");
	assert_string_equal(c->e[7].name, n300);
	assert_string_equal(c->e[7].data.data, "300");
	assert_string_equal(c->e[8].name, flat);
	assert_string_equal(c->e[8].data.data, "flat");
	assert_string_equal(c->e[9].link, n300);
	assert_int_equal(c->e[0].offset, 0);
	assert_true(c->e[1].offset > 0 && c->e[1].offset % 512 == 0);
}

static void test_roundtrip(void **state)
{
	struct sbx_buf b;
	struct coll c = { 0 };
	char *n150, *n300, *flat;
	int frc;

	(void)state;
	sbx_buf_init(&b, 1 << 24);
	sample(&b, &n150, &n300, &flat);
	assert_int_equal(b.len % 512, 0);
	assert_int_equal(read_all(&c, b.data, b.len, 0, &frc), 0);
	assert_int_equal(frc, 0);
	check_sample(&c, n150, n300, flat);
	coll_free(&c);
	/* one byte at a time, and in odd chunks */
	assert_int_equal(read_all(&c, b.data, b.len, 1, &frc), 0);
	assert_int_equal(frc, 0);
	check_sample(&c, n150, n300, flat);
	coll_free(&c);
	assert_int_equal(read_all(&c, b.data, b.len, 777, &frc), 0);
	assert_int_equal(frc, 0);
	check_sample(&c, n150, n300, flat);
	coll_free(&c);
	/* trailing record padding after the end is ignored */
	{
		static const char zero[8192];

		assert_int_equal(sbx_buf_add(&b, zero, sizeof(zero)), 0);
		assert_int_equal(read_all(&c, b.data, b.len, 1000, &frc), 0);
		assert_int_equal(frc, 0);
		assert_int_equal(c.n, 10);
		coll_free(&c);
	}
	free(n150);
	free(n300);
	free(flat);
	sbx_buf_fini(&b);
}

static void test_big_size_and_ids(void **state)
{
	struct agent_tar_entry e = { .name = "huge", .type = AGENT_TAR_REG,
				     .mode = 0644,
				     .size = 10ULL * 1024 * 1024 * 1024,
				     .uid = 5000000, .gid = 7,
				     .mtime_s = 1700000000 };
	struct sbx_buf b;
	struct coll c = { 0 };
	int frc;

	(void)state;
	sbx_buf_init(&b, 1 << 20);
	assert_int_equal(agent_tar_header(&b, &e), 0);
	assert_non_null(memmem(b.data, b.len, "size=10737418240\n", 17));
	assert_non_null(memmem(b.data, b.len, "uid=5000000\n", 12));
	assert_int_equal(b.data[156], 'x'); /* a pax header first */
	/* Only the header: the reader reports the size, then "truncated". */
	assert_int_equal(read_all(&c, b.data, b.len, 100, &frc), 0);
	assert_int_equal(c.n, 1);
	assert_int_equal(c.e[0].size, 10ULL * 1024 * 1024 * 1024);
	assert_int_equal(c.e[0].uid, 5000000);
	assert_int_equal(frc, -EINVAL);
	assert_non_null(strstr(sbx_error_last()->msg, "truncated"));
	assert_non_null(strstr(sbx_error_last()->msg, "huge"));
	coll_free(&c);
	sbx_buf_fini(&b);
}

static void test_truncated_and_corrupt(void **state)
{
	struct sbx_buf b;
	struct coll c = { 0 };
	char *n150, *n300, *flat, msg[64];
	int frc;

	(void)state;
	sbx_buf_init(&b, 1 << 24);
	sample(&b, &n150, &n300, &flat);
	/* cut in the middle of a header */
	assert_int_equal(read_all(&c, b.data, 700, 0, &frc), 0);
	assert_int_equal(frc, -EINVAL);
	assert_non_null(strstr(sbx_error_last()->msg, "offset 700"));
	coll_free(&c);
	/* cut before the end marker */
	assert_int_equal(read_all(&c, b.data, b.len - 1024, 3, &frc), 0);
	assert_int_equal(frc, -EINVAL);
	assert_non_null(strstr(sbx_error_last()->msg, "truncated"));
	coll_free(&c);
	/* empty input */
	assert_int_equal(read_all(&c, b.data, 0, 0, &frc), 0);
	assert_int_equal(frc, -EINVAL);
	/* a bad checksum in the third entry's header */
	coll_free(&c);
	{
		size_t off;

		assert_int_equal(read_all(&c, b.data, b.len, 0, &frc), 0);
		off = c.e[2].offset;
		coll_free(&c);
		b.data[off + 10] ^= 1;
		assert_int_equal(read_all(&c, b.data, b.len, 1, &frc),
				 -EINVAL);
		snprintf(msg, sizeof(msg), "offset %zu", off);
		assert_non_null(strstr(sbx_error_last()->msg, msg));
		assert_non_null(strstr(sbx_error_last()->msg, "checksum"));
		assert_int_equal(c.n, 2);
		coll_free(&c);
		b.data[off + 10] ^= 1;
	}
	/* garbage */
	memset(b.data, 'A', 512);
	assert_int_equal(read_all(&c, b.data, b.len, 0, &frc), -EINVAL);
	assert_non_null(strstr(sbx_error_last()->msg, "offset 0"));
	coll_free(&c);
	free(n150);
	free(n300);
	free(flat);
	sbx_buf_fini(&b);
}

static int run(const char *cmd)
{
	int st = system(cmd);

	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *d;
	long n;

	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	d = malloc((size_t)n + 1);
	assert_non_null(d);
	assert_int_equal(fread(d, 1, (size_t)n, f), (size_t)n);
	d[n] = '\0';
	fclose(f);
	*len = (size_t)n;
	return d;
}

/* GNU tar lists what the writer wrote, with the same names and links. */
static void test_gnu_tar_lists_writer_output(void **state)
{
	char *dir = th_tmpdir(), path[4200], cmd[8400], *list, *n150, *n300,
	     *flat;
	struct sbx_buf b;
	size_t len;
	FILE *f;

	(void)state;
	if (run("tar --version >/dev/null 2>&1") != 0)
		skip();
	sbx_buf_init(&b, 1 << 24);
	sample(&b, &n150, &n300, &flat);
	snprintf(path, sizeof(path), "%s/w.tar", dir);
	f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(b.data, 1, b.len, f), b.len);
	fclose(f);
	snprintf(cmd, sizeof(cmd),
		 "tar -tvf %s/w.tar > %s/list 2>&1 && "
		 "mkdir %s/x && tar -C %s/x -xf %s/w.tar 2>/dev/null",
		 dir, dir, dir, dir, dir);
	assert_int_equal(run(cmd), 0);
	snprintf(path, sizeof(path), "%s/list", dir);
	list = slurp(path, &len);
	assert_non_null(strstr(list, " dir/\n"));
	assert_non_null(strstr(list, " dir/hello.txt\n"));
	assert_non_null(strstr(list, "dir/link -> hello.txt\n"));
	assert_non_null(strstr(list, "dir/hard link to dir/hello.txt\n"));
	assert_non_null(strstr(list, n150));
	assert_non_null(strstr(list, n300));
	assert_non_null(strstr(list, flat));
	assert_non_null(strstr(list, "2023-11-14"));
	assert_null(strstr(list, "tar:")); /* no warnings */
	free(list);
	/* the extracted content and sub-second mtime */
	{
		struct stat st;

		snprintf(path, sizeof(path), "%s/x/dir/sub.txt", dir);
		assert_int_equal(stat(path, &st), 0);
		assert_int_equal(st.st_mtim.tv_sec, 1700000001);
		assert_int_equal(st.st_mtim.tv_nsec, 123456789);
		assert_int_equal(st.st_mode & 07777, 0600);
		snprintf(path, sizeof(path), "%s/x/%s", dir, n300);
		assert_int_equal(stat(path, &st), 0);
		assert_int_equal(st.st_size, 3);
	}
	free(n150);
	free(n300);
	free(flat);
	sbx_buf_fini(&b);
	th_rmrf(dir);
	free(dir);
}

/* The reader takes what GNU tar writes in its pax, gnu and v7 formats. */
static void test_reader_takes_gnu_tar_output(void **state)
{
	static const char *const formats[] = { "pax", "gnu", "v7", "ustar" };
	char *dir = th_tmpdir(), cmd[8400], path[4200], *data, *n300;
	size_t len;

	(void)state;
	if (run("tar --version >/dev/null 2>&1") != 0)
		skip();
	n300 = long_name(300, "L300");
	snprintf(cmd, sizeof(cmd),
		 "cd %s && mkdir -p t/d && printf abc > t/d/f && "
		 "ln -s f t/d/s && ln t/d/f t/d/h && "
		 "mkdir -p \"t/$(dirname %s)\" && printf long > \"t/%s\" && "
		 "ln -s \"%s\" t/lsym && touch -d @1700000000.25 t/d/f",
		 dir, n300, n300, n300);
	assert_int_equal(run(cmd), 0);
	for (size_t k = 0; k < sizeof(formats) / sizeof(formats[0]); k++) {
		struct coll c = { 0 };
		bool long_ok = strcmp(formats[k], "v7") &&
			       strcmp(formats[k], "ustar");
		bool saw_f = false, saw_h = false, saw_s = false,
		     saw_long = false, saw_lsym = false;
		int frc;

		snprintf(cmd, sizeof(cmd),
			 "cd %s/t && tar --format=%s --sort=name -cf ../a.tar "
			 "%s 2>/dev/null",
			 dir, formats[k], long_ok ? "." : "d");
		assert_int_equal(run(cmd), 0);
		snprintf(path, sizeof(path), "%s/a.tar", dir);
		data = slurp(path, &len);
		assert_int_equal(read_all(&c, data, len, 0, &frc), 0);
		assert_int_equal(frc, 0);
		coll_free(&c);
		assert_int_equal(read_all(&c, data, len, 1, &frc), 0);
		assert_int_equal(frc, 0);
		for (size_t i = 0; i < c.n; i++) {
			const char *n = c.e[i].name;

			if (!strncmp(n, "./", 2))
				n += 2;
			if (!strcmp(n, "d/f")) {
				saw_f = true;
				assert_int_equal(c.e[i].type, AGENT_TAR_REG);
				assert_string_equal(c.e[i].data.data, "abc");
				assert_int_equal(c.e[i].mtime_s, 1700000000);
				if (!strcmp(formats[k], "pax"))
					assert_int_equal(c.e[i].mtime_ns,
							 250000000);
			}
			if (!strcmp(n, "d/h")) {
				saw_h = true;
				assert_int_equal(c.e[i].type, AGENT_TAR_LNK);
			}
			if (!strcmp(n, "d/s")) {
				saw_s = true;
				assert_int_equal(c.e[i].type, AGENT_TAR_SYM);
				assert_string_equal(c.e[i].link, "f");
			}
			if (!strcmp(n, n300)) {
				saw_long = true;
				assert_string_equal(c.e[i].data.data, "long");
			}
			if (!strcmp(n, "lsym")) {
				saw_lsym = true;
				assert_string_equal(c.e[i].link, n300);
			}
			if (!strcmp(n, "d/") || !strcmp(n, "d"))
				assert_int_equal(c.e[i].type, AGENT_TAR_DIR);
		}
		assert_true(saw_f && saw_h && saw_s);
		assert_true(saw_long == long_ok && saw_lsym == long_ok);
		coll_free(&c);
		free(data);
	}
	free(n300);
	th_rmrf(dir);
	free(dir);
}

/* A hand-made GNU 'L' record, as old GNU tar writes it. */
static void test_gnu_long_name_record(void **state)
{
	unsigned char h[512];
	char *name = long_name(200, "gnuL");
	struct sbx_buf b;
	struct coll c = { 0 };
	unsigned sum = 0;
	int frc;
	static const char zero[1024];

	(void)state;
	sbx_buf_init(&b, 1 << 20);
	memset(h, 0, sizeof(h));
	strcpy((char *)h, "././@LongLink");
	memcpy(h + 100, "0000644", 7);
	memcpy(h + 108, "0000000", 7);
	memcpy(h + 116, "0000000", 7);
	snprintf((char *)h + 124, 12, "%011o", 201u);
	memcpy(h + 136, "00000000000", 11);
	h[156] = 'L';
	memcpy(h + 257, "ustar  ", 8);
	memset(h + 148, ' ', 8);
	for (size_t i = 0; i < 512; i++)
		sum += h[i];
	snprintf((char *)h + 148, 8, "%06o", sum);
	assert_int_equal(sbx_buf_add(&b, h, 512), 0);
	assert_int_equal(sbx_buf_add(&b, name, 201), 0); /* with its NUL */
	assert_int_equal(sbx_buf_add(&b, zero, agent_tar_padding(201)), 0);
	add_file(&b, "truncated-name", "data", 0644, 5, 0);
	assert_int_equal(sbx_buf_add(&b, zero, sizeof(zero)), 0);
	assert_int_equal(read_all(&c, b.data, b.len, 7, &frc), 0);
	assert_int_equal(frc, 0);
	assert_int_equal(c.n, 1);
	assert_string_equal(c.e[0].name, name);
	assert_string_equal(c.e[0].data.data, "data");
	assert_int_equal(c.e[0].offset, 0);
	coll_free(&c);
	free(name);
	sbx_buf_fini(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_big_size_and_ids),
		cmocka_unit_test(test_truncated_and_corrupt),
		cmocka_unit_test(test_gnu_tar_lists_writer_output),
		cmocka_unit_test(test_reader_takes_gnu_tar_output),
		cmocka_unit_test(test_gnu_long_name_record),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
