/*
 * Shared secrets ("tokens") in files: the sbx-agent token (sbx-agent
 * --token-file, the remote provider's token_file) and the `sbx serve` token.
 *
 * A token file holds the token on its first line.  Like ssh with private
 * keys, a token file that its group or others may access (any bit of 077
 * in its mode) is refused with a message saying `chmod 600`: a token that
 * other local users can read lets them act as the token's holder.
 */
#ifndef SBX_TOKEN_H
#define SBX_TOKEN_H

#include <stdbool.h>
#include <stddef.h>

#include "sbx/error.h"

/* Largest token file read (the first line is the token). */
#define SBX_TOKEN_FILE_CAP (64 * 1024)

/*
 * Read the token in `path`: its first line without trailing blanks.  The
 * file may be of any type (a regular file, a pipe such as bash's <(...)).
 * Errors (the message names the file, never the token):
 *   -EPERM  (CONFIG)  the mode gives group or others access ("chmod 600")
 *   -EINVAL (CONFIG)  the first line is empty, or holds control characters
 *                     (the token travels in an HTTP header)
 *   -EFBIG  (CONFIG)  larger than SBX_TOKEN_FILE_CAP
 *   -errno  (OS)      it cannot be opened or read
 * *out is malloc'd; release it with sbx_token_free().
 */
SBX_WUR int sbx_token_file_read(char **out, const char *path);

/*
 * Check the permissions of an open token file: -EPERM (CONFIG, naming
 * `path` and saying chmod 600) when group or others have any access.
 */
SBX_WUR int sbx_token_fd_check(int fd, const char *path);

/*
 * Does `got` (NUL-terminated, may be NULL: false) equal the `want_len`
 * bytes of `want`?  Constant time in the token's content; the length is
 * not treated as secret.
 */
bool sbx_token_equal(const char *want, size_t want_len, const char *got);

/*
 * `bytes` random bytes (getrandom(2); at most 64) as lowercase hex into
 * `out`, which holds 2 * bytes + 1 characters.  -errno (OS) when the
 * kernel has no entropy to give (never a guessable fallback).
 */
SBX_WUR int sbx_token_random(char *out, size_t bytes);

/* Wipe and free a token (NULL is fine). */
void sbx_token_free(char *token);

#endif
