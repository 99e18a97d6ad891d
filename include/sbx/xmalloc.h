/*
 * Allocation that cannot fail: on out-of-memory these print a message and
 * abort(), so callers have no hand-written ENOMEM paths (tmux, OpenSSH).
 * Everything they return is released with free().
 */
#ifndef SBX_XMALLOC_H
#define SBX_XMALLOC_H

#include <stddef.h>

#include "sbx/error.h"

void *sbx_xmalloc(size_t size);
void *sbx_xcalloc(size_t nmemb, size_t size);
void *sbx_xrealloc(void *ptr, size_t size);
char *sbx_xstrdup(const char *s);
char *sbx_xstrndup(const char *s, size_t n);
/* Formatted allocation: returns a malloc'd string. */
char *sbx_xasprintf(const char *fmt, ...) SBX_PRINTF(1, 2);

#endif
