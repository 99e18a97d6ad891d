/*
 * Repository routes (docs/protocol.md, "Repository"): the sandbox end of
 * `sbx up --repo` and `sbx pull` (docs/design.md, "Repository in and
 * out").  The agent has no git library: it writes the files the client
 * built with libgit2 (a pack with its index, refs, HEAD, config, the index
 * file, the working tree) and hands back the files a pull needs (refs,
 * loose objects, packs), so the client does every git computation.
 *
 *   PUT  /v1/repo/seed?path=P     tar body, extracted like PUT /v1/archive
 *                                 into P, which must be empty or absent;
 *                                 then P/.git/index is refreshed
 *                                 (gitindex.h).  A failed seed removes
 *                                 what it extracted: P is empty again.
 *   GET  /v1/repo/state?path=P&ref=R
 *                                 HEAD, R's value, loose object ids, packs
 *   POST /v1/repo/objects?path=P  {"names":["ab/cdef...","pack/pack-X.idx"]}
 *                                 -> frames with those files' bytes
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/proto.h"
#include "sbx/xmalloc.h"

#include "agent_i.h"
#include "gitindex.h"

/* Refs and HEAD are tiny; packed-refs of a big repository is not. */
#define SMALL_FILE_MAX (64 * 1024)
#define PACKED_REFS_MAX (64 * 1024 * 1024)
#define INDEX_MAX (1024u * 1024 * 1024)
#define KEEP_MAX 256
/* A stream call returns once this much is buffered. */
#define OUT_CHUNK (512 * 1024)
#define READ_CHUNK (SBX_PROTO_MAX_FRAME_DATA)
#define MAX_NAMES 100000

static char *join(const char *dir, const char *name)
{
	return *dir ? sbx_xasprintf("%s/%s", dir, name) : sbx_xstrdup(name);
}

/* The normalised "path" argument (default "": the root). */
static int arg_path(struct agent_req *r, char **out)
{
	const char *p = agent_arg(r, "path");

	return agent_path_norm(p ? p : "", out);
}

/* Read a whole file (fd) of at most `max` bytes, NUL-terminated. */
static int read_all(int fd, size_t max, char **out, size_t *len_out,
		    const char *what)
{
	struct sbx_buf b;
	char chunk[16384];
	int rc = 0;

	*out = NULL;
	sbx_buf_init(&b, max);
	for (;;) {
		ssize_t n = read(fd, chunk, sizeof(chunk));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = sbx_error_os("read %s", what);
			break;
		}
		if (n == 0)
			break;
		if (sbx_buf_add(&b, chunk, (size_t)n) < 0) {
			rc = sbx_error_set(SBX_ERR_OS, -EFBIG,
					   "%s is larger than %zu bytes", what,
					   max);
			break;
		}
	}
	if (rc == 0) {
		if (sbx_buf_add(&b, "", 0) < 0)
			rc = -EFBIG;
		*len_out = sbx_buf_len(&b);
		*out = sbx_buf_take(&b, NULL);
		if (!*out)
			*out = sbx_xstrdup("");
	}
	sbx_buf_fini(&b);
	return rc;
}

/* Read `rel` (beneath the root) into *out; -ENOENT when missing. */
static int read_file(struct agent *a, const char *rel, size_t max, char **out,
		     size_t *len)
{
	int fd = -1, rc;

	*out = NULL;
	rc = agent_open(a, rel, O_RDONLY | O_NOFOLLOW, 0, &fd);
	if (rc < 0)
		return rc;
	rc = read_all(fd, max, out, len, rel);
	close(fd);
	return rc;
}

static void trim(char *s)
{
	size_t n = strlen(s);

	while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' '))
		s[--n] = '\0';
}

/* The .git directory of the working tree at `path` must exist. */
static int git_dir(struct agent *a, const char *path, char **out)
{
	char *g = join(path, ".git");
	struct stat st;
	int fd = -1, rc;

	*out = NULL;
	rc = agent_open(a, g, O_PATH | O_DIRECTORY | O_NOFOLLOW, 0, &fd);
	if (rc == 0 && fstat(fd, &st) < 0)
		rc = sbx_error_os("stat %s", g);
	if (fd >= 0)
		close(fd);
	if (rc == -ENOENT || rc == -ENOTDIR || rc == -ELOOP) {
		sbx_error_clear();
		rc = sbx_error_set(SBX_ERR_PROTO, -ENOENT,
				   "no git repository at /%s (no .git "
				   "directory)",
				   path);
	}
	if (rc < 0) {
		free(g);
		return rc;
	}
	*out = g;
	return 0;
}

