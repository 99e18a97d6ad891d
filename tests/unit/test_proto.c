/* Unit tests: lib/proto.c (agent wire protocol). */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "sbx/buf.h"
#include "sbx/json.h"
#include "sbx/proto.h"

static void test_stat_roundtrip(void **state)
{
	struct stat st, back;
	cJSON *j;
	char *text;

	memset(&st, 0, sizeof(st));
	st.st_ino = UINT64_MAX - 5; /* does not fit a double */
	st.st_dev = 0xfedcba9876543210ULL;
	st.st_mode = S_IFREG | 0644;
	st.st_nlink = 3;
	st.st_uid = 1000;
	st.st_gid = 4294967294U;
	st.st_rdev = 0;
	st.st_size = 123456789012LL;
	st.st_blocks = 88;
	st.st_atim.tv_sec = -5;
	st.st_atim.tv_nsec = 999999999;
	st.st_mtim.tv_sec = 1700000000;
	st.st_mtim.tv_nsec = 1;
	st.st_ctim.tv_sec = 1700000001;
	st.st_ctim.tv_nsec = 500;
	j = sbx_proto_stat_to_json(&st);
	text = cJSON_PrintUnformatted(j);
	assert_non_null(strstr(text, "\"18446744073709551610\""));
	cJSON_free(text);
	assert_int_equal(sbx_proto_stat_from_json(j, &back), 0);
	assert_true(back.st_ino == st.st_ino);
	assert_true(back.st_dev == st.st_dev);
	assert_int_equal(back.st_mode, st.st_mode);
	assert_int_equal(back.st_nlink, 3);
	assert_int_equal(back.st_gid, 4294967294U);
	assert_int_equal(back.st_size, st.st_size);
	assert_int_equal(back.st_blocks, 88);
	assert_int_equal(back.st_atim.tv_sec, -5);
	assert_int_equal(back.st_atim.tv_nsec, 999999999);
	assert_int_equal(back.st_mtim.tv_sec, 1700000000);
	assert_int_equal(back.st_ctim.tv_nsec, 500);
	cJSON_Delete(j);
}

static int decode(const char *text, struct stat *st)
{
	cJSON *j = cJSON_Parse(text);
	int rc;

	assert_non_null(j);
	rc = sbx_proto_stat_from_json(j, st);
	cJSON_Delete(j);
	return rc;
}

static void test_stat_bad(void **state)
{
	struct stat st;

	assert_int_equal(decode("{}", &st), -EPROTO);
	assert_int_equal(decode("[1,2,3]", &st), -EPROTO);
	/* ino as a number instead of a string */
	assert_int_equal(
		decode("[1,1,1,0,0,0,0,0,0,0,0,0,0,0,\"1\"]", &st), -EPROTO);
	/* ino overflow */
	assert_int_equal(decode("[\"18446744073709551616\",1,1,0,0,0,0,0,0,0,"
				"0,0,0,0,\"1\"]",
				&st),
			 -EPROTO);
	/* ino not decimal */
	assert_int_equal(
		decode("[\"-1\",1,1,0,0,0,0,0,0,0,0,0,0,0,\"1\"]", &st),
		-EPROTO);
	assert_int_equal(
		decode("[\"\",1,1,0,0,0,0,0,0,0,0,0,0,0,\"1\"]", &st),
		-EPROTO);
	/* negative size, fractional mode, ns out of range */
	assert_int_equal(
		decode("[\"1\",1,1,0,0,0,-1,0,0,0,0,0,0,0,\"1\"]", &st),
		-EPROTO);
	assert_int_equal(
		decode("[\"1\",1.5,1,0,0,0,0,0,0,0,0,0,0,0,\"1\"]", &st),
		-EPROTO);
	assert_int_equal(decode("[\"1\",1,1,0,0,0,0,0,0,1000000000,0,0,0,0,"
				"\"1\"]",
				&st),
			 -EPROTO);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_PROTO);
	/* Extra trailing fields are accepted (additive changes). */
	assert_int_equal(decode("[\"7\",33188,1,0,0,0,5,0,0,0,0,0,0,0,\"9\","
				"\"extra\"]",
				&st),
			 0);
	assert_int_equal(st.st_ino, 7);
	assert_int_equal(st.st_size, 5);
}

