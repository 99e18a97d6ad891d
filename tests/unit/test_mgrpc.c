/*
 * Unit tests: the pure parts of the Modal gRPC client
 * (providers/modal/mgrpc.c, mgrpc_i.h): length-prefixed framing both ways,
 * the mapping of gRPC status codes (and of a proxy's HTTP status) to
 * errnos and error classes, grpc-message decoding, deadlines and the
 * retry backoff.  The wire end to end is tests/integration/test_mgrpc.py.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sbx/error.h"
#include "../../providers/modal/mgrpc_i.h"
#include "modal_api.pb-c.h"

static void test_frame_round_trip(void **state)
{
	Modal__Client__SandboxWaitRequest req =
		MODAL__CLIENT__SANDBOX_WAIT_REQUEST__INIT;
	Modal__Client__SandboxWaitRequest *back;
	uint8_t *f, two[64];
	size_t len, mlen;

	req.sandbox_id = "sb-123";
	req.timeout = 5.0f;
	f = mgrpc_frame(&req.base, &len);
	assert_int_equal(f[0], 0);
	assert_int_equal(len, 5 + protobuf_c_message_get_packed_size(&req.base));
	assert_int_equal((size_t)f[1] << 24 | (size_t)f[2] << 16 |
				 (size_t)f[3] << 8 | f[4], len - 5);
	/* Incomplete until every byte is there. */
	for (size_t i = 0; i < len; i++)
		assert_int_equal(mgrpc_frame_next(f, i, &mlen), 0);
	assert_int_equal(mgrpc_frame_next(f, len, &mlen), 1);
	assert_int_equal(mlen, len - 5);
	back = modal__client__sandbox_wait_request__unpack(NULL, mlen, f + 5);
	assert_non_null(back);
	assert_string_equal(back->sandbox_id, "sb-123");
	modal__client__sandbox_wait_request__free_unpacked(back, NULL);

	/* Two frames back to back: the first is delivered on its own. */
	assert_true(2 * len <= sizeof(two));
	memcpy(two, f, len);
	memcpy(two + len, f, len);
	assert_int_equal(mgrpc_frame_next(two, 2 * len, &mlen), 1);
	assert_int_equal(mlen, len - 5);
	assert_int_equal(mgrpc_frame_next(two + 5 + mlen, len, &mlen), 1);
	free(f);
}

static void test_frame_refused(void **state)
{
	uint8_t compressed[] = {1, 0, 0, 0, 1, 0};
	uint8_t flags[] = {0x80, 0, 0, 0, 0};
	uint8_t huge[] = {0, 0xff, 0xff, 0xff, 0xff};
	uint8_t empty[] = {0, 0, 0, 0, 0};
	size_t mlen;

	assert_int_equal(mgrpc_frame_next(compressed, sizeof(compressed),
					  &mlen), -EPROTO);
	assert_int_equal(mgrpc_frame_next(flags, sizeof(flags), &mlen),
			 -EPROTO);
	assert_int_equal(mgrpc_frame_next(huge, sizeof(huge), &mlen),
			 -EMSGSIZE);
	assert_int_equal(mlen, 0xffffffffu);
	/* An empty message is a complete frame. */
	assert_int_equal(mgrpc_frame_next(empty, sizeof(empty), &mlen), 1);
	assert_int_equal(mlen, 0);
}

