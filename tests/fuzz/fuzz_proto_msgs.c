/*
 * Round-trip fuzz target for the protocol's messages (lib/proto_batch.c,
 * lib/proto_bulk.c, lib/proto_watch.c) and the path normaliser: decode
 * arbitrary bytes; whenever a decoder accepts something, encode it, print
 * it, decode that again and abort() unless the two decoded values are
 * equal.  The input is tried as
 *   - a batch request body (every op that decodes cleanly is re-encoded
 *     alone and compared field by field);
 *   - a frame stream: each frame header as a bulk frame and as a watch
 *     frame, and a bulk directory frame's entries one by one;
 *   - a path, under each ".." rule (normalising twice changes nothing, and
 *     the three rules agree where ".." does not occur).
 *
 * Built like fuzz_proto (tests/fuzz/meson.build): a plain driver replaying
 * tests/fuzz/corpus as a unit test, and a libFuzzer binary with clang and
 * -Dfuzzer=true.
 */
#include "config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/error.h"
#include "sbx/proto.h"
#include "sbx/proto_batch.h"
#include "sbx/proto_bulk.h"
#include "sbx/proto_watch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what)
{
	fprintf(stderr, "fuzz_proto_msgs: round trip differs: %s\n", what);
	abort();
}

static bool str_eq(const char *a, const char *b)
{
	return (!a && !b) || (a && b && !strcmp(a, b));
}

/* Print `take` and parse the text again (what the other end sees). */
static cJSON *reparse(cJSON *take)
{
	char *text = cJSON_PrintUnformatted(take);
	cJSON *j;

	cJSON_Delete(take);
	if (!text)
		abort();
	j = cJSON_Parse(text);
	cJSON_free(text);
	if (!j)
		fail("encoder output is not JSON");
	return j;
}

/* ---- batch ------------------------------------------------------------------ */

