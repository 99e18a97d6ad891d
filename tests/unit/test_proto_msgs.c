/*
 * Unit tests: the protocol's messages (lib/proto_batch.c, proto_bulk.c,
 * proto_watch.c) and the one path normaliser (sbx_proto_path_norm in
 * lib/proto.c): round trips, the exact wire text where it matters, and
 * malformed input with its error.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "sbx/error.h"
#include "sbx/json.h"
#include "sbx/proto.h"
#include "sbx/proto_batch.h"
#include "sbx/proto_bulk.h"
#include "sbx/proto_watch.h"

static cJSON *parse(const char *text)
{
	cJSON *j = NULL;

	assert_int_equal(sbx_json_parse(&j, text, strlen(text), "test"), 0);
	return j;
}

static char *print_take(cJSON *take)
{
	char *s = cJSON_PrintUnformatted(take);

	cJSON_Delete(take);
	assert_non_null(s);
	return s;
}

/* ---- paths ------------------------------------------------------------------- */

static void check_norm(const char *in, int rule, int want_rc, const char *want)
{
	char *out = NULL;
	int rc = sbx_proto_path_norm(in, rule, &out);

	assert_int_equal(rc, want_rc);
	if (rc == 0) {
		assert_string_equal(out, want);
	} else {
		assert_null(out);
		assert_int_equal(sbx_error_last()->klass, SBX_ERR_PROTO);
		sbx_error_clear();
	}
	free(out);
}

