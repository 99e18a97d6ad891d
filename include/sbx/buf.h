/*
 * A size-capped dynamic buffer (curl dynbuf style).
 *
 * Every buffer has a hard cap set at init, so input from the network or from
 * a file can never make it grow without bound: an append that would pass the
 * cap fails with -EFBIG and leaves the buffer as it was (unlike curl, the
 * content is kept so a caller may still report what it received).  The data
 * is always NUL-terminated, so text can be used as a C string directly.
 *
 * Memory: the buffer owns its storage; sbx_buf_fini() releases it,
 * sbx_buf_take() hands it to the caller (free() it).  Allocation failure
 * aborts (sbx/xmalloc.h), so -EFBIG is the only error.
 *
 * Threads: no internal locking; one buffer belongs to one thread at a time.
 */
#ifndef SBX_BUF_H
#define SBX_BUF_H

#include <stdarg.h>
#include <stddef.h>

#include "sbx/error.h"

struct sbx_buf {
	char *data;   /* NULL until the first append */
	size_t len;   /* bytes used, not counting the NUL */
	size_t alloc; /* bytes allocated */
	size_t cap;   /* maximum len */
};

/* Initialise an empty buffer that may hold at most `cap` bytes. */
void sbx_buf_init(struct sbx_buf *b, size_t cap);

/* Release the storage; the buffer may be reused after sbx_buf_init(). */
void sbx_buf_fini(struct sbx_buf *b);

/* Drop the content but keep the storage and the cap. */
void sbx_buf_reset(struct sbx_buf *b);

/*
 * Append `len` bytes.  -EFBIG (SBX_ERR_PROTO: "more than <cap> bytes") when
 * the result would exceed the cap; the buffer is then unchanged.
 */
SBX_WUR int sbx_buf_add(struct sbx_buf *b, const void *data, size_t len);

/* Append a C string (without its NUL).  Errors as sbx_buf_add(). */
SBX_WUR int sbx_buf_adds(struct sbx_buf *b, const char *s);

/* Append printf-formatted text.  Errors as sbx_buf_add(). */
SBX_WUR int sbx_buf_addf(struct sbx_buf *b, const char *fmt, ...)
	SBX_PRINTF(2, 3);
SBX_WUR int sbx_buf_vaddf(struct sbx_buf *b, const char *fmt, va_list ap)
	SBX_PRINTF(2, 0);

/* The content (NUL-terminated, never NULL: "" when empty).  Borrowed. */
const char *sbx_buf_ptr(const struct sbx_buf *b);

/* Bytes used. */
size_t sbx_buf_len(const struct sbx_buf *b);

/*
 * Hand the content to the caller: returns a malloc'd NUL-terminated string
 * (never NULL), stores its length in *len_out (may be NULL), and leaves the
 * buffer empty with the same cap.
 */
char *sbx_buf_take(struct sbx_buf *b, size_t *len_out);

#endif
