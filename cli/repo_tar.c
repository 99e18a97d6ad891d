/*
 * A streaming tar writer for the seed (repo_i.h): POSIX ustar headers, a
 * pax extended header ('x') before an entry whose name or link target
 * does not fit ustar's fields.  The agent reads it with agent/tar.c.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sbx/xmalloc.h"
#include "repo_i.h"

#define BLOCK 512

static int put(struct cli_tar *t, const void *data, size_t len)
{
	const char *p = data;

	while (len) {
		/* A socket: no SIGPIPE when the agent stopped reading. */
		ssize_t n = send(t->fd, p, len, MSG_NOSIGNAL);

		if (n < 0 && errno == ENOTSOCK)
			n = write(t->fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return sbx_error_os("send the repository");
		p += n;
		len -= (size_t)n;
		t->written += (uint64_t)n;
	}
	if (t->progress)
		return t->progress(t->written, t->payload);
	return 0;
}

static int pad(struct cli_tar *t, uint64_t size)
{
	static const char zero[BLOCK];
	size_t r = (size_t)(size % BLOCK);

	return r ? put(t, zero, BLOCK - r) : 0;
}

/* `width` - 1 octal digits and a NUL (callers keep v in range). */
static void octal(char *field, size_t width, uint64_t v)
{
	for (size_t i = width - 1; i-- > 0; v >>= 3)
		field[i] = (char)('0' + (v & 7));
	field[width - 1] = '\0';
}

/* One pax record "LEN key=value\n" (LEN counts the whole record). */
static void pax_record(char **buf, size_t *len, const char *key,
		       const char *value)
{
	size_t body = strlen(key) + strlen(value) + 3; /* ' ', '=', '\n' */
	size_t digits = 1, total;
	char *rec;

	for (;;) {
		size_t d = 1;

		total = body + digits;
		for (size_t x = total; x >= 10; x /= 10)
			d++;
		if (d == digits)
			break;
		digits = d;
	}
	rec = sbx_xasprintf("%zu %s=%s\n", total, key, value);
	*buf = sbx_xrealloc(*buf, *len + total);
	memcpy(*buf + *len, rec, total);
	*len += total;
	free(rec);
}

static void header(char *h, const char *name, const char *link, char type,
		   unsigned mode, int64_t mtime, uint64_t size)
{
	unsigned sum = 0;

	memset(h, 0, BLOCK);
	snprintf(h, 100, "%s", name);
	octal(h + 100, 8, mode & 07777);
	octal(h + 108, 8, 0);
	octal(h + 116, 8, 0);
	octal(h + 124, 12, size);
	octal(h + 136, 12, mtime > 0 ? (uint64_t)mtime : 0);
	memset(h + 148, ' ', 8);
	h[156] = type;
	if (link)
		snprintf(h + 157, 100, "%s", link);
	memcpy(h + 257, "ustar", 6);
	memcpy(h + 263, "00", 2);
	for (int i = 0; i < BLOCK; i++)
		sum += (unsigned char)h[i];
	snprintf(h + 148, 8, "%06o", sum);
}

static int entry(struct cli_tar *t, const char *name, const char *link,
		 char type, unsigned mode, int64_t mtime, uint64_t size)
{
	char h[BLOCK];
	int rc;

	if (strlen(name) >= 100 || (link && strlen(link) >= 100) ||
	    size >= 077777777777ULL) {
		char *pax = NULL, num[32];
		size_t plen = 0;

		if (strlen(name) >= 100)
			pax_record(&pax, &plen, "path", name);
		if (link && strlen(link) >= 100)
			pax_record(&pax, &plen, "linkpath", link);
		if (size >= 077777777777ULL) {
			snprintf(num, sizeof(num), "%llu",
				 (unsigned long long)size);
			pax_record(&pax, &plen, "size", num);
		}
		header(h, "././@PaxHeader", NULL, 'x', 0644, mtime, plen);
		rc = put(t, h, BLOCK);
		if (rc == 0)
			rc = put(t, pax, plen);
		if (rc == 0)
			rc = pad(t, plen);
		free(pax);
		if (rc < 0)
			return rc;
		if (size >= 077777777777ULL)
			size = 0; /* the pax record has it */
	}
	header(h, name, link, type, mode, mtime, size);
	return put(t, h, BLOCK);
}

int cli_tar_file(struct cli_tar *t, const char *name, unsigned mode,
		 int64_t mtime, const void *data, size_t len)
{
	int rc = entry(t, name, NULL, '0', mode, mtime, len);

	if (rc == 0 && len)
		rc = put(t, data, len);
	if (rc == 0)
		rc = pad(t, len);
	return rc;
}

int cli_tar_file_fd(struct cli_tar *t, const char *name, unsigned mode,
		    int64_t mtime, int fd, uint64_t size)
{
	enum { CHUNK = 256 * 1024 };
	char *buf;
	uint64_t done = 0;
	int rc = entry(t, name, NULL, '0', mode, mtime, size);

	if (rc < 0)
		return rc;
	buf = sbx_xmalloc(CHUNK);
	while (rc == 0 && done < size) {
		size_t want = size - done < CHUNK ? (size_t)(size - done)
						  : CHUNK;
		ssize_t n = pread(fd, buf, want, (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			rc = sbx_error_os("read %s", name);
		else if (n == 0)
			rc = sbx_error_set(SBX_ERR_OS, -EIO,
					   "%s shrank while being sent", name);
		else {
			rc = put(t, buf, (size_t)n);
			done += (uint64_t)n;
		}
	}
	free(buf);
	if (rc == 0)
		rc = pad(t, size);
	return rc;
}

int cli_tar_symlink(struct cli_tar *t, const char *name, const char *target,
		    int64_t mtime)
{
	return entry(t, name, target, '2', 0777, mtime, 0);
}

int cli_tar_dir(struct cli_tar *t, const char *name, unsigned mode,
		int64_t mtime)
{
	char *n = sbx_xasprintf("%s/", name);
	int rc = entry(t, n, NULL, '5', mode, mtime, 0);

	free(n);
	return rc;
}

int cli_tar_keepalive(struct cli_tar *t, const char *comment)
{
	char h[BLOCK], *pax = NULL;
	size_t plen = 0;
	int rc;

	pax_record(&pax, &plen, "comment", comment);
	header(h, "././@GlobalHead", NULL, 'g', 0644, 0, plen);
	rc = put(t, h, BLOCK);
	if (rc == 0)
		rc = put(t, pax, plen);
	if (rc == 0)
		rc = pad(t, plen);
	free(pax);
	return rc;
}

int cli_tar_end(struct cli_tar *t)
{
	static const char zero[2 * BLOCK];

	return put(t, zero, sizeof(zero));
}