/* ---- PUT /v1/repo/seed --------------------------------------------------- */

/* 0 when `path` is absent or an empty directory; -ENOTEMPTY otherwise. */
/*
 * Open the directory `rel` (below the agent's root) for reading.  Errors
 * are agent_open()'s, or the OS error naming `shown`.
 */
static int open_dir(DIR **out, struct agent *a, const char *rel,
		    const char *shown)
{
	int fd = -1, rc;

	*out = NULL;
	rc = agent_open(a, rel, O_RDONLY | O_DIRECTORY, 0, &fd);
	if (rc < 0)
		return rc;
	*out = fdopendir(fd);
	if (!*out) {
		rc = sbx_error_os("list %s", shown);
		close(fd);
		return rc;
	}
	return 0;
}

static int check_empty(struct agent *a, const char *path)
{
	struct dirent *e;
	DIR *d;
	char *shown = sbx_xasprintf("/%s", path);
	int rc;

	rc = open_dir(&d, a, path, shown);
	free(shown);
	if (rc == -ENOENT) {
		sbx_error_clear();
		return 0;
	}
	if (rc < 0)
		return rc;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		rc = sbx_error_set(SBX_ERR_PROTO, -ENOTEMPTY,
				   "/%s is not empty (it holds \"%s\"): a "
				   "repository is only seeded into an empty "
				   "directory",
				   path, e->d_name);
		break;
	}
	closedir(d);
	return rc;
}

int agent_repo_seed_upload(struct agent_req *r, const char *data, size_t len)
{
	char *path = NULL;
	int rc;

	if (data)
		return agent_archive_upload(r, data, len);
	rc = arg_path(r, &path);
	if (rc == 0)
		rc = check_empty(r->a, path);
	if (rc == 0)
		rc = agent_extract_begin(r, path, false);
	free(path);
	if (rc < 0)
		return agent_reply_error(r, 0, rc) == MHD_YES ? 0 : -EIO;
	return 0;
}

struct stat_ctx {
	struct agent *sub; /* confined to the working tree */
};

static int index_stat(const char *path, struct stat *st, void *payload)
{
	struct stat_ctx *c = payload;
	const char *name;
	char *buf = NULL;
	int dfd = -1, rc;

	rc = agent_parent(c->sub, path, &dfd, &name, &buf);
	if (rc == 0 && (!*name || fstatat(dfd, name, st,
					  AT_SYMLINK_NOFOLLOW) < 0))
		rc = -ENOENT;
	if (dfd >= 0)
		close(dfd);
	free(buf);
	return rc;
}

/*
 * Refresh .git/index beneath the extracted tree (gitindex.h) and give it
 * an mtime after every entry's, so git never takes an entry for racily
 * clean.  A missing index is fine (nothing to do).
 */
static int refresh_index(struct agent_req *r,
			 struct agent_gitindex_result *res)
{
	struct stat_ctx c = { .sub = agent_extract_confined(r) };
	char *img = NULL;
	size_t len = 0;
	int fd = -1, rc;

	memset(res, 0, sizeof(*res));
	rc = agent_open(c.sub, ".git/index", O_RDWR | O_NOFOLLOW, 0, &fd);
	if (rc == -ENOENT) {
		sbx_error_clear();
		return 0;
	}
	if (rc < 0)
		return rc;
	rc = read_all(fd, INDEX_MAX, &img, &len, ".git/index");
	if (rc == 0) {
		rc = agent_gitindex_refresh((unsigned char *)img, len,
					    index_stat, &c, res);
		if (rc == -EOPNOTSUPP) {
			sbx_info("seed: %s; the index is kept as sent",
				 sbx_error_last()->msg);
			sbx_error_clear();
			rc = 0;
			goto times;
		}
	}
	if (rc == 0) {
		size_t done = 0;

		while (done < len) {
			ssize_t n = pwrite(fd, img + done, len - done,
					   (off_t)done);

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				rc = sbx_error_os("write .git/index");
				break;
			}
			done += (size_t)n;
		}
	}