static void test_statvfs(void **state)
{
	struct statvfs sv, back;
	cJSON *j;

	memset(&sv, 0, sizeof(sv));
	sv.f_bsize = 4096;
	sv.f_frsize = 4096;
	sv.f_blocks = 1000;
	sv.f_bfree = 500;
	sv.f_bavail = 400;
	sv.f_files = 100;
	sv.f_ffree = 50;
	sv.f_namemax = 255;
	j = sbx_proto_statvfs_to_json(&sv);
	assert_int_equal(sbx_proto_statvfs_from_json(j, &back), 0);
	assert_int_equal(back.f_blocks, 1000);
	assert_int_equal(back.f_bavail, 400);
	assert_int_equal(back.f_namemax, 255);
	cJSON_DeleteItemFromObject(j, "bfree");
	assert_int_equal(sbx_proto_statvfs_from_json(j, &back), -EPROTO);
	cJSON_Delete(j);
}

static void test_errors(void **state)
{
	cJSON *j = sbx_proto_error_to_json(-ENOENT, "no such file: a/b");
	cJSON *inner;
	char *text = cJSON_PrintUnformatted(j);

	assert_string_equal(
		text,
		"{\"error\":{\"errno\":\"ENOENT\",\"message\":\"no such file: "
		"a/b\"}}");
	cJSON_free(text);
	sbx_error_clear();
	assert_int_equal(sbx_proto_error_from_json(j, "stat a/b"), -ENOENT);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_REMOTE);
	assert_string_equal(sbx_error_last()->msg,
			    "stat a/b: no such file: a/b");
	/* The inner object alone works too. */
	inner = cJSON_GetObjectItem(j, "error");
	assert_int_equal(sbx_proto_error_from_json(inner, "x"), -ENOENT);
	cJSON_Delete(j);

	/* Unknown name → EIO; missing message → strerror. */
	j = cJSON_Parse("{\"error\":{\"errno\":\"EWHATEVER\"}}");
	assert_int_equal(sbx_proto_error_from_json(j, "ctx"), -EIO);
	cJSON_Delete(j);
	j = cJSON_Parse("{\"error\":\"oops\"}");
	assert_int_equal(sbx_proto_error_from_json(j, "ctx"), -EPROTO);
	cJSON_Delete(j);
	j = cJSON_Parse("{\"ok\":true}");
	assert_int_equal(sbx_proto_error_from_json(j, "ctx"), 0);
	cJSON_Delete(j);
	assert_int_equal(sbx_proto_error_from_json(NULL, "ctx"), 0);

	/* Unknown errno number: EIO on the wire, never a crash. */
	j = sbx_proto_error_to_json(-99999, NULL);
	assert_string_equal(
		cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "errno")
			->valuestring,
		"EIO");
	cJSON_Delete(j);
}

static void test_http_status(void **state)
{
	assert_int_equal(sbx_proto_http_status(0), 200);
	assert_int_equal(sbx_proto_http_status(-EINVAL), 400);
	assert_int_equal(sbx_proto_http_status(-EACCES), 403);
	assert_int_equal(sbx_proto_http_status(-EPERM), 403);
	assert_int_equal(sbx_proto_http_status(-ENOENT), 404);
	assert_int_equal(sbx_proto_http_status(-EEXIST), 409);
	assert_int_equal(sbx_proto_http_status(-ENOTEMPTY), 409);
	assert_int_equal(sbx_proto_http_status(-EBUSY), 409);
	assert_int_equal(sbx_proto_http_status(-EFBIG), 413);
	assert_int_equal(sbx_proto_http_status(-EIO), 500);
	assert_int_equal(sbx_proto_http_status(-EXDEV), 500);
}

/* Collects decoded frames as "json|payload;" for comparison. */
struct collect {
	struct sbx_buf out;
	int frames;
	int stop_at; /* return 7 from this frame on; 0: never */
};

static int collect_cb(const cJSON *hdr, const void *data, size_t len,
		      void *payload)
{
	struct collect *c = payload;
	char *t = cJSON_PrintUnformatted(hdr);

	assert_int_equal(sbx_buf_adds(&c->out, t), 0);
	cJSON_free(t);
	assert_int_equal(sbx_buf_adds(&c->out, "|"), 0);
	if (len)
		assert_int_equal(sbx_buf_add(&c->out, data, len), 0);
	else
		assert_null(data);
	assert_int_equal(sbx_buf_adds(&c->out, ";"), 0);
	c->frames++;
	if (c->stop_at && c->frames >= c->stop_at)
		return 7;
	return 0;
}