static void batch_op_equal(const struct sbx_batch_op *a,
			   const struct sbx_batch_op *b)
{
#define SAME(f)                     \
	do {                        \
		if (a->f != b->f)   \
			fail("op " #f); \
	} while (0)
	SAME(kind);
	SAME(rc);
	SAME(dir_slash);
	SAME(data_len);
	SAME(offset);
	SAME(length);
	SAME(mode);
	SAME(rdev);
	SAME(has_mode);
	SAME(has_uid);
	SAME(has_gid);
	SAME(has_size);
	SAME(uid);
	SAME(gid);
	SAME(size);
	SAME(atime_set);
	SAME(mtime_set);
	SAME(atime_s);
	SAME(atime_ns);
	SAME(mtime_s);
	SAME(mtime_ns);
	SAME(excl);
	SAME(truncate);
	SAME(append);
	SAME(datasync);
	SAME(flags);
	SAME(fmode);
	SAME(whence);
#undef SAME
	if (!str_eq(a->path, b->path) || !str_eq(a->newpath, b->newpath) ||
	    !str_eq(a->target, b->target) || !str_eq(a->name, b->name))
		fail("op strings");
	if ((a->data == NULL) != (b->data == NULL) ||
	    (a->data_len && memcmp(a->data, b->data, a->data_len)))
		fail("op data");
}

static void fuzz_batch(const char *text, size_t size)
{
	struct sbx_batch *b = NULL, *back = NULL;

	if (sbx_batch_decode(text, size, &b) < 0) {
		sbx_error_clear();
		return;
	}
	for (size_t i = 0; i < b->n; i++) {
		const struct sbx_batch_op *op = &b->ops[i];
		cJSON *doc;
		char *again;

		if (op->rc < 0)
			continue;
		doc = sbx_batch_encode(op, 1, b->stop_on_error);
		again = cJSON_PrintUnformatted(doc);
		cJSON_Delete(doc);
		if (!again)
			abort();
		if (sbx_batch_decode(again, strlen(again), &back) < 0)
			fail("batch does not decode again");
		if (back->n != 1 || back->stop_on_error != b->stop_on_error)
			fail("batch shape");
		batch_op_equal(op, &back->ops[0]);
		sbx_batch_free(back);
		back = NULL;
		cJSON_free(again);
	}
	sbx_batch_free(b);
}

/* ---- frames ----------------------------------------------------------------- */

static void entry_roundtrip(const cJSON *e)
{
	struct stat st, st2;
	const char *name, *name2;
	cJSON *j;

	if (sbx_proto_entry_decode(e, &name, &st) < 0) {
		sbx_error_clear();
		return;
	}
	j = reparse(sbx_proto_entry_encode(name, &st));
	if (sbx_proto_entry_decode(j, &name2, &st2) < 0 ||
	    strcmp(name, name2) || memcmp(&st, &st2, sizeof(st)))
		fail("entry");
	cJSON_Delete(j);
}

/* Entry `a` of a frame and `b`, the same after a round trip. */
static void entries_same(const cJSON *a, const cJSON *b)
{
	struct stat sa, sb;
	const char *na, *nb;

	if (sbx_proto_entry_decode(a, &na, &sa) < 0) {
		sbx_error_clear();
		return;
	}
	if (sbx_proto_entry_decode(b, &nb, &sb) < 0 || strcmp(na, nb) ||
	    memcmp(&sa, &sb, sizeof(sa)))
		fail("bulk dir entry");
}

static void bulk_roundtrip(const cJSON *hdr, size_t len)
{
	struct sbx_bulk_frame f, g;
	const cJSON *e, *e2;
	cJSON *j;

	if (sbx_bulk_frame_decode(hdr, len, &f) < 0) {
		sbx_error_clear();
		return;
	}
	if (f.kind == SBX_BULK_FRAME_OTHER)
		return;
	j = reparse(sbx_bulk_frame_encode(&f));
	if (sbx_bulk_frame_decode(j, len, &g) < 0)
		fail("bulk frame does not decode again");
	if (f.kind != g.kind || !str_eq(f.path, g.path))
		fail("bulk kind/path");
	switch (f.kind) {
	case SBX_BULK_FRAME_DIR:
		if (memcmp(&f.st, &g.st, sizeof(f.st)) || f.more != g.more ||
		    f.continued != g.continued ||
		    cJSON_GetArraySize(f.entries) !=
			    cJSON_GetArraySize(g.entries))
			fail("bulk dir");
		/* Entries travel as they are (the decoder checks them one
		 * by one): every entry that decodes, decodes the same. */
		for (e = f.entries->child, e2 = g.entries->child; e && e2;
		     e = e->next, e2 = e2->next)
			entries_same(e, e2);
		cJSON_ArrayForEach(e, f.entries)
		{
			entry_roundtrip(e);
		}
		break;
	case SBX_BULK_FRAME_FILE:
		if (memcmp(&f.st, &g.st, sizeof(f.st)))
			fail("bulk file st");
		break;
	case SBX_BULK_FRAME_DIR_ERROR:
		if (f.error != g.error)
			fail("bulk error");
		break;
	case SBX_BULK_FRAME_END:
		if (f.watch_seq != g.watch_seq)
			fail("bulk end");
		break;
	}
	cJSON_Delete(j);
}

static void watch_roundtrip(const cJSON *hdr)
{
	struct sbx_watch_frame f, g;
	cJSON *j;

	if (sbx_watch_frame_decode(hdr, &f) < 0) {
		sbx_error_clear();
		return;
	}
	if (f.kind == SBX_WATCH_OTHER)
		return;
	j = reparse(sbx_watch_frame_encode(&f));
	if (sbx_watch_frame_decode(j, &g) < 0)
		fail("watch frame does not decode again");
	if (f.kind != g.kind || f.seq != g.seq || f.watch_seq != g.watch_seq ||
	    !str_eq(f.path, g.path) || !str_eq(f.name, g.name) ||
	    !str_eq(f.boot_id, g.boot_id))
		fail("watch frame");
	cJSON_Delete(j);
}

static int on_frame(const cJSON *hdr, const void *d, size_t len, void *payload)
{
	(void)d;
	(void)payload;
	bulk_roundtrip(hdr, len);
	watch_roundtrip(hdr);
	return 0;
}

static void fuzz_frames(const uint8_t *data, size_t size)
{
	struct sbx_frame_parser p;

	sbx_frame_parser_init(&p, on_frame, NULL);
	(void)sbx_frame_parser_feed(&p, data, size);
	sbx_frame_parser_fini(&p);
	sbx_error_clear();
}

/* A bare JSON object as one frame header (the corpus's .json seeds). */
static void fuzz_header(const char *text, size_t size)
{
	cJSON *j = cJSON_ParseWithLength(text, size);
	const cJSON *len;

	if (!j)
		return;
	len = cJSON_GetObjectItemCaseSensitive(j, "len");
	bulk_roundtrip(j, cJSON_IsNumber(len) && len->valuedouble >= 0 &&
					  len->valuedouble < 1e9
				  ? (size_t)len->valuedouble
				  : 0);
	watch_roundtrip(j);
	entry_roundtrip(j);
	cJSON_Delete(j);
}

/* ---- paths ------------------------------------------------------------------ */

static void fuzz_path(const char *text)
{
	char *norm[3] = { NULL, NULL, NULL };

	for (int rule = 0; rule < 3; rule++) {
		char *again = NULL;

		if (sbx_proto_path_norm(text, rule, &norm[rule]) < 0) {
			sbx_error_clear();
			continue;
		}
		if (sbx_proto_path_norm(norm[rule], rule, &again) < 0 ||
		    strcmp(again, norm[rule]))
			fail("path normalisation is not idempotent");
		if (norm[rule][0] == '/' || strstr(norm[rule], "//"))
			fail("normalised path has stray slashes");
		free(again);
	}
	/* Without "..", the rules agree. */
	if (norm[SBX_PATH_DOTDOT_REFUSE] &&
	    (!norm[SBX_PATH_DOTDOT_KEEP] || !norm[SBX_PATH_DOTDOT_RESOLVE] ||
	     strcmp(norm[SBX_PATH_DOTDOT_REFUSE], norm[SBX_PATH_DOTDOT_KEEP]) ||
	     strcmp(norm[SBX_PATH_DOTDOT_REFUSE],
		    norm[SBX_PATH_DOTDOT_RESOLVE])))
		fail("path rules disagree without \"..\"");
	for (int rule = 0; rule < 3; rule++)
		free(norm[rule]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 1);

	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	fuzz_batch(text, size);
	fuzz_frames(data, size);
	fuzz_header(text, size);
	fuzz_path(text);
	free(text);
	return 0;
}