times:
	if (rc == 0) {
		struct timespec now, ts[2];

		clock_gettime(CLOCK_REALTIME, &now);
		if ((int64_t)now.tv_sec <= res->max_mtime_s)
			now.tv_sec = (time_t)res->max_mtime_s + 1;
		ts[0] = now;
		ts[1] = now;
		if (futimens(fd, ts) < 0)
			rc = sbx_error_os("set the time of .git/index");
	}
	free(img);
	close(fd);
	return rc;
}

int agent_h_repo_seed(struct agent_req *r)
{
	struct agent_gitindex_result res = { 0 };
	uint64_t entries = 0, bytes = 0;
	unsigned status = 0;
	cJSON *o;
	int rc;

	rc = agent_extract_finish(r, &entries, &bytes, &status);
	if (rc == 0) {
		rc = refresh_index(r, &res);
		status = 0;
	}
	if (rc < 0) {
		struct sbx_error e = *sbx_error_last();

		sbx_warn("PUT repo/seed: %s", e.msg);
		/* The directory was empty: leave it so, not half seeded. */
		if (agent_extract_clear(r) < 0)
			sbx_warn("PUT repo/seed: cleaning up: %s",
				 sbx_error_last()->msg);
		sbx_error_restore(&e);
		return agent_reply_error(r, status, rc);
	}
	sbx_info("PUT repo/seed: %" PRIu64 " entries, %" PRIu64
		 " bytes, index %u/%u entries refreshed",
		 entries, bytes, res.refreshed, res.entries);
	o = cJSON_CreateObject();
	cJSON_AddNumberToObject(o, "entries", (double)entries);
	cJSON_AddNumberToObject(o, "bytes", (double)bytes);
	cJSON_AddNumberToObject(o, "index_entries", res.entries);
	cJSON_AddNumberToObject(o, "index_refreshed", res.refreshed);
	return agent_reply_json(r, 200, o);
}

/* ---- GET /v1/repo/state -------------------------------------------------- */

/*
 * The value of ref `name` in the repository at `gd` (".../.git"): a loose
 * ref file, else a line of packed-refs; symbolic refs are followed (5
 * levels).  *oid_out (41 bytes) empty when the ref does not exist.
 */
static int resolve_ref(struct agent *a, const char *gd, const char *name,
		       char *oid_out)
{
	char *cur = sbx_xstrdup(name), *text = NULL, *rel = NULL;
	size_t len;
	int rc = 0;

	oid_out[0] = '\0';
	for (int depth = 0; depth < 5; depth++) {
		if (!agent_git_ref_name_ok(cur))
			break;
		free(rel);
		rel = join(gd, cur);
		free(text);
		text = NULL;
		rc = read_file(a, rel, SMALL_FILE_MAX, &text, &len);
		if (rc == 0) {
			trim(text);
			if (strncmp(text, "ref: ", 5) == 0) {
				char *next = sbx_xstrdup(text + 5);

				free(cur);
				cur = next;
				continue;
			}
			if (agent_git_oid_hex_ok(text, strlen(text)))
				memcpy(oid_out, text, 41);
			break;
		}
		if (rc != -ENOENT && rc != -ENOTDIR && rc != -EISDIR)
			break;
		sbx_error_clear();
		rc = 0;
		/* packed-refs: "<oid> <name>" lines ('#' header, '^' peels). */
		free(rel);
		rel = join(gd, "packed-refs");
		free(text);
		text = NULL;
		rc = read_file(a, rel, PACKED_REFS_MAX, &text, &len);
		if (rc == -ENOENT) {
			sbx_error_clear();
			rc = 0;
			break;
		}
		if (rc < 0)
			break;
		for (char *line = text, *nl; line && *line; line = nl) {
			nl = strchr(line, '\n');
			if (nl)
				*nl++ = '\0';
			trim(line);
			if (strlen(line) > 41 && line[40] == ' ' &&
			    strcmp(line + 41, cur) == 0 &&
			    agent_git_oid_hex_ok(line, 40)) {
				memcpy(oid_out, line, 40);
				oid_out[40] = '\0';
				break;
			}
		}
		break;
	}
	free(rel);
	free(text);
	free(cur);
	return rc;
}

