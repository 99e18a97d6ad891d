/* Shared helpers for the lib/ unit tests: temporary directories. */
#ifndef SBX_TEST_HELPERS_I_H
#define SBX_TEST_HELPERS_I_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A fresh directory under $TMPDIR; caller frees the string. */
static inline char *th_tmpdir(void)
{
	const char *base = getenv("TMPDIR");
	char tmpl[4096];
	char *d;

	snprintf(tmpl, sizeof(tmpl), "%s/sbx-test-XXXXXX",
		 base && *base ? base : "/tmp");
	d = mkdtemp(tmpl);
	return d ? strdup(d) : NULL;
}

static inline int th_rm1(const char *path, const struct stat *st, int flag,
			 struct FTW *ftw)
{
	return remove(path);
}

/* rm -rf of a directory made by th_tmpdir(), for test cleanup only. */
static inline void th_rmrf(const char *dir)
{
	if (!dir || !strstr(dir, "/sbx-test-"))
		return;
	nftw(dir, th_rm1, 16, FTW_DEPTH | FTW_PHYS);
}

/* Write a small file, creating it with mode 0644. */
static inline void th_write(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f)
		abort();
	fputs(text, f);
	fclose(f);
}

#endif