static void test_path_rules(void **state)
{
	char *big;

	static const struct {
		const char *in;
		int rule; /* -1: every rule */
		int rc;
		const char *want;
	} cases[] = {
		/* the common part */
		{ "", -1, 0, "" },
		{ "/", -1, 0, "" },
		{ ".", -1, 0, "" },
		{ "//a//b/./c/", -1, 0, "a/b/c" },
		{ "a/.b/..c/...", -1, 0, "a/.b/..c/..." },
		/* the client: ".." refused */
		{ "a/../b", SBX_PATH_DOTDOT_REFUSE, -EINVAL, NULL },
		{ "..", SBX_PATH_DOTDOT_REFUSE, -EINVAL, NULL },
		/* the agent: ".." kept for confine.c */
		{ "a/../b", SBX_PATH_DOTDOT_KEEP, 0, "a/../b" },
		{ "/../x/", SBX_PATH_DOTDOT_KEEP, 0, "../x" },
		/* archives: ".." resolved, never above the start */
		{ "a/../b", SBX_PATH_DOTDOT_RESOLVE, 0, "b" },
		{ "a/b/../../c/./d/..", SBX_PATH_DOTDOT_RESOLVE, 0, "c" },
		{ "a/..", SBX_PATH_DOTDOT_RESOLVE, 0, "" },
		{ "a/../..", SBX_PATH_DOTDOT_RESOLVE, -EXDEV, NULL },
		{ "../x", SBX_PATH_DOTDOT_RESOLVE, -EXDEV, NULL },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		for (int rule = 0; rule < 3; rule++)
			if (cases[i].rule < 0 || cases[i].rule == rule)
				check_norm(cases[i].in, rule, cases[i].rc,
					   cases[i].want);
	/* length */
	big = malloc(PATH_MAX + 1);
	assert_non_null(big);
	memset(big, 'a', PATH_MAX);
	big[PATH_MAX] = '\0';
	for (int rule = 0; rule < 3; rule++)
		check_norm(big, rule, -ENAMETOOLONG, NULL);
	big[PATH_MAX - 1] = '\0';
	check_norm(big, SBX_PATH_DOTDOT_KEEP, 0, big);
	free(big);
	/* the old name is the refusing rule */
	{
		char *out = NULL;

		assert_int_equal(sbx_proto_path_clean("x/..", &out), -EINVAL);
		sbx_error_clear();
	}
}

/* ---- batch ------------------------------------------------------------------- */

static struct sbx_batch *decode_ok(const char *text)
{
	struct sbx_batch *b = NULL;

	assert_int_equal(sbx_batch_decode(text, strlen(text), &b), 0);
	assert_non_null(b);
	return b;
}

/* Encode op alone, decode it again, compare the fields that matter. */
static void roundtrip_op(const struct sbx_batch_op *op)
{
	char *text = print_take(sbx_batch_encode(op, 1, false));
	struct sbx_batch *b = decode_ok(text);
	const struct sbx_batch_op *o = &b->ops[0];

	assert_int_equal(b->n, 1);
	assert_int_equal(o->rc, 0);
	assert_int_equal(o->kind, op->kind);
	if (op->path)
		assert_string_equal(o->path, op->path);
	assert_int_equal(o->dir_slash, op->dir_slash);
	if (op->newpath)
		assert_string_equal(o->newpath, op->newpath);
	if (op->target)
		assert_string_equal(o->target, op->target);
	if (op->name)
		assert_string_equal(o->name, op->name);
	assert_int_equal(o->data_len, op->data_len);
	if (op->data_len)
		assert_memory_equal(o->data, op->data, op->data_len);
	assert_int_equal(o->has_mode, op->has_mode);
	if (op->has_mode)
		assert_int_equal(o->mode, op->mode);
	assert_int_equal(o->has_uid, op->has_uid);
	assert_int_equal(o->uid, op->uid);
	assert_int_equal(o->has_gid, op->has_gid);
	assert_int_equal(o->gid, op->gid);
	assert_int_equal(o->has_size, op->has_size);
	assert_int_equal(o->size, op->size);
	assert_int_equal(o->atime_set, op->atime_set);
	assert_int_equal(o->mtime_set, op->mtime_set);
	assert_int_equal(o->mtime_s, op->mtime_s);
	assert_int_equal(o->mtime_ns, op->mtime_ns);
	assert_int_equal(o->offset, op->offset);
	assert_int_equal(o->flags, op->flags);
	assert_int_equal(o->excl, op->excl);
	assert_int_equal(o->truncate, op->truncate);
	assert_int_equal(o->datasync, op->datasync);
	assert_int_equal(o->fmode, op->fmode);
	assert_int_equal(o->whence, op->whence);
	assert_int_equal(o->rdev, op->rdev);
	assert_true(o->ino == op->ino);
	sbx_batch_free(b);
	free(text);
}

static void test_batch_roundtrip(void **state)
{
	unsigned char bytes[] = { 0, 1, 2, 0xff, 'x' };
	struct sbx_batch_op ops[] = {
		{ .kind = SBX_BATCH_STAT, .path = "a/b" },
		{ .kind = SBX_BATCH_UNLINK, .path = "x", .dir_slash = true },
		{ .kind = SBX_BATCH_MKDIR, .path = "d", .has_mode = true,
		  .mode = 0700, .has_uid = true, .uid = 1000,
		  .has_gid = true, .gid = 100 },
		{ .kind = SBX_BATCH_MKNOD, .path = "p", .has_mode = true,
		  .mode = 010644, .rdev = 259 },
		{ .kind = SBX_BATCH_CREATE, .path = "f", .has_mode = true,
		  .mode = 0600, .excl = true, .truncate = true },
		{ .kind = SBX_BATCH_SYMLINK, .path = "l", .target = "../t" },
		{ .kind = SBX_BATCH_LINK, .path = "f", .newpath = "g" },
		{ .kind = SBX_BATCH_RENAME, .path = "f", .newpath = "h",
		  .flags = RENAME_EXCHANGE },
		{ .kind = SBX_BATCH_RENAME, .path = "f", .newpath = "h",
		  .flags = RENAME_NOREPLACE },
		{ .kind = SBX_BATCH_SETATTR, .path = "h", .has_size = true,
		  .size = 1LL << 40, .atime_set = SBX_BATCH_TIME_NOW,
		  .mtime_set = SBX_BATCH_TIME_SET, .mtime_s = -3,
		  .mtime_ns = 999999999 },
		{ .kind = SBX_BATCH_SETATTR, .path = "h", .has_mode = true,
		  .mode = 0600, .ino = 18446744073709551557ull },
		{ .kind = SBX_BATCH_WRITE, .path = "w", .offset = 7,
		  .data = bytes, .data_len = sizeof(bytes) },
		/* An inode number past 2^53 survives (a decimal string). */
		{ .kind = SBX_BATCH_WRITE, .path = "w", .offset = 0,
		  .data = bytes, .data_len = 1,
		  .ino = 18446744073709551557ull },
		{ .kind = SBX_BATCH_FSYNC, .path = "w", .datasync = true },
		{ .kind = SBX_BATCH_FALLOCATE, .path = "w", .fmode = 3,
		  .offset = 1, .length = 4096 },
		{ .kind = SBX_BATCH_LSEEK, .path = "w", .offset = 5,
		  .whence = SEEK_HOLE },
		{ .kind = SBX_BATCH_SETXATTR, .path = "w", .name = "user.k",
		  .data = bytes, .data_len = 3, .flags = XATTR_CREATE },
		{ .kind = SBX_BATCH_GETXATTR, .path = "w", .name = "user.k" },
		{ .kind = SBX_BATCH_STATFS },
	};

	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		roundtrip_op(&ops[i]);
}

/* The client's requests keep the bytes older agents understand. */
static void test_batch_wire(void **state)
{
	struct sbx_batch_op op = {
		.kind = SBX_BATCH_RENAME, .path = "a", .newpath = "b",
	};
	char *text = print_take(sbx_batch_encode(&op, 1, false));

	assert_string_equal(text, "{\"ops\":[{\"op\":\"rename\",\"path\":\"a\","
				  "\"newpath\":\"b\",\"flags\":0}]}");
	free(text);
	op = (struct sbx_batch_op){ .kind = SBX_BATCH_CREATE, .path = "f",
				    .has_mode = true, .mode = 0644,
				    .has_uid = true, .uid = 1,
				    .has_gid = true, .gid = 2 };
	text = print_take(sbx_batch_encode(&op, 1, true));
	assert_string_equal(text,
			    "{\"ops\":[{\"op\":\"create\",\"path\":\"f\","
			    "\"mode\":420,\"excl\":false,\"truncate\":false,"
			    "\"uid\":1,\"gid\":2}],\"stop_on_error\":true}");
	free(text);
}

static void check_op_error(const char *body, const char *msg_part)
{
	struct sbx_batch *b = decode_ok(body);

	assert_int_equal(b->n, 1);
	assert_int_equal(b->ops[0].rc, -EINVAL);
	assert_non_null(b->ops[0].msg);
	if (!strstr(b->ops[0].msg, msg_part))
		fail_msg("\"%s\" lacks \"%s\"", b->ops[0].msg, msg_part);
	sbx_batch_free(b);
}

static void test_batch_malformed(void **state)
{
	struct sbx_batch *b = NULL;

	/* whole-document errors */
	assert_int_equal(sbx_batch_decode("[]", 2, &b), -EINVAL);
	assert_null(b);
	assert_int_equal(sbx_batch_decode("{\"ops\":1}", 9, &b), -EINVAL);
	assert_int_equal(sbx_batch_decode("{\"ops\":[],\"stop_on_error\":1}",
					  29, &b),
			 -EINVAL);
	assert_int_equal(sbx_batch_decode("{", 1, &b), -EINVAL);
	sbx_error_clear();
	{
		/* one op too many */
		size_t cap = 16 + 30 * (SBX_PROTO_MAX_BATCH + 1);
		char *big = malloc(cap);
		size_t n = 0;

		assert_non_null(big);
		n += (size_t)snprintf(big + n, cap - n, "{\"ops\":[");
		for (int i = 0; i <= SBX_PROTO_MAX_BATCH; i++)
			n += (size_t)snprintf(big + n, cap - n,
					      "%s{\"op\":\"statfs\"}",
					      i ? "," : "");
		n += (size_t)snprintf(big + n, cap - n, "]}");
		assert_int_equal(sbx_batch_decode(big, n, &b), -EFBIG);
		free(big);
		sbx_error_clear();
	}
	/* per-op errors name the op and the field */
	check_op_error("{\"ops\":[{\"op\":\"nope\"}]}", "unknown or missing");
	check_op_error("{\"ops\":[7]}", "not an object");
	check_op_error("{\"ops\":[{\"op\":\"mkdir\"}]}",
		       "ops[0] (mkdir): \"path\" is required");
	check_op_error("{\"ops\":[{\"op\":\"mknod\",\"path\":\"p\"}]}",
		       "\"mode\" is required");
	check_op_error("{\"ops\":[{\"op\":\"mkdir\",\"path\":\"d\",\"uid\":-1}]"
		       "}",
		       "\"uid\" is out of range");
	check_op_error("{\"ops\":[{\"op\":\"write\",\"path\":\"w\","
		       "\"data\":\"!!\"}]}",
		       "\"data\" is not valid base64");
	check_op_error("{\"ops\":[{\"op\":\"write\",\"path\":\"w\","
		       "\"data\":\"\",\"ino\":12}]}",
		       "\"ino\" must be a decimal string");
	check_op_error("{\"ops\":[{\"op\":\"write\",\"path\":\"w\","
		       "\"data\":\"\",\"ino\":\"-1\"}]}",
		       "\"ino\" must be a decimal string");
	check_op_error("{\"ops\":[{\"op\":\"setattr\",\"path\":\"w\","
		       "\"mtime\":[1,1000000000]}]}",
		       "\"mtime\" must be [s, ns]");
	check_op_error("{\"ops\":[{\"op\":\"rename\",\"path\":\"a\","
		       "\"newpath\":\"b\",\"flags\":\"sideways\"}]}",
		       "\"flags\" must be 0");
	check_op_error("{\"ops\":[{\"op\":\"lseek\",\"path\":\"a\","
		       "\"offset\":0,\"whence\":\"set\"}]}",
		       "\"whence\" must be");
	check_op_error("{\"ops\":[{\"op\":\"symlink\",\"path\":\"a\","
		       "\"target\":\"\"}]}",
		       "\"target\" must not be empty");
	check_op_error("{\"ops\":[{\"op\":\"getxattr\",\"path\":\"a\","
		       "\"name\":\"\"}]}",
		       "\"name\" must be 1-255 bytes");
	/* defaults */
	b = decode_ok("{\"ops\":[{\"op\":\"mkdir\",\"path\":\"//d/\"},"
		      "{\"op\":\"read\",\"path\":\"f\",\"length\":null}]}");
	assert_string_equal(b->ops[0].path, "d");
	assert_true(b->ops[0].dir_slash);
	assert_int_equal(b->ops[0].mode, 0755);
	assert_false(b->ops[0].has_mode);
	assert_int_equal(b->ops[1].length, SBX_BATCH_MAX_READ);
	sbx_batch_free(b);
}

static void test_batch_result(void **state)
{
	cJSON *ans, *r = NULL;

	ans = parse("{\"results\":[{\"ok\":true,\"offset\":3},"
			     "{\"error\":{\"errno\":\"ENOENT\","
			     "\"message\":\"gone\"}}]}");
	assert_non_null(ans);
	assert_int_equal(sbx_batch_result_take(ans, 1, 0, "x", &r), -EPROTO);
	assert_null(r);
	sbx_error_clear();
	assert_int_equal(sbx_batch_result_take(ans, 2, 1, "stat a", &r),
			 -ENOENT);
	assert_null(r);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_REMOTE);
	assert_non_null(strstr(sbx_error_last()->msg, "stat a: gone"));
	sbx_error_clear();
	cJSON_Delete(ans);
	ans = parse("{\"results\":[{\"ok\":true,\"offset\":3}]}");
	assert_int_equal(sbx_batch_result_take(ans, 1, 0, "x", &r), 0);
	assert_int_equal(cJSON_GetObjectItem(r, "offset")->valueint, 3);
	cJSON_Delete(r);
	cJSON_Delete(ans);
	ans = parse("{\"results\":[3]}");
	assert_int_equal(sbx_batch_result_take(ans, 1, 0, "x", &r), -EPROTO);
	sbx_error_clear();
	cJSON_Delete(ans);
	/* In any order, each once: a take leaves the others' indices. */
	ans = parse("{\"results\":[{\"ok\":true,\"n\":0},"
		    "{\"ok\":true,\"n\":1},{\"ok\":true,\"n\":2}]}");
	for (int i = 0; i < 3; i++) {
		int k = (i + 1) % 3;

		assert_int_equal(sbx_batch_result_take(ans, 3, (size_t)k, "x",
						       &r),
				 0);
		assert_int_equal(cJSON_GetObjectItem(r, "n")->valueint, k);
		cJSON_Delete(r);
	}
	assert_int_equal(sbx_batch_result_take(ans, 3, 1, "x", &r), -EPROTO);
	assert_null(r);
	sbx_error_clear();
	cJSON_Delete(ans);
}