static bool hex2(const char *s)
{
	return strlen(s) == 2 && strspn(s, "0123456789abcdef") == 2;
}

/*
 * Call fn for each entry of the directory `gd`/`sub` (below the agent's
 * root), with its DIR for *at() calls.  A directory that is not there has
 * no entries.
 */
static int each_entry(struct agent *a, const char *gd, const char *sub,
		      void (*fn)(DIR *d, const struct dirent *e, cJSON *arr),
		      cJSON *arr)
{
	char *rel = join(gd, sub);
	struct dirent *e;
	DIR *d = NULL;
	int rc;

	rc = open_dir(&d, a, rel, rel);
	if (rc == 0) {
		while ((e = readdir(d)))
			fn(d, e, arr);
		closedir(d);
	}
	if (rc == -ENOENT)
		sbx_error_clear(), rc = 0;
	free(rel);
	return rc;
}

/* Loose objects: the ids under one objects/XX directory. */
static void add_loose(DIR *d, const struct dirent *e, cJSON *arr)
{
	struct dirent *f;
	DIR *sub;
	int sfd;

	if (!hex2(e->d_name))
		return;
	sfd = openat(dirfd(d), e->d_name,
		     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sfd < 0)
		return;
	sub = fdopendir(sfd);
	if (!sub) {
		close(sfd);
		return;
	}
	while ((f = readdir(sub))) {
		char id[41];

		if (strlen(f->d_name) != 38 ||
		    strspn(f->d_name, "0123456789abcdef") != 38)
			continue;
		memcpy(id, e->d_name, 2);
		memcpy(id + 2, f->d_name, 39);
		cJSON_AddItemToArray(arr, cJSON_CreateString(id));
	}
	closedir(sub);
}

