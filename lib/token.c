/* Token files and token comparison; see sbx/token.h. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sbx/token.h"
#include "sbx/xmalloc.h"

int sbx_token_fd_check(int fd, const char *path)
{
	struct stat st;

	if (fstat(fd, &st) < 0)
		return sbx_error_os("stat %s", path);
	/* ssh's rule for private keys: no access at all for group and
	 * others.  Root reads any file, but the mode still tells whether
	 * other users can. */
	if (st.st_mode & 077)
		return sbx_error_set(SBX_ERR_CONFIG, -EPERM,
				     "permissions %04o of the token file %s "
				     "are too open: other users can read the "
				     "token; run chmod 600 %s",
				     (unsigned)(st.st_mode & 07777), path,
				     path);
	return 0;
}

int sbx_token_file_read(char **out, const char *path)
{
	char chunk[4096];
	char *text = NULL;
	size_t len = 0, n;
	int fd, rc = 0;

	*out = NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return sbx_error_os("token file %s", path);
	rc = sbx_token_fd_check(fd, path);
	if (rc < 0)
		goto out;
	text = sbx_xmalloc(SBX_TOKEN_FILE_CAP + 1);
	for (;;) {
		ssize_t got = read(fd, chunk, sizeof(chunk));

		if (got < 0) {
			if (errno == EINTR)
				continue;
			rc = sbx_error_os("read token file %s", path);
			goto out;
		}
		if (got == 0)
			break;
		if ((size_t)got > SBX_TOKEN_FILE_CAP - len) {
			rc = sbx_error_set(SBX_ERR_CONFIG, -EFBIG,
					   "the token file %s is larger than "
					   "%d bytes",
					   path, SBX_TOKEN_FILE_CAP);
			goto out;
		}
		memcpy(text + len, chunk, (size_t)got);
		len += (size_t)got;
	}
	text[len] = '\0';
	n = strcspn(text, "\r\n");
	while (n && (text[n - 1] == ' ' || text[n - 1] == '\t'))
		n--;
	if (n == 0) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "the token file %s is empty (its first "
				   "line is the token)",
				   path);
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		if ((unsigned char)text[i] < 0x20 || text[i] == 0x7f) {
			rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					   "the token in %s contains control "
					   "characters",
					   path);
			goto out;
		}
	}
	*out = sbx_xstrndup(text, n);
out:
	explicit_bzero(chunk, sizeof(chunk));
	if (text) {
		explicit_bzero(text, len);
		free(text);
	}
	close(fd);
	return rc;
}

bool sbx_token_equal(const char *want, size_t want_len, const char *got)
{
	volatile unsigned char diff = 0;
	size_t n;

	if (!got || !want)
		return false;
	n = strlen(got);
	diff |= (unsigned char)(n != want_len);
	for (size_t i = 0; i < want_len; i++)
		diff |= (unsigned char)(want[i] ^ (i < n ? got[i] : 0));
	return diff == 0;
}

int sbx_token_random(char *out, size_t bytes)
{
	static const char hex[] = "0123456789abcdef";
	unsigned char b[64];
	size_t have = 0;

	if (bytes > sizeof(b))
		bytes = sizeof(b);
	while (have < bytes) {
		ssize_t n = getrandom(b + have, bytes - have, 0);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			out[0] = '\0';
			return sbx_error_os("getrandom");
		}
		have += (size_t)n;
	}
	for (size_t i = 0; i < bytes; i++) {
		out[2 * i] = hex[b[i] >> 4];
		out[2 * i + 1] = hex[b[i] & 15];
	}
	out[2 * bytes] = '\0';
	explicit_bzero(b, sizeof(b));
	return 0;
}

void sbx_token_free(char *token)
{
	if (!token)
		return;
	explicit_bzero(token, strlen(token));
	free(token);
}
