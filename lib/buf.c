/* Size-capped dynamic buffer; see sbx/buf.h. */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sbx/buf.h"
#include "sbx/xmalloc.h"

#define MIN_ALLOC 64

void sbx_buf_init(struct sbx_buf *b, size_t cap)
{
	b->data = NULL;
	b->len = 0;
	b->alloc = 0;
	b->cap = cap;
}

void sbx_buf_fini(struct sbx_buf *b)
{
	if (!b)
		return;
	free(b->data);
	b->data = NULL;
	b->len = 0;
	b->alloc = 0;
}

void sbx_buf_reset(struct sbx_buf *b)
{
	b->len = 0;
	if (b->data)
		b->data[0] = '\0';
}

/* Make room for `extra` more bytes plus the NUL, within the cap. */
static int grow(struct sbx_buf *b, size_t extra)
{
	size_t need, n;

	if (extra > b->cap || b->len > b->cap - extra)
		return sbx_error_set(SBX_ERR_PROTO, -EFBIG,
				     "data too large: more than %zu bytes",
				     b->cap);
	need = b->len + extra + 1;
	if (need <= b->alloc)
		return 0;
	/* Double, so that n appends cost O(n) copies overall. */
	n = b->alloc ? b->alloc : MIN_ALLOC;
	while (n < need)
		n = n > SIZE_MAX / 2 ? need : n * 2;
	/* Never past cap + 1 (the NUL); cap == SIZE_MAX means no cap. */
	if (b->cap != SIZE_MAX && n > b->cap + 1)
		n = b->cap + 1;
	b->data = sbx_xrealloc(b->data, n);
	b->alloc = n;
	return 0;
}

int sbx_buf_add(struct sbx_buf *b, const void *data, size_t len)
{
	int rc = grow(b, len);

	if (rc < 0)
		return rc;
	if (len)
		memcpy(b->data + b->len, data, len);
	b->len += len;
	b->data[b->len] = '\0';
	return 0;
}

int sbx_buf_adds(struct sbx_buf *b, const char *s)
{
	return sbx_buf_add(b, s, strlen(s));
}

int sbx_buf_vaddf(struct sbx_buf *b, const char *fmt, va_list ap)
{
	va_list ap2;
	int n, rc;

	va_copy(ap2, ap);
	n = vsnprintf(NULL, 0, fmt, ap2);
	va_end(ap2);
	if (n < 0)
		return sbx_error_set(SBX_ERR_INTERNAL, -EINVAL,
				     "bad format string");
	rc = grow(b, (size_t)n);
	if (rc < 0)
		return rc;
	vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
	b->len += (size_t)n;
	return 0;
}

int sbx_buf_addf(struct sbx_buf *b, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = sbx_buf_vaddf(b, fmt, ap);
	va_end(ap);
	return rc;
}

const char *sbx_buf_ptr(const struct sbx_buf *b)
{
	return b->data ? b->data : "";
}

size_t sbx_buf_len(const struct sbx_buf *b)
{
	return b->len;
}

char *sbx_buf_take(struct sbx_buf *b, size_t *len_out)
{
	char *p = b->data ? b->data : sbx_xstrdup("");

	if (len_out)
		*len_out = b->len;
	b->data = NULL;
	b->len = 0;
	b->alloc = 0;
	return p;
}