static void make_stream(struct sbx_buf *s)
{
	cJSON *h;

	sbx_buf_init(s, 1 << 22);
	h = cJSON_Parse("{\"seq\":1,\"stream\":\"stdout\"}");
	assert_int_equal(sbx_frame_encode_data(s, h, "hello", 5), 0);
	cJSON_Delete(h);
	h = cJSON_Parse("{\"kind\":\"heartbeat\"}");
	assert_int_equal(sbx_frame_encode(s, h, NULL, 0), 0);
	cJSON_Delete(h);
	h = cJSON_Parse("{\"file\":\"empty\"}");
	assert_int_equal(sbx_frame_encode_data(s, h, NULL, 0), 0);
	cJSON_Delete(h);
	h = cJSON_Parse("{\"end\":true}");
	assert_int_equal(sbx_frame_encode(s, h, NULL, 0), 0);
	cJSON_Delete(h);
}

static const char expected[] =
	"{\"seq\":1,\"stream\":\"stdout\",\"len\":5}|hello;"
	"{\"kind\":\"heartbeat\"}|;"
	"{\"file\":\"empty\",\"len\":0}|;"
	"{\"end\":true}|;";

static void test_frames_chunking(void **state)
{
	struct sbx_buf s;

	make_stream(&s);
	/* Every chunk size from 1 byte to the whole stream. */
	for (size_t chunk = 1; chunk <= s.len; chunk++) {
		struct sbx_frame_parser p;
		struct collect c = { .stop_at = 0 };

		sbx_buf_init(&c.out, 4096);
		sbx_frame_parser_init(&p, collect_cb, &c);
		for (size_t off = 0; off < s.len; off += chunk) {
			size_t n = s.len - off < chunk ? s.len - off : chunk;

			assert_int_equal(
				sbx_frame_parser_feed(&p, s.data + off, n), 0);
		}
		assert_true(p.ended);
		assert_int_equal(c.frames, 4);
		assert_string_equal(sbx_buf_ptr(&c.out), expected);
		sbx_frame_parser_fini(&p);
		sbx_buf_fini(&c.out);
	}
	sbx_buf_fini(&s);
}

static void test_frames_stop_and_after_end(void **state)
{
	struct sbx_buf s;
	struct sbx_frame_parser p;
	struct collect c = { .stop_at = 2 };

	make_stream(&s);
	sbx_buf_init(&c.out, 4096);
	sbx_frame_parser_init(&p, collect_cb, &c);
	assert_int_equal(sbx_frame_parser_feed(&p, s.data, s.len), 7);
	assert_int_equal(c.frames, 2);
	sbx_frame_parser_fini(&p);
	sbx_buf_fini(&c.out);

	/* Bytes after the end record are a protocol error. */
	c.stop_at = 0;
	c.frames = 0;
	sbx_buf_init(&c.out, 4096);
	sbx_frame_parser_init(&p, collect_cb, &c);
	assert_int_equal(sbx_frame_parser_feed(&p, s.data, s.len), 0);
	assert_int_equal(sbx_frame_parser_feed(&p, s.data, 4), -EPROTO);
	sbx_frame_parser_fini(&p);
	sbx_buf_fini(&c.out);
	sbx_buf_fini(&s);
}

static int feed_raw(const void *data, size_t n)
{
	struct sbx_frame_parser p;
	int rc;

	sbx_frame_parser_init(&p, NULL, NULL);
	rc = sbx_frame_parser_feed(&p, data, n);
	sbx_frame_parser_fini(&p);
	return rc;
}

/* One record with header `json` (length computed) and `extra` bytes. */
static int feed_json(const char *json, const char *extra)
{
	unsigned char b[256];
	size_t n = strlen(json), e = strlen(extra);

	assert_true(4 + n + e <= sizeof(b));
	b[0] = b[1] = 0;
	b[2] = (unsigned char)(n >> 8);
	b[3] = (unsigned char)n;
	memcpy(b + 4, json, n);
	memcpy(b + 4 + n, extra, e);
	return feed_raw(b, 4 + n + e);
}

