/*
 * File routes: stat, list, read, write, readlink and statfs
 * (docs/protocol.md, "Files"), and the helpers the batch
 * (handlers_batch.c) and bulk (handlers_bulk.c) routes share with them.
 *
 * Every path goes through confine.c.  Operations on the last component
 * itself use the parent's fd and the bare name with the *at() calls and
 * AT_SYMLINK_NOFOLLOW / O_NOFOLLOW, so a symlink there is never followed.
 * Where no *at() call can act on an inode without following (chmod,
 * xattrs, utimens of the root), the object is opened O_PATH | O_NOFOLLOW
 * and addressed as /proc/self/fd/N, which names exactly that inode.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/magic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/proto.h"
#include "sbx/proto_bulk.h"
#include "sbx/xmalloc.h"

#include "agent_i.h"

/* One read answers at most this much (the client checks X-Sbx-Size). */
#define MAX_READ SBX_PROTO_MAX_WRITE_BODY

/* ---- helpers ------------------------------------------------------------- */

int agent_req_path(struct agent_req *r, const char *key, char **out)
{
	const char *p = agent_arg(r, key);

	return agent_path_norm(p ? p : "", out);
}

int agent_stat_at(int dfd, const char *name, struct stat *st, const char *what)
{
	if (fstatat(dfd, name, st,
		    AT_SYMLINK_NOFOLLOW | (*name ? 0 : AT_EMPTY_PATH)) < 0)
		return sbx_error_os("stat %s", what);
	return 0;
}

static int lstat_path(struct agent *a, const char *path, struct stat *st)
{
	const char *name;
	char *buf = NULL;
	int dfd = -1, rc;

	rc = agent_parent(a, path, &dfd, &name, &buf);
	if (rc == 0)
		rc = agent_stat_at(dfd, name, st, *path ? path : "/");
	if (dfd >= 0)
		close(dfd);
	free(buf);
	return rc;
}

static cJSON *list_entries(DIR *d, const char *what, int *rc_out)
{
	cJSON *arr = cJSON_CreateArray();
	struct dirent *e;

	*rc_out = 0;
	/*
	 * readdir() leaves errno alone at the end: it must be 0 before each
	 * call, or an entry removed meanwhile (its fstatat's ENOENT) failed
	 * the whole listing with ENOENT at the end (random tester, seed
	 * 811804466: a listing raced a hidden name's removal).
	 */
	for (;;) {
		struct stat st;

		errno = 0;
		e = readdir(d);
		if (!e)
			break;
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue; /* removed meanwhile */
		cJSON_AddItemToArray(arr,
				     sbx_proto_entry_encode(e->d_name, &st));
	}
	if (errno) {
		*rc_out = sbx_error_os("list %s", what);
		cJSON_Delete(arr);
		return NULL;
	}
	return arr;
}

int agent_list(struct agent *a, const char *path, cJSON **out,
	       struct stat *dirst)
{
	DIR *d;
	int fd, rc;

	*out = NULL;
	rc = agent_open(a, path, O_RDONLY | O_DIRECTORY, 0, &fd);
	if (rc < 0)
		return rc;
	if (fstat(fd, dirst) < 0) {
		rc = sbx_error_os("list %s: fstat", *path ? path : "/");
		close(fd);
		return rc;
	}
	d = fdopendir(fd);
	if (!d) {
		rc = sbx_error_os("list %s", path);
		close(fd);
		return rc;
	}
	*out = list_entries(d, *path ? path : "/", &rc);
	closedir(d);
	return rc;
}

void agent_put_st(cJSON *o, const struct stat *st)
{
	cJSON_AddItemToObject(o, "st", sbx_proto_stat_to_json(st));
}

/* ---- simple routes -------------------------------------------------------- */

int agent_h_stat(struct agent_req *r)
{
	struct stat st;
	char *path = NULL;
	cJSON *o;
	int rc;

	rc = agent_req_path(r, "path", &path);
	if (rc == 0)
		rc = lstat_path(r->a, path, &st);
	free(path);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	o = cJSON_CreateObject();
	agent_put_st(o, &st);
	return agent_reply_json(r, 200, o);
}

