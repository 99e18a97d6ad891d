/* Allocation that aborts on exhaustion; see sbx/xmalloc.h. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sbx/xmalloc.h"

static void oom(size_t size)
{
	char msg[96];
	int n = snprintf(msg, sizeof(msg), "sbx: out of memory (%zu bytes)\n",
			 size);

	if (n > 0 && write(STDERR_FILENO, msg, (size_t)n) < 0)
		abort();
	abort();
}

void *sbx_xmalloc(size_t size)
{
	void *p = malloc(size ? size : 1);

	if (!p)
		oom(size);
	return p;
}

void *sbx_xcalloc(size_t nmemb, size_t size)
{
	void *p = calloc(nmemb ? nmemb : 1, size ? size : 1);

	if (!p)
		oom(nmemb * size);
	return p;
}

void *sbx_xrealloc(void *ptr, size_t size)
{
	void *p = realloc(ptr, size ? size : 1);

	if (!p)
		oom(size);
	return p;
}

char *sbx_xstrdup(const char *s)
{
	char *p = strdup(s);

	if (!p)
		oom(strlen(s) + 1);
	return p;
}

char *sbx_xstrndup(const char *s, size_t n)
{
	char *p = strndup(s, n);

	if (!p)
		oom(n + 1);
	return p;
}

char *sbx_xasprintf(const char *fmt, ...)
{
	va_list ap;
	char *p = NULL;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&p, fmt, ap);
	va_end(ap);
	if (n < 0)
		oom(0);
	return p;
}