static void test_frames_hostile(void **state)
{
	/* header length 0, huge, over the 64 KiB cap */
	assert_int_equal(feed_raw("\0\0\0\0", 4), -EPROTO);
	assert_int_equal(feed_raw("\xff\xff\xff\xff", 4), -EPROTO);
	assert_int_equal(feed_raw("\0\1\0\1", 4), -EPROTO);
	/* not JSON, not an object, trailing garbage, bad "len" */
	assert_int_equal(feed_json("abc", ""), -EPROTO);
	assert_int_equal(feed_json("1,2", ""), -EPROTO);
	assert_int_equal(feed_json("[]", ""), -EPROTO);
	assert_int_equal(feed_json("{}xx", ""), -EPROTO);
	assert_int_equal(feed_json("{\"a\":", ""), -EPROTO);
	assert_int_equal(feed_json("{\"len\":-1}", ""), -EPROTO);
	assert_int_equal(feed_json("{\"len\":1.5}", "x"), -EPROTO);
	assert_int_equal(feed_json("{\"len\":\"abc\"}", ""), -EPROTO);
	assert_int_equal(feed_json("{\"len\":99999999}", ""), -EPROTO);
	assert_int_equal(feed_json("{\"len\":1e400}", ""), -EPROTO);
	/* whitespace after the object is fine */
	assert_int_equal(feed_json("{} \n", ""), 0);
	/* a partial frame is fine (waits for more) */
	assert_int_equal(feed_raw("\0\0\0\010{\"len\":", 11), 0);
	assert_int_equal(feed_json("{\"len\":10}", "abc"), 0);
}

static void test_frame_encode_limits(void **state)
{
	struct sbx_buf s;
	cJSON *h = cJSON_CreateObject();
	char *big = calloc(1, SBX_PROTO_MAX_FRAME_DATA + 1);

	sbx_buf_init(&s, 100);
	/* over the buffer cap: nothing appended */
	assert_int_equal(sbx_buf_adds(&s, "x"), 0);
	assert_int_equal(sbx_frame_encode_data(&s, h, big, 200), -EFBIG);
	assert_int_equal(s.len, 1);
	assert_string_equal(sbx_buf_ptr(&s), "x");
	sbx_buf_fini(&s);
	sbx_buf_init(&s, 1 << 22);
	assert_int_equal(
		sbx_frame_encode_data(&s, h, big, SBX_PROTO_MAX_FRAME_DATA + 1),
		-EFBIG);
	assert_int_equal(s.len, 0);
	sbx_buf_fini(&s);
	free(big);
	cJSON_Delete(h);
}

static void check_clean(const char *in, const char *want)
{
	char *out = NULL;

	assert_int_equal(sbx_proto_path_clean(in, &out), 0);
	assert_string_equal(out, want);
	free(out);
}

static void test_paths(void **state)
{
	char *s = NULL;

	check_clean("", "");
	check_clean(".", "");
	check_clean("/", "");
	check_clean("//a//b/./c/", "a/b/c");
	check_clean("./a", "a");
	check_clean("a/.b/..c/...", "a/.b/..c/...");
	assert_int_equal(sbx_proto_path_clean("..", &s), -EINVAL);
	assert_null(s);
	assert_int_equal(sbx_proto_path_clean("a/../../x", &s), -EINVAL);
	assert_int_equal(sbx_proto_path_clean("/a/..", &s), -EINVAL);

	s = sbx_proto_path_join("", "a");
	assert_string_equal(s, "a");
	free(s);
	s = sbx_proto_path_join("d/e", "a");
	assert_string_equal(s, "d/e/a");
	free(s);
	s = sbx_proto_path_join("d", "");
	assert_string_equal(s, "d");
	free(s);

	s = sbx_proto_query_escape("a b/c%d&e=ü~._-");
	assert_string_equal(s, "a%20b%2Fc%25d%26e%3D%C3%BC~._-");
	free(s);
}

static void test_signals(void **state)
{
	assert_string_equal(sbx_proto_signal_name(SIGINT), "SIGINT");
	assert_string_equal(sbx_proto_signal_name(SIGWINCH), "SIGWINCH");
	assert_null(sbx_proto_signal_name(0));
	assert_null(sbx_proto_signal_name(12345));
	assert_int_equal(sbx_proto_signal_from_name("SIGTERM"), SIGTERM);
	assert_int_equal(sbx_proto_signal_from_name("KILL"), SIGKILL);
	assert_int_equal(sbx_proto_signal_from_name("SIGNOPE"), 0);
	assert_int_equal(sbx_proto_signal_from_name("9"), 0);
	assert_int_equal(sbx_proto_signal_from_name(NULL), 0);
	assert_int_equal(sbx_proto_signal_from_name(""), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stat_roundtrip),
		cmocka_unit_test(test_stat_bad),
		cmocka_unit_test(test_statvfs),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_http_status),
		cmocka_unit_test(test_frames_chunking),
		cmocka_unit_test(test_frames_stop_and_after_end),
		cmocka_unit_test(test_frames_hostile),
		cmocka_unit_test(test_frame_encode_limits),
		cmocka_unit_test(test_paths),
		cmocka_unit_test(test_signals),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
