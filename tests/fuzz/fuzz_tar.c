/*
 * Fuzz target for the agent's tar reader (agent/tar.c), which parses
 * archives a client uploads (PUT /archive, repo seeding): untrusted input.
 *
 * The input is fed in input-dependent chunk sizes (the reader must not
 * care how the stream is split), and the callbacks check what the reader
 * promises: sane entry fields, data pieces that never exceed the entry's
 * size, offsets that grow.  Then every regular file read is written again
 * with agent_tar_header() (with its data) and read back: the second
 * reading must give the same names, sizes, modes, owners and times, so
 * the writer and the reader agree on everything the reader can produce.
 *
 * Built like fuzz_proto.c (tests/fuzz/meson.build): a plain driver replaying
 * tests/fuzz/corpus/tar_*.tar as a meson test, and with clang
 * -Dfuzzer=true a libFuzzer binary (./fuzz_tar DIR tests/fuzz/corpus/tar_*.tar,
 * new inputs going to DIR).
 */
#include "config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sbx/buf.h"
#include "tar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_FILES 64
#define DATA_CAP (256 * 1024) /* data kept for the round trip, in total */

struct file {
	char *name;
	unsigned mode;
	uint64_t uid, gid, size;
	int64_t mtime_s;
	long mtime_ns;
	size_t data_off; /* into the shared data buffer */
	bool whole;      /* all its data was kept */
};

struct state {
	struct file f[MAX_FILES];
	size_t n;
	bool in_file;     /* the current entry is f[n - 1] */
	uint64_t left;    /* data bytes the current entry still has */
	uint64_t last_off;
	bool seen;
	struct sbx_buf data;
};

static int on_entry(const struct agent_tar_entry *e, void *payload)
{
	struct state *s = payload;

	if (!e->name || !e->linkname || e->mode > 07777 || e->mtime_ns < 0 ||
	    e->mtime_ns > 999999999 || s->left != 0)
		abort();
	if (s->seen && e->offset <= s->last_off)
		abort();
	s->seen = true;
	s->last_off = e->offset;
	s->left = e->size;
	s->in_file = false;
	if (e->type != AGENT_TAR_REG || !*e->name || s->n == MAX_FILES)
		return 0;
	s->f[s->n] = (struct file){
		.name = strdup(e->name),
		.mode = e->mode,
		.uid = e->uid,
		.gid = e->gid,
		.size = e->size,
		.mtime_s = e->mtime_s,
		.mtime_ns = e->mtime_ns,
		.data_off = sbx_buf_len(&s->data),
		.whole = true,
	};
	if (!s->f[s->n].name)
		abort();
	s->n++;
	s->in_file = true;
	return 0;
}

static int on_data(const void *d, size_t len, void *payload)
{
	struct state *s = payload;

	if (len == 0 || len > s->left)
		abort();
	s->left -= len;
	if (s->in_file && s->f[s->n - 1].whole &&
	    sbx_buf_add(&s->data, d, len) < 0)
		s->f[s->n - 1].whole = false;
	return 0;
}

static void state_fini(struct state *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->f[i].name);
	sbx_buf_fini(&s->data);
}

/* Read `size` bytes in chunks chosen by `seed`; 0 or the reader's error. */
static int read_archive(struct state *s, const uint8_t *data, size_t size,
			unsigned seed)
{
	struct agent_tar_reader *r = agent_tar_reader_new(on_entry, on_data, s);
	size_t off = 0, step = seed % 1031 + 1;
	int rc = 0;

	while (off < size && rc == 0) {
		size_t n = size - off < step ? size - off : step;

		rc = agent_tar_feed(r, data + off, n);
		off += n;
		step = step * 7 % 1543 + 1;
	}
	if (rc == 0)
		rc = agent_tar_finish(r);
	if (rc == 0 && agent_tar_offset(r) != size)
		abort();
	agent_tar_reader_free(r);
	return rc;
}

/* Write the regular files of `s` (with their data) as a new archive. */
static int rewrite(const struct state *s, struct sbx_buf *out)
{
	static const char zero[AGENT_TAR_BLOCK];
	int rc = 0;

	for (size_t i = 0; i < s->n && rc == 0; i++) {
		const struct file *f = &s->f[i];
		struct agent_tar_entry e = {
			.name = f->name,
			.linkname = "",
			.type = AGENT_TAR_REG,
			.mode = f->mode,
			.uid = f->uid,
			.gid = f->gid,
			.size = f->size,
			.mtime_s = f->mtime_s,
			.mtime_ns = f->mtime_ns,
		};

		if (!f->whole)
			return -1;
		rc = agent_tar_header(out, &e);
		if (rc == 0 && f->size)
			rc = sbx_buf_add(out, sbx_buf_ptr(&s->data) + f->data_off,
					 (size_t)f->size);
		if (rc == 0)
			rc = sbx_buf_add(out, zero,
					 agent_tar_padding(f->size));
	}
	if (rc == 0)
		rc = agent_tar_end(out);
	return rc;
}

static void same_files(const struct state *a, const struct state *b)
{
	if (a->n != b->n)
		abort();
	for (size_t i = 0; i < a->n; i++) {
		const struct file *x = &a->f[i], *y = &b->f[i];

		if (strcmp(x->name, y->name) != 0 || x->mode != y->mode ||
		    x->uid != y->uid || x->gid != y->gid ||
		    x->size != y->size || x->mtime_s != y->mtime_s ||
		    x->mtime_ns != y->mtime_ns ||
		    (x->size && memcmp(sbx_buf_ptr(&a->data) + x->data_off,
			   sbx_buf_ptr(&b->data) + y->data_off,
			   (size_t)x->size) != 0))
			abort();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct state s = { 0 }, again = { 0 };
	struct sbx_buf out;
	unsigned seed = size ? data[size - 1] : 0;

	sbx_buf_init(&s.data, DATA_CAP);
	sbx_buf_init(&again.data, DATA_CAP);
	sbx_buf_init(&out, 4 * DATA_CAP);
	if (read_archive(&s, data, size, seed) == 0 && rewrite(&s, &out) == 0) {
		if (read_archive(&again, (const uint8_t *)sbx_buf_ptr(&out),
				 sbx_buf_len(&out), seed / 3) != 0)
			abort();
		same_files(&s, &again);
	}
	sbx_buf_fini(&out);
	state_fini(&again);
	state_fini(&s);
	return 0;
}
