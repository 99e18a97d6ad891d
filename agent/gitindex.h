/*
 * Just enough of git's on-disk formats for the agent to receive a
 * repository (PUT /v1/repo/seed) and hand its objects back (GET
 * /v1/repo/state, POST /v1/repo/objects) without libgit2 (the agent links
 * no git library: contrib/agent bundles it into arbitrary images).
 *
 *  - SHA-1 (FIPS 180-4), for the index file's trailing checksum.
 *  - The index "refresh" that `git update-index --refresh` does for files
 *    known to be unchanged: the client writes the index (libgit2) with all
 *    stat data zero for every entry whose working file it sends as the
 *    entry's blob, and non-zero (it uses mtime 1 s) for entries it knows
 *    differ (carried changes); the agent fills in the stat data of the
 *    files as extracted (ctime, mtime, dev, ino, uid, gid, size) for the
 *    zero entries and rewrites the checksum.  Without it, the first `git
 *    status` in the sandbox would re-read every file.
 *  - Names: object file names, ref names.
 *
 * Pure code: no I/O except through the stat callback.  Thread-safe per
 * call.  docs/design.md, "Repository in and out".
 */
#ifndef SBX_AGENT_GITINDEX_H
#define SBX_AGENT_GITINDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "sbx/error.h"

struct agent_sha1 {
	uint32_t h[5];
	uint64_t len;           /* bytes hashed so far */
	unsigned char blk[64];
	size_t n;               /* bytes in blk */
};

void agent_sha1_init(struct agent_sha1 *c);
void agent_sha1_update(struct agent_sha1 *c, const void *data, size_t len);
void agent_sha1_final(struct agent_sha1 *c, unsigned char out[20]);

/*
 * lstat of `path` (an index entry's path, relative to the working tree):
 * 0 and *st filled, or a negative errno (the entry is then left alone).
 */
typedef int (*agent_gitindex_stat_fn)(const char *path, struct stat *st,
				      void *payload);

/* What agent_gitindex_refresh() did. */
struct agent_gitindex_result {
	uint32_t entries;    /* entries in the index */
	uint32_t refreshed;  /* entries whose stat data was filled in */
	int64_t max_mtime_s; /* newest mtime (seconds) filled in */
};

/*
 * Refresh the index image `buf` (`len` bytes: a whole .git/index file,
 * versions 2 and 3) in place: every stage-0 entry of a regular file or
 * symlink whose stat data (ctime, mtime, dev, ino, uid, gid, size) is all
 * zero gets the stat data `stat_fn` reports for its path, when the file
 * type (and for files the owner's execute bit) matches the entry's mode;
 * then the trailing SHA-1 is recomputed.  Other entries keep their data,
 * so git re-reads them.  Extensions are kept as they are.  out->max_mtime_s
 * is the newest mtime filled in.  Returns 0, or -EINVAL (SBX_ERR_PROTO)
 * for a malformed image and -EOPNOTSUPP for index version 4
 * (prefix-compressed names); `buf` is then unchanged.
 */
SBX_WUR int agent_gitindex_refresh(unsigned char *buf, size_t len,
				   agent_gitindex_stat_fn stat_fn,
				   void *payload,
				   struct agent_gitindex_result *out);

/* A loose object's name under objects/: "xx/" + 38 hex digits. */
bool agent_git_loose_name_ok(const char *name);
/* A pack file's name under objects/: "pack/pack-" 40 hex ".pack|.idx|.keep". */
bool agent_git_pack_name_ok(const char *name);
/* A ref name the agent looks up: "refs/..." without "..", "//", "@{", a
 * leading or trailing '/' or '.', control characters, space, ~^:?*[\. */
bool agent_git_ref_name_ok(const char *name);
/* 40 lowercase hex digits. */
bool agent_git_oid_hex_ok(const char *s, size_t len);

#endif