/* ---- bulk -------------------------------------------------------------------- */

static struct stat some_stat(mode_t mode, off_t size)
{
	struct stat st;

	memset(&st, 0, sizeof(st));
	st.st_ino = 42;
	st.st_dev = 7;
	st.st_mode = mode;
	st.st_nlink = 1;
	st.st_size = size;
	st.st_mtim.tv_sec = 1700000000;
	st.st_mtim.tv_nsec = 5;
	st.st_blksize = 4096; /* what the decoder fills in */
	return st;
}

static cJSON *reparse(cJSON *take)
{
	char *text = print_take(take);
	cJSON *j = cJSON_Parse(text);

	free(text);
	assert_non_null(j);
	return j;
}

static void test_bulk_frames(void **state)
{
	struct stat dst = some_stat(S_IFDIR | 0755, 4096);
	struct stat fst = some_stat(S_IFREG | 0644, 5);
	struct sbx_bulk_frame f = {
		.kind = SBX_BULK_FRAME_DIR, .path = "a/b", .st = dst,
		.continued = true,
	}, g;
	const char *name;
	struct stat est;
	cJSON *h, *j;
	char *text;

	/* a directory frame built entry by entry, as the agent does */
	h = sbx_bulk_frame_encode(&f);
	sbx_bulk_dir_add(h, "c", &fst);
	cJSON_AddBoolToObject(h, "more", 1);
	j = reparse(h);
	assert_int_equal(sbx_bulk_frame_decode(j, 0, &g), 0);
	assert_int_equal(g.kind, SBX_BULK_FRAME_DIR);
	assert_string_equal(g.path, "a/b");
	assert_true(g.more);
	assert_true(g.continued);
	assert_memory_equal(&g.st, &dst, sizeof(dst));
	assert_int_equal(cJSON_GetArraySize(g.entries), 1);
	assert_int_equal(sbx_proto_entry_decode(cJSON_GetArrayItem(g.entries,
								   0),
						&name, &est),
			 0);
	assert_string_equal(name, "c");
	assert_memory_equal(&est, &fst, sizeof(fst));
	cJSON_Delete(j);

	/* a file frame: "len" is the size; the payload must match it */
	f = (struct sbx_bulk_frame){ .kind = SBX_BULK_FRAME_FILE,
				     .path = "a/b/c", .st = fst };
	j = reparse(sbx_bulk_frame_encode(&f));
	assert_int_equal(cJSON_GetObjectItem(j, "len")->valueint, 5);
	assert_int_equal(sbx_bulk_frame_decode(j, 5, &g), 0);
	assert_int_equal(g.kind, SBX_BULK_FRAME_FILE);
	assert_int_equal(sbx_bulk_frame_decode(j, 4, &g), -EPROTO);
	sbx_error_clear();
	cJSON_Delete(j);

	/* an unreadable directory, and the end */
	f = (struct sbx_bulk_frame){ .kind = SBX_BULK_FRAME_DIR_ERROR,
				     .path = "x", .error = -EACCES,
				     .message = "no" };
	text = print_take(sbx_bulk_frame_encode(&f));
	assert_string_equal(text, "{\"error\":{\"errno\":\"EACCES\","
				  "\"message\":\"no\"},\"dir\":\"x\"}");
	j = cJSON_Parse(text);
	free(text);
	assert_int_equal(sbx_bulk_frame_decode(j, 0, &g), 0);
	assert_int_equal(g.kind, SBX_BULK_FRAME_DIR_ERROR);
	assert_int_equal(g.error, -EACCES);
	assert_string_equal(g.message, "no");
	cJSON_Delete(j);
	f = (struct sbx_bulk_frame){ .kind = SBX_BULK_FRAME_END,
				     .watch_seq = 99 };
	text = print_take(sbx_bulk_frame_encode(&f));
	assert_string_equal(text, "{\"end\":true,\"watch_seq\":99}");
	free(text);

	/* malformed */
	j = parse("{\"dir\":\"d\",\"st\":[1]}");
	assert_int_equal(sbx_bulk_frame_decode(j, 0, &g), -EPROTO);
	cJSON_Delete(j);
	j = parse("{\"dir\":\"d\",\"entries\":[]}");
	assert_int_equal(sbx_bulk_frame_decode(j, 0, &g), -EPROTO);
	cJSON_Delete(j);
	j = parse("{\"name\":\"a/b\",\"st\":[]}");
	assert_int_equal(sbx_proto_entry_decode(j, &name, &est), -EPROTO);
	cJSON_Delete(j);
	j = parse("{\"something\":\"new\"}");
	assert_int_equal(sbx_bulk_frame_decode(j, 0, &g), 0);
	assert_int_equal(g.kind, SBX_BULK_FRAME_OTHER);
	cJSON_Delete(j);
	sbx_error_clear();
}

