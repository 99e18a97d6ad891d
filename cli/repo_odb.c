/* Object id sets and pack index reading for the seed and the pull. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <git2.h>

#include "sbx/xmalloc.h"
#include "repo_i.h"

static size_t oid_hash(const git_oid *id)
{
	size_t h;

	memcpy(&h, id->id, sizeof(h));
	return h;
}

bool cli_oidset_has(const struct cli_oidset *s, const git_oid *id)
{
	if (!s->cap)
		return false;
	for (size_t i = oid_hash(id) & (s->cap - 1); s->used[i];
	     i = (i + 1) & (s->cap - 1))
		if (git_oid_equal(&s->slots[i], id))
			return true;
	return false;
}

void cli_oidset_add(struct cli_oidset *s, const git_oid *id)
{
	size_t i;

	if (cli_oidset_has(s, id))
		return;
	if (2 * (s->n + 1) > s->cap) {
		struct cli_oidset big = { 0 };

		big.cap = s->cap ? 2 * s->cap : 256;
		big.slots = sbx_xcalloc(big.cap, sizeof(*big.slots));
		big.used = sbx_xcalloc(big.cap, 1);
		for (size_t k = 0; k < s->cap; k++)
			if (s->used[k])
				cli_oidset_add(&big, &s->slots[k]);
		free(s->slots);
		free(s->used);
		*s = big;
	}
	for (i = oid_hash(id) & (s->cap - 1); s->used[i];
	     i = (i + 1) & (s->cap - 1))
		;
	git_oid_cpy(&s->slots[i], id);
	s->used[i] = 1;
	s->n++;
}

void cli_oidset_fini(struct cli_oidset *s)
{
	free(s->slots);
	free(s->used);
	memset(s, 0, sizeof(*s));
}

/*
 * Version 2: "\377tOc", version, fan-out[256], the ids.  Version 1:
 * fan-out[256], then (4-byte offset, id) pairs.  Fan-out[255] is the
 * object count.
 */
int cli_idx_oids(git_oid **ids_out, size_t *n_out, const unsigned char *d,
		 size_t len)
{
	static const unsigned char v2[8] = { 0xff, 't', 'O', 'c', 0, 0, 0, 2 };
	const unsigned char *fan;
	size_t n, base, stride;
	git_oid *ids;

	*ids_out = NULL;
	*n_out = 0;
	if (len >= 8 && memcmp(d, v2, 8) == 0) {
		fan = d + 8;
		base = 8 + 1024;
		stride = 20;
	} else {
		fan = d;
		base = 1024 + 4;
		stride = 24;
	}
	if (len < base)
		return -EINVAL;
	n = (size_t)fan[1020] << 24 | (size_t)fan[1021] << 16 |
	    (size_t)fan[1022] << 8 | fan[1023];
	if (n > (len - base) / stride)
		return -EINVAL;
	ids = sbx_xcalloc(n + 1, sizeof(git_oid));
	for (size_t i = 0; i < n; i++)
		git_oid_fromraw(&ids[i], d + base + i * stride);
	*ids_out = ids;
	*n_out = n;
	return 0;
}