static void test_status_mapping(void **state)
{
	static const struct {
		int code, err, klass;
		bool retry;
	} t[] = {
		{MGRPC_OK, 0, SBX_ERR_REMOTE, false},
		{MGRPC_CANCELLED, -EIO, SBX_ERR_REMOTE, true},
		{MGRPC_UNKNOWN, -EIO, SBX_ERR_REMOTE, true},
		{MGRPC_INVALID_ARGUMENT, -EINVAL, SBX_ERR_REMOTE, false},
		{MGRPC_DEADLINE_EXCEEDED, -ETIMEDOUT, SBX_ERR_REMOTE, true},
		{MGRPC_NOT_FOUND, -ENOENT, SBX_ERR_NOTFOUND, false},
		{MGRPC_ALREADY_EXISTS, -EEXIST, SBX_ERR_REMOTE, false},
		{MGRPC_PERMISSION_DENIED, -EACCES, SBX_ERR_CONFIG, false},
		{MGRPC_RESOURCE_EXHAUSTED, -EAGAIN, SBX_ERR_REMOTE, false},
		{MGRPC_FAILED_PRECONDITION, -EINVAL, SBX_ERR_REMOTE, false},
		{MGRPC_ABORTED, -EIO, SBX_ERR_REMOTE, false},
		{MGRPC_UNIMPLEMENTED, -EIO, SBX_ERR_REMOTE, false},
		{MGRPC_INTERNAL, -EIO, SBX_ERR_REMOTE, true},
		{MGRPC_UNAVAILABLE, -EAGAIN, SBX_ERR_REMOTE, true},
		{MGRPC_DATA_LOSS, -EIO, SBX_ERR_REMOTE, false},
		{MGRPC_UNAUTHENTICATED, -EACCES, SBX_ERR_CONFIG, false},
		{42, -EIO, SBX_ERR_REMOTE, false},
	};

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		assert_int_equal(mgrpc_errno_from_code(t[i].code), t[i].err);
		assert_int_equal(mgrpc_class_from_code(t[i].code),
				 t[i].klass);
		assert_int_equal(mgrpc_code_is_retryable(t[i].code),
				 t[i].retry);
	}
	assert_string_equal(mgrpc_code_name(MGRPC_UNAVAILABLE),
			    "UNAVAILABLE");
}

static void test_http_mapping(void **state)
{
	static const long status[] = {400, 401, 403, 404, 429, 502, 503, 504,
				      500, 200};
	static const int code[] = {
		MGRPC_INTERNAL, MGRPC_UNAUTHENTICATED, MGRPC_PERMISSION_DENIED,
		MGRPC_UNIMPLEMENTED, MGRPC_UNAVAILABLE, MGRPC_UNAVAILABLE,
		MGRPC_UNAVAILABLE, MGRPC_UNAVAILABLE, MGRPC_UNKNOWN,
		MGRPC_UNKNOWN,
	};

	for (size_t i = 0; i < sizeof(status) / sizeof(status[0]); i++)
		assert_int_equal(mgrpc_code_from_http(status[i]), code[i]);
}

static void test_percent_decode(void **state)
{
	static const struct {
		const char *in;
		size_t n;
		const char *out;
	} t[] = {
		{"no%20such%20sandbox", 19, "no such sandbox"},
		/* Invalid or cut escapes stay as they are. */
		{"100%zz%4", 8, "100%zz%4"},
		{"%C3%A9t%c3%a9", 13, "\xc3\xa9t\xc3\xa9"},
		/* Only `n` bytes. */
		{"abc%41", 3, "abc"},
	};

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		char *s = mgrpc_percent_decode(t[i].in, t[i].n);

		assert_string_equal(s, t[i].out);
		free(s);
	}
}

static void test_deadlines(void **state)
{
	struct mgrpc_call c = {0};
	char h[64];

	assert_int_equal(mgrpc_deadline_ms(NULL), MGRPC_DEFAULT_DEADLINE_MS);
	assert_int_equal(mgrpc_deadline_ms(&c), MGRPC_DEFAULT_DEADLINE_MS);
	c.deadline_ms = -5;
	assert_int_equal(mgrpc_deadline_ms(&c), MGRPC_DEFAULT_DEADLINE_MS);
	c.deadline_ms = 75000;
	assert_int_equal(mgrpc_deadline_ms(&c), 75000);
	mgrpc_timeout_header(h, sizeof(h), 75000);
	assert_string_equal(h, "grpc-timeout: 75000m");
	mgrpc_timeout_header(h, sizeof(h), 1000000000L);
	assert_string_equal(h, "grpc-timeout: 99999999m");

	assert_int_equal(mgrpc_retry_delay_ms(0), 100);
	assert_int_equal(mgrpc_retry_delay_ms(1), 200);
	assert_int_equal(mgrpc_retry_delay_ms(2), 400);
	assert_int_equal(mgrpc_retry_delay_ms(3), 800);
	assert_int_equal(mgrpc_retry_delay_ms(4), MGRPC_RETRY_MAX_MS);
	assert_int_equal(mgrpc_retry_delay_ms(40), MGRPC_RETRY_MAX_MS);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_frame_round_trip),
		cmocka_unit_test(test_frame_refused),
		cmocka_unit_test(test_status_mapping),
		cmocka_unit_test(test_http_mapping),
		cmocka_unit_test(test_percent_decode),
		cmocka_unit_test(test_deadlines),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
