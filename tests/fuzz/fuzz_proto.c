/*
 * Fuzz target over everything the agent and the client parse from the
 * network: the frame decoder (fed in input-dependent chunk sizes), the stat
 * and statfs decoders, error objects, the batch decoder
 * (sbx_batch_decode), path normalisation, base64 and the route matcher.
 *
 * Built twice (tests/fuzz/meson.build): as a libFuzzer binary with clang
 * and -Dfuzzer=true, and always as a plain driver (fuzz_driver.c) that
 * replays the corpus plus deterministic mutations as a meson test.
 */
#include "config.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/proto.h"
#include "sbx/proto_batch.h"
#include "agent_i.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int count_cb(const cJSON *hdr, const void *d, size_t len, void *payload)
{
	size_t *n = payload;

	(void)hdr;
	(void)d;
	*n += len;
	return 0;
}

static void fuzz_frames(const uint8_t *data, size_t size)
{
	struct sbx_frame_parser p;
	size_t total = 0, off = 0;
	/* The first byte picks the chunking, so splits vary with input. */
	size_t step = size ? (size_t)data[0] % 17 + 1 : 1;

	sbx_frame_parser_init(&p, count_cb, &total);
	while (off < size) {
		size_t n = size - off < step ? size - off : step;

		if (sbx_frame_parser_feed(&p, data + off, n) != 0)
			break;
		off += n;
		step = step * 3 % 29 + 1;
	}
	sbx_frame_parser_fini(&p);
}

static void fuzz_json(const char *text, size_t size)
{
	cJSON *j = cJSON_ParseWithLength(text, size);
	struct stat st;
	struct statvfs sv;
	const cJSON *it;

	if (!j)
		return;
	if (sbx_proto_stat_from_json(j, &st) == 0) {
		cJSON *back = sbx_proto_stat_to_json(&st);

		cJSON_Delete(back);
	}
	(void)!sbx_proto_statvfs_from_json(j, &sv);
	(void)sbx_proto_error_from_json(j, "fuzz");
	/* Stat arrays nested in listings. */
	cJSON_ArrayForEach(it, j)
	{
		(void)!sbx_proto_stat_from_json(it, &st);
	}
	cJSON_Delete(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 1);
	struct sbx_batch *b = NULL;
	const struct agent_route *route;
	unsigned char *bin = NULL;
	char *out = NULL, *id = NULL;
	size_t blen;

	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';

	fuzz_frames(data, size);
	fuzz_json(text, size);

	if (sbx_batch_decode(text, size, &b) == 0)
		sbx_batch_free(b);

	if (agent_path_norm(text, &out) == 0)
		free(out);
	if (sbx_proto_path_clean(text, &out) == 0)
		free(out);
	out = sbx_proto_query_escape(text);
	free(out);
	if (sbx_proto_base64_decode(text, &bin, &blen) == 0) {
		out = sbx_proto_base64_encode(bin, blen);
		free(out);
		free(bin);
	}
	(void)sbx_proto_signal_from_name(text);
	for (int m = 0; m < 3; m++) {
		static const char *const methods[] = { "GET", "POST",
						       "DELETE" };

		if (agent_route_find(&route, &id, methods[m], text) == 0)
			free(id);
	}
	free(text);
	return 0;
}