/* Packs: one that has its .idx, with its sizes and .keep reason. */
static void add_pack(DIR *d, const struct dirent *e, cJSON *arr)
{
	char name[48], idx[64], keep[64], kbuf[KEEP_MAX + 1];
	struct stat pst, ist;
	size_t n = strlen(e->d_name);
	cJSON *o;
	int kfd;

	if (n != 50 || strncmp(e->d_name, "pack-", 5) != 0 ||
	    strcmp(e->d_name + 45, ".pack") != 0 ||
	    !agent_git_oid_hex_ok(e->d_name + 5, 40))
		return;
	memcpy(name, e->d_name, 45);
	name[45] = '\0';
	snprintf(idx, sizeof(idx), "%s.idx", name);
	snprintf(keep, sizeof(keep), "%s.keep", name);
	if (fstatat(dirfd(d), e->d_name, &pst, AT_SYMLINK_NOFOLLOW) < 0 ||
	    !S_ISREG(pst.st_mode) ||
	    fstatat(dirfd(d), idx, &ist, AT_SYMLINK_NOFOLLOW) < 0 ||
	    !S_ISREG(ist.st_mode))
		return;
	o = cJSON_CreateObject();
	sbx_json_set_str(o, "name", name);
	cJSON_AddNumberToObject(o, "size", (double)pst.st_size);
	cJSON_AddNumberToObject(o, "idx_size", (double)ist.st_size);
	kfd = openat(dirfd(d), keep, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (kfd >= 0) {
		ssize_t k = read(kfd, kbuf, KEEP_MAX);

		kbuf[k > 0 ? k : 0] = '\0';
		trim(kbuf);
		sbx_json_set_str(o, "keep", kbuf);
		close(kfd);
	}
	cJSON_AddItemToArray(arr, o);
}

/* Every loose object id under `gd`/objects. */
static int list_loose(struct agent *a, const char *gd, cJSON *arr)
{
	return each_entry(a, gd, "objects", add_loose, arr);
}

/* Every pack under `gd`/objects/pack that has its .idx. */
static int list_packs(struct agent *a, const char *gd, cJSON *arr)
{
	return each_entry(a, gd, "objects/pack", add_pack, arr);
}

int agent_h_repo_state(struct agent_req *r)
{
	const char *ref = agent_arg(r, "ref");
	char *path = NULL, *gd = NULL, *head = NULL, *rel = NULL;
	char oid[41] = "";
	cJSON *o = NULL, *loose, *packs;
	struct stat st;
	size_t len;
	int rc, fd;

	rc = arg_path(r, &path);
	if (rc == 0 && ref && !agent_git_ref_name_ok(ref))
		rc = sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				   "bad ref name \"%s\"", ref);
	if (rc == 0)
		rc = git_dir(r->a, path, &gd);
	if (rc == 0) {
		rel = join(gd, "HEAD");
		rc = read_file(r->a, rel, SMALL_FILE_MAX, &head, &len);
		if (rc == -ENOENT) {
			sbx_error_clear();
			rc = 0;
		}
	}
	if (rc == 0 && ref)
		rc = resolve_ref(r->a, gd, ref, oid);
	if (rc < 0)
		goto out;
	o = cJSON_CreateObject();
	if (head) {
		trim(head);
		sbx_json_set_str(o, "head", head);
	}
	if (ref) {
		sbx_json_set_str(o, "ref", ref);
		if (*oid)
			sbx_json_set_str(o, "oid", oid);
		else
			cJSON_AddNullToObject(o, "oid");
	}
	free(rel);
	rel = join(gd, "shallow");
	fd = -1;
	cJSON_AddBoolToObject(o, "shallow",
			      agent_open(r->a, rel, O_PATH | O_NOFOLLOW, 0,
					 &fd) == 0 &&
				      fstat(fd, &st) == 0 && st.st_size > 0);
	if (fd >= 0)
		close(fd);
	sbx_error_clear();
	loose = cJSON_AddArrayToObject(o, "loose");
	packs = cJSON_AddArrayToObject(o, "packs");
	rc = list_loose(r->a, gd, loose);
	if (rc == 0)
		rc = list_packs(r->a, gd, packs);
out:
	free(rel);
	free(head);
	free(gd);
	free(path);
	if (rc < 0) {
		cJSON_Delete(o);
		return agent_reply_error(r, 0, rc);
	}
	return agent_reply_json(r, 200, o);
}

/* ---- POST /v1/repo/objects ----------------------------------------------- */

struct objs {
	struct agent_stream base;
	struct agent *a;
	char *objdir;   /* ".../.git/objects", beneath the root */
	char **names;
	size_t n, i;
	int fd;         /* the file being sent, or -1 */
	uint64_t size, off;
	bool ended;
};

static void objs_fini(struct agent_stream *s)
{
	struct objs *o = (struct objs *)s;

	if (o->fd >= 0)
		close(o->fd);
	for (size_t i = 0; i < o->n; i++)
		free(o->names[i]);
	free(o->names);
	free(o->objdir);
	free(o);
}

static void name_error(struct sbx_buf *out, const char *name, int rc)
{
	cJSON *h = cJSON_CreateObject(), *e = cJSON_CreateObject();

	sbx_json_set_str(h, "name", name);
	sbx_json_set_str(e, "errno", sbx_errno_name(-rc));
	sbx_json_set_str(e, "message", sbx_error_last()->msg);
	cJSON_AddItemToObject(h, "error", e);
	agent_frame(out, h, NULL, 0);
	sbx_error_clear();
}