/* ---- watch ------------------------------------------------------------------- */

/* Decode `text`: want < 0 is the error, else the kind. */
static void check_watch(const char *text, int want)
{
	struct sbx_watch_frame g;
	cJSON *j = parse(text);
	int rc = sbx_watch_frame_decode(j, &g);

	if (want < 0) {
		assert_int_equal(rc, want);
		assert_int_equal(sbx_error_last()->klass, SBX_ERR_PROTO);
		sbx_error_clear();
	} else {
		assert_int_equal(rc, 0);
		assert_int_equal(g.kind, want);
	}
	cJSON_Delete(j);
}

static void test_watch_frames(void **state)
{
	struct sbx_watch_frame f = { .kind = SBX_WATCH_HELLO, .seq = 3,
				     .boot_id = "b00", .watch_seq = 3 },
			       g;
	char *text;
	cJSON *j;

	text = print_take(sbx_watch_frame_encode(&f));
	assert_string_equal(text, "{\"seq\":3,\"kind\":\"hello\","
				  "\"boot_id\":\"b00\",\"watch_seq\":3}");
	free(text);
	f = (struct sbx_watch_frame){ .kind = SBX_WATCH_ENTRY, .seq = 9,
				      .path = "d/e/n" };
	j = reparse(sbx_watch_frame_encode(&f));
	assert_int_equal(sbx_watch_frame_decode(j, &g), 0);
	assert_int_equal(g.kind, SBX_WATCH_ENTRY);
	assert_int_equal(g.seq, 9);
	assert_string_equal(g.path, "d/e/n");
	assert_string_equal(g.name, "n");
	assert_int_equal(g.ino, 0); /* none sent: none decoded */
	cJSON_Delete(j);
	/* An entry with what the name holds now. */
	f.ino = 4242;
	text = print_take(sbx_watch_frame_encode(&f));
	assert_string_equal(text, "{\"seq\":9,\"kind\":\"entry\",\"ino\":4242,"
				  "\"path\":\"d/e/n\"}");
	j = parse(text);
	free(text);
	assert_int_equal(sbx_watch_frame_decode(j, &g), 0);
	assert_int_equal(g.ino, 4242);
	cJSON_Delete(j);
	/* Not a usable number: the event stands, without an identity. */
	j = parse("{\"seq\":1,\"kind\":\"entry\",\"path\":\"a\",\"ino\":-3}");
	assert_int_equal(sbx_watch_frame_decode(j, &g), 0);
	assert_int_equal(g.ino, 0);
	cJSON_Delete(j);
	/* A rename's new name, with the old one. */
	f = (struct sbx_watch_frame){ .kind = SBX_WATCH_ENTRY, .seq = 12,
				      .path = "logs/a.1", .from = "logs/a" };
	text = print_take(sbx_watch_frame_encode(&f));
	assert_string_equal(text, "{\"seq\":12,\"kind\":\"entry\","
				  "\"from\":\"logs/a\",\"path\":\"logs/a.1\"}");
	j = parse(text);
	free(text);
	assert_int_equal(sbx_watch_frame_decode(j, &g), 0);
	assert_string_equal(g.path, "logs/a.1");
	assert_string_equal(g.from, "logs/a");
	cJSON_Delete(j);
	/* A malformed old name is dropped, the event stands. */
	j = parse("{\"seq\":1,\"kind\":\"entry\",\"path\":\"a\","
		  "\"from\":\"/etc/x\"}");
	assert_int_equal(sbx_watch_frame_decode(j, &g), 0);
	assert_string_equal(g.path, "a");
	assert_null(g.from);
	cJSON_Delete(j);
	j = parse("{\"seq\":1,\"kind\":\"entry\",\"path\":\"a\",\"from\":7}");
	assert_int_equal(sbx_watch_frame_decode(j, &g), 0);
	assert_null(g.from);
	cJSON_Delete(j);
	f = (struct sbx_watch_frame){ .kind = SBX_WATCH_OVERFLOW, .seq = 10 };
	text = print_take(sbx_watch_frame_encode(&f));
	assert_string_equal(text, "{\"seq\":10,\"kind\":\"overflow\"}");
	free(text);
	f = (struct sbx_watch_frame){ .kind = SBX_WATCH_HEARTBEAT,
				      .watch_seq = 11 };
	text = print_take(sbx_watch_frame_encode(&f));
	assert_string_equal(text, "{\"kind\":\"heartbeat\",\"watch_seq\":11}");
	free(text);

	/* malformed (-EPROTO) and unknown (ignored as OTHER) */
	check_watch("{\"kind\":\"hello\",\"watch_seq\":1}", -EPROTO);
	check_watch("{\"kind\":\"data\",\"path\":\"x\"}", -EPROTO);
	check_watch("{\"kind\":\"data\",\"seq\":-1,\"path\":\"x\"}", -EPROTO);
	check_watch("{\"kind\":\"data\",\"seq\":1e300,\"path\":\"x\"}",
		    -EPROTO);
	check_watch("{\"kind\":\"attr\",\"seq\":1,\"path\":\"/abs\"}", -EPROTO);
	check_watch("{\"kind\":\"entry\",\"seq\":1,\"path\":\"\"}", -EPROTO);
	check_watch("{\"kind\":\"entry\",\"seq\":1,\"path\":\"d/\"}", -EPROTO);
	check_watch("{\"kind\":\"future\",\"seq\":1}", SBX_WATCH_OTHER);
	check_watch("{\"kind\":\"heartbeat\"}", SBX_WATCH_OTHER);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_path_rules),
		cmocka_unit_test(test_batch_roundtrip),
		cmocka_unit_test(test_batch_wire),
		cmocka_unit_test(test_batch_malformed),
		cmocka_unit_test(test_batch_result),
		cmocka_unit_test(test_bulk_frames),
		cmocka_unit_test(test_watch_frames),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