int agent_h_list(struct agent_req *r)
{
	char *path = NULL;
	cJSON *entries = NULL, *o;
	struct stat dirst;
	int rc;

	rc = agent_req_path(r, "path", &path);
	if (rc == 0)
		rc = agent_list(r->a, path, &entries, &dirst);
	free(path);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	o = cJSON_CreateObject();
	agent_put_st(o, &dirst);
	cJSON_AddItemToObject(o, "entries", entries);
	return agent_reply_json(r, 200, o);
}

static void hdr_stat(struct MHD_Response *resp, const struct stat *st)
{
	char v[64];

	snprintf(v, sizeof(v), "%lld", (long long)st->st_size);
	MHD_add_response_header(resp, SBX_HDR_SIZE, v);
	snprintf(v, sizeof(v), "%lld.%09ld", (long long)st->st_mtim.tv_sec,
		 st->st_mtim.tv_nsec);
	MHD_add_response_header(resp, SBX_HDR_MTIME, v);
	snprintf(v, sizeof(v), "%" PRIu64, (uint64_t)st->st_ino);
	MHD_add_response_header(resp, SBX_HDR_INO, v);
}

int agent_h_read(struct agent_req *r)
{
	long long off, len;
	struct MHD_Response *resp;
	char *path = NULL, *data = NULL;
	struct stat st;
	size_t got = 0;
	int fd = -1, rc;

	rc = agent_req_path(r, "path", &path);
	if (rc == 0)
		rc = agent_arg_int(r, "offset", 0, 0, LLONG_MAX, &off);
	if (rc == 0)
		rc = agent_arg_int(r, "length", MAX_READ, 0, LLONG_MAX, &len);
	if (rc == 0)
		rc = agent_open(r->a, path, O_RDONLY | O_NOCTTY | O_NONBLOCK, 0,
				&fd);
	if (rc == 0 && fstat(fd, &st) < 0)
		rc = sbx_error_os("read %s", path);
	if (rc == 0 && S_ISDIR(st.st_mode))
		rc = sbx_error_set(SBX_ERR_OS, -EISDIR, "read %s: a directory",
				   path);
	if (rc < 0)
		goto out;
	if (len > MAX_READ)
		len = MAX_READ;
	/* Regular files: never allocate past the end. */
	if (S_ISREG(st.st_mode))
		len = off >= st.st_size ? 0
			: (st.st_size - off < len ? st.st_size - off : len);
	data = sbx_xmalloc((size_t)len + 1);
	while (got < (size_t)len) {
		ssize_t n = pread(fd, data + got, (size_t)len - got,
				  (off_t)(off + (long long)got));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = sbx_error_os("read %s", path);
			goto out;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	resp = MHD_create_response_from_buffer(got, data,
					       MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		rc = -ENOMEM;
		goto out;
	}
	data = NULL;
	hdr_stat(resp, &st);
	close(fd);
	free(path);
	return agent_reply(r, 200, resp, SBX_CT_OCTET);
out:
	free(data);
	if (fd >= 0)
		close(fd);
	free(path);
	return agent_reply_error(r, 0, rc);
}

int agent_write_all(int fd, const void *data, size_t len, long long off,
		     bool append, const char *what)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = append ? write(fd, (const char *)data + done,
					   len - done)
				   : pwrite(fd, (const char *)data + done,
					    len - done,
					    (off_t)(off + (long long)done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return sbx_error_os("write %s", what);
		done += (size_t)n;
	}
	return 0;
}

/*
 * Only on overlayfs may the number change under the open: opening a
 * lower-layer file for writing copies it up, and without xino the copy
 * has a new number; then the object looked at before the open must be
 * it, with the same size and modification time, which a copy-up keeps.
 * Either number matching was enough before 2026-12-08, on every file
 * system: a file exchanged with ours between the two opens got our bytes
 * (a stress agent, a storm of exchanges in the sandbox).
 */
bool agent_same_object(int fd, const struct stat *before,
		       const struct stat *after, uint64_t ino)
{
	struct statfs fs;

	if ((uint64_t)after->st_ino == ino)
		return true;
	return (uint64_t)before->st_ino == ino &&
	       fstatfs(fd, &fs) == 0 && fs.f_type == OVERLAYFS_SUPER_MAGIC &&
	       before->st_size == after->st_size &&
	       before->st_mtim.tv_sec == after->st_mtim.tv_sec &&
	       before->st_mtim.tv_nsec == after->st_mtim.tv_nsec;
}

int agent_open_ino(struct agent *a, const char *path, int flags,
		   uint64_t ino, int *fd_out)
{
	struct stat before, after;
	int pfd = -1, fd = -1, rc = 0;

	*fd_out = -1;
	if (!ino)
		return agent_open(a, path, flags, 0, fd_out);
	rc = agent_open(a, path, O_PATH, 0, &pfd);
	if (rc == 0 && fstat(pfd, &before) < 0)
		rc = sbx_error_os("stat %s", path);
	if (pfd >= 0)
		close(pfd);
	if (rc == 0)
		rc = agent_open(a, path, flags, 0, &fd);
	if (rc == 0 && fstat(fd, &after) < 0)
		rc = sbx_error_os("stat %s", path);
	if (rc == 0 && !agent_same_object(fd, &before, &after, ino))
		rc = sbx_error_set(SBX_ERR_OS, -ESTALE,
				   "write %s: the path names another file "
				   "now (inode %" PRIu64 ", the write is for "
				   "inode %" PRIu64 "): it was moved or "
				   "replaced; nothing was written",
				   path, (uint64_t)after.st_ino, ino);
	if (rc < 0) {
		if (fd >= 0)
			close(fd);
		return rc;
	}
	*fd_out = fd;
	return 0;
}

int agent_h_write(struct agent_req *r)
{
	long long off, append, trunc;
	char *path = NULL;
	uint64_t ino;
	struct stat st;
	cJSON *o;
	int fd = -1, rc;

	rc = agent_req_path(r, "path", &path);
	if (rc == 0)
		rc = agent_arg_int(r, "offset", 0, 0, LLONG_MAX / 2, &off);
	if (rc == 0)
		rc = agent_arg_int(r, "append", 0, 0, 1, &append);
	if (rc == 0)
		rc = agent_arg_int(r, "truncate", 0, 0, 1, &trunc);
	if (rc == 0)
		rc = agent_arg_u64(r, "ino", &ino);
	if (rc == 0)
		rc = agent_open_ino(r->a, path,
				    O_WRONLY | O_NOCTTY |
					    (append ? O_APPEND : 0),
				    ino, &fd);
	if (rc == 0)
		rc = agent_write_all(fd, r->body.data, r->body.len, off, append,
				     path);
	if (rc == 0 && trunc && !append &&
	    ftruncate(fd, (off_t)(off + (long long)r->body.len)) < 0)
		rc = sbx_error_os("truncate %s", path);
	if (rc == 0 && fstat(fd, &st) < 0)
		rc = sbx_error_os("stat %s", path);
	if (fd >= 0)
		close(fd);
	free(path);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	o = cJSON_CreateObject();
	cJSON_AddNumberToObject(o, "written", (double)r->body.len);
	agent_put_st(o, &st);
	return agent_reply_json(r, 200, o);
}

static int readlink_path(struct agent *a, const char *path, char **out)
{
	char target[PATH_MAX + 1];
	const char *name;
	char *buf = NULL;
	ssize_t n = -1;
	int dfd = -1, rc;

	*out = NULL;
	rc = agent_parent(a, path, &dfd, &name, &buf);
	if (rc == 0) {
		n = readlinkat(dfd, name, target, sizeof(target) - 1);
		if (n < 0)
			rc = sbx_error_os("readlink %s", path);
	}
	if (dfd >= 0)
		close(dfd);
	free(buf);
	if (rc < 0)
		return rc;
	target[n] = '\0';
	*out = sbx_xstrdup(target);
	return 0;
}

int agent_h_readlink(struct agent_req *r)
{
	char *path = NULL, *target = NULL;
	cJSON *o;
	int rc;

	rc = agent_req_path(r, "path", &path);
	if (rc == 0)
		rc = readlink_path(r->a, path, &target);
	free(path);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "target", target);
	free(target);
	return agent_reply_json(r, 200, o);
}

int agent_statfs_json(struct agent *a, cJSON **out)
{
	struct statvfs sv;

	*out = NULL;
	if (fstatvfs(a->root_fd, &sv) < 0)
		return sbx_error_os("statfs");
	*out = sbx_proto_statvfs_to_json(&sv);
	return 0;
}

int agent_h_statfs(struct agent_req *r)
{
	cJSON *o;
	int rc = agent_statfs_json(r->a, &o);

	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	return agent_reply_json(r, 200, o);
}