static int objs_next(struct agent_stream *s, struct sbx_buf *out)
{
	struct objs *o = (struct objs *)s;
	char *data = NULL;

	if (o->ended)
		return 1;
	data = sbx_xmalloc(READ_CHUNK);
	while (out->len < OUT_CHUNK) {
		const char *name;
		size_t want;
		ssize_t n;
		cJSON *h;

		if (o->fd < 0) {
			char *rel;
			struct stat st;
			int rc;

			if (o->i == o->n) {
				cJSON *end = cJSON_CreateObject();

				cJSON_AddBoolToObject(end, "end", 1);
				agent_frame(out, end, NULL, 0);
				o->ended = true;
				break;
			}
			name = o->names[o->i];
			rel = join(o->objdir, name);
			rc = agent_open(o->a, rel, O_RDONLY | O_NOFOLLOW, 0,
					&o->fd);
			if (rc == 0 && fstat(o->fd, &st) < 0)
				rc = sbx_error_os("stat %s", rel);
			if (rc == 0 && !S_ISREG(st.st_mode))
				rc = sbx_error_set(SBX_ERR_OS, -EINVAL,
						   "%s is not a file", rel);
			free(rel);
			if (rc < 0) {
				if (o->fd >= 0)
					close(o->fd);
				o->fd = -1;
				name_error(out, name, rc);
				o->i++;
				continue;
			}
			o->size = (uint64_t)st.st_size;
			o->off = 0;
		}
		name = o->names[o->i];
		want = o->size - o->off < READ_CHUNK ? o->size - o->off
						     : READ_CHUNK;
		/* Leave room: one frame must fit the stream buffer. */
		if (out->len && out->len + want + 1024 > out->cap)
			break;
		n = want ? pread(o->fd, data, want, (off_t)o->off) : 0;
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 || (size_t)n != want) {
			/* Changed under us (a repack): report, go on. */
			if (n < 0)
				sbx_error_os("read %s", name);
			else
				sbx_error_set(SBX_ERR_OS, -EIO,
					      "%s changed while being read",
					      name);
			name_error(out, name, n < 0 ? -errno : -EIO);
			close(o->fd);
			o->fd = -1;
			o->i++;
			continue;
		}
		h = cJSON_CreateObject();
		sbx_json_set_str(h, "name", name);
		cJSON_AddNumberToObject(h, "size", (double)o->size);
		cJSON_AddNumberToObject(h, "offset", (double)o->off);
		cJSON_AddNumberToObject(h, "len", (double)n);
		agent_frame(out, h, data, (size_t)n);
		o->off += (uint64_t)n;
		if (o->off >= o->size) {
			close(o->fd);
			o->fd = -1;
			o->i++;
		}
	}
	free(data);
	return 0;
}

int agent_h_repo_objects(struct agent_req *r)
{
	char *path = NULL, *gd = NULL;
	cJSON *doc = NULL, *it;
	const cJSON *names;
	struct objs *o = NULL;
	int rc, n;

	rc = arg_path(r, &path);
	if (rc == 0)
		rc = git_dir(r->a, path, &gd);
	if (rc == 0)
		rc = agent_body_json(r, &doc);
	if (rc < 0)
		goto fail;
	names = cJSON_GetObjectItemCaseSensitive(doc, "names");
	if (!cJSON_IsArray(names) ||
	    (n = cJSON_GetArraySize(names)) > MAX_NAMES) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				   "\"names\" must be an array of at most %d "
				   "object file names",
				   MAX_NAMES);
		goto fail;
	}
	o = sbx_xcalloc(1, sizeof(*o));
	o->names = sbx_xcalloc((size_t)n + 1, sizeof(char *));
	o->fd = -1;
	cJSON_ArrayForEach(it, names)
	{
		if (!cJSON_IsString(it) ||
		    (!agent_git_loose_name_ok(it->valuestring) &&
		     !agent_git_pack_name_ok(it->valuestring))) {
			rc = sbx_error_set(SBX_ERR_PROTO, -EINVAL,
					   "\"%s\" is not an object file name "
					   "(\"ab/cdef...\" or "
					   "\"pack/pack-ID.pack|.idx|.keep\")",
					   cJSON_IsString(it) ? it->valuestring
							      : "?");
			goto fail;
		}
		o->names[o->n++] = sbx_xstrdup(it->valuestring);
	}
	o->a = r->a;
	o->objdir = join(gd, "objects");
	o->base.next = objs_next;
	o->base.fini = objs_fini;
	cJSON_Delete(doc);
	free(gd);
	free(path);
	return agent_reply_stream(r, &o->base);
fail:
	if (o) {
		for (size_t i = 0; i < o->n; i++)
			free(o->names[i]);
		free(o->names);
		free(o);
	}
	cJSON_Delete(doc);
	free(gd);
	free(path);
	return agent_reply_error(r, 0, rc);
}
