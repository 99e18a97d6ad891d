/*
 * GET /v1/fs/bulk (docs/protocol.md, "Bulk"): the subtree under P,
 * breadth first, as a stream of frames (sbx/proto_bulk.h): one or more
 * per directory with every entry's stat, then one per small regular file
 * with its content, and an end frame carrying the watch sequence taken
 * before the walk.  Directories are opened through confine.c; files
 * relative to their directory's fd with O_NOFOLLOW.
 *
 * POST /v1/fs/bulk: the content of a list of files, as file frames and the
 * same end frame (a client's look-ahead prefetch).
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/proto.h"
#include "sbx/proto_bulk.h"
#include "sbx/xmalloc.h"

#include "agent_i.h"

/* A directory frame's JSON stays below the frame limit. */
#define BULK_FRAME_BUDGET (SBX_PROTO_MAX_FRAME_JSON - 4096)
#define BULK_DEFAULT_MAX_FILE (64 * 1024)
#define BULK_DEFAULT_MAX_TOTAL (32LL * 1024 * 1024)
/* Paths in one POST /v1/fs/bulk. */
#define BULK_MAX_FILES 4096

struct bulk_entry {
	char *name;
	struct stat st;
};

struct bulk {
	struct agent_stream base;
	/* directories still to walk, breadth first */
	char **queue;
	int *qdepth;
	size_t qhead, qlen, qcap;
	long long max_file, max_total, total;
	long long max_depth; /* <= 0: unlimited */
	uint64_t watch_seq;
	/* the directory being emitted */
	int dfd;
	char *dpath;
	int ddepth;
	struct stat dst;
	struct bulk_entry *ents;
	size_t nents, emitted, filepos;
};

static void bulk_push(struct bulk *b, char *path, int depth)
{
	if (b->qlen == b->qcap) {
		b->qcap = b->qcap ? b->qcap * 2 : 16;
		b->queue = sbx_xrealloc(b->queue, b->qcap * sizeof(*b->queue));
		b->qdepth = sbx_xrealloc(b->qdepth,
					 b->qcap * sizeof(*b->qdepth));
	}
	b->queue[b->qlen] = path;
	b->qdepth[b->qlen] = depth;
	b->qlen++;
}

static void bulk_dir_done(struct bulk *b)
{
	for (size_t i = 0; i < b->nents; i++)
		free(b->ents[i].name);
	free(b->ents);
	b->ents = NULL;
	b->nents = b->emitted = b->filepos = 0;
	if (b->dfd >= 0)
		close(b->dfd);
	b->dfd = -1;
	free(b->dpath);
	b->dpath = NULL;
}

/* Open and read the next queued directory; -errno for that directory. */
static int bulk_open_dir(struct bulk *b)
{
	struct dirent *e;
	size_t cap = 0;
	DIR *d;
	int fd, rc;

	b->dpath = b->queue[b->qhead];
	b->ddepth = b->qdepth[b->qhead];
	b->queue[b->qhead] = NULL;
	b->qhead++;
	rc = agent_open(b->base.a, b->dpath, O_RDONLY | O_DIRECTORY, 0, &fd);
	if (rc < 0)
		return rc;
	if (fstat(fd, &b->dst) < 0 || !(d = fdopendir(fd))) {
		rc = sbx_error_os("list %s", b->dpath);
		close(fd);
		return rc;
	}
	b->dfd = dup(fd); /* kept for reading files after closedir */
	while ((e = readdir(d))) {
		struct bulk_entry *be;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (b->nents == cap) {
			cap = cap ? cap * 2 : 64;
			b->ents = sbx_xrealloc(b->ents, cap * sizeof(*b->ents));
		}
		be = &b->ents[b->nents];
		if (fstatat(fd, e->d_name, &be->st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		be->name = sbx_xstrdup(e->d_name);
		b->nents++;
		if (S_ISDIR(be->st.st_mode) &&
		    (b->max_depth <= 0 || b->ddepth < b->max_depth))
			bulk_push(b, sbx_proto_path_join(b->dpath, e->d_name),
				  b->ddepth + 1);
	}
	closedir(d);
	if (b->dfd < 0)
		return sbx_error_os("dup");
	return 0;
}

/* One directory frame with as many entries as fit the frame budget. */
static void bulk_dir_frame(struct bulk *b, struct sbx_buf *out)
{
	struct sbx_bulk_frame f = {
		.kind = SBX_BULK_FRAME_DIR, .path = b->dpath, .st = b->dst,
		.continued = b->emitted > 0,
	};
	size_t budget = BULK_FRAME_BUDGET, used = 6 * strlen(b->dpath) + 512;
	cJSON *h = sbx_bulk_frame_encode(&f);

	while (b->emitted < b->nents) {
		const struct bulk_entry *be = &b->ents[b->emitted];
		/* worst case: every byte escaped as \u00XX, 15 long numbers */
		size_t need = 6 * strlen(be->name) + 400;

		if (used + need > budget && used > 6 * strlen(b->dpath) + 512)
			break;
		used += need;
		sbx_bulk_dir_add(h, be->name, &be->st);
		b->emitted++;
	}
	if (b->emitted < b->nents)
		cJSON_AddBoolToObject(h, "more", 1);
	agent_frame(out, h, NULL, 0);
}

/*
 * All st_size bytes of fd (malloc'd, *len_out set), or NULL when the
 * file changed size while being read: it is left to a later read.
 */
static char *read_whole(int fd, const struct stat *st, size_t *len_out)
{
	char *data = sbx_xmalloc((size_t)st->st_size + 1);
	size_t got = 0;

	while (got < (size_t)st->st_size) {
		ssize_t n = pread(fd, data + got, (size_t)st->st_size - got,
				  (off_t)got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	if (got != (size_t)st->st_size) {
		free(data);
		return NULL;
	}
	*len_out = got;
	return data;
}

/*
 * Close fd after reading it whole when it is a regular file of at most
 * max_file bytes that keeps *total within max_total (which it then adds
 * to); *st is taken before reading (the client validates with it later).
 * NULL when it is not, or changed size while being read: the client
 * reads it itself.
 */
static char *read_small(int fd, long long max_file, long long max_total,
			long long *total, struct stat *st, size_t *len_out)
{
	char *data = NULL;

	if (fstat(fd, st) == 0 && S_ISREG(st->st_mode) &&
	    st->st_size <= max_file && *total + st->st_size <= max_total)
		data = read_whole(fd, st, len_out);
	close(fd);
	if (data)
		*total += st->st_size;
	return data;
}

/* The next small file's frame; false when none is left in this dir. */
static bool bulk_file_frame(struct bulk *b, struct sbx_buf *out)
{
	while (b->filepos < b->nents) {
		const struct bulk_entry *be = &b->ents[b->filepos++];
		struct stat st;
		struct sbx_bulk_frame f = { .kind = SBX_BULK_FRAME_FILE };
		char *data, *path;
		size_t got = 0;
		int fd;

		if (!S_ISREG(be->st.st_mode) || be->st.st_size > b->max_file ||
		    b->total + be->st.st_size > b->max_total)
			continue;
		fd = openat(b->dfd, be->name,
			    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY |
				    O_CLOEXEC);
		if (fd < 0)
			continue;
		data = read_small(fd, b->max_file, b->max_total, &b->total,
				  &st, &got);
		if (!data)
			continue;
		path = sbx_proto_path_join(b->dpath, be->name);
		f.path = path;
		f.st = st;
		agent_frame(out, sbx_bulk_frame_encode(&f), data, got);
		free(path);
		free(data);
		return true;
	}
	return false;
}

static int bulk_next(struct agent_stream *s, struct sbx_buf *out)
{
	struct bulk *b = (struct bulk *)s;

	for (;;) {
		if (atomic_load(&s->a->stopping))
			return -ECANCELED;
		if (b->dpath && b->dfd >= 0) {
			if (b->emitted < b->nents || (b->nents == 0 &&
						      b->filepos == 0 &&
						      !b->emitted)) {
				bulk_dir_frame(b, out);
				if (b->nents == 0)
					b->filepos = 1; /* empty dir: done */
				return 0;
			}
			if (bulk_file_frame(b, out))
				return 0;
			bulk_dir_done(b);
			continue;
		}
		if (b->qhead >= b->qlen) {
			struct sbx_bulk_frame f = {
				.kind = SBX_BULK_FRAME_END,
				.watch_seq = b->watch_seq,
			};

			agent_frame(out, sbx_bulk_frame_encode(&f), NULL, 0);
			return 1;
		}
		if (bulk_open_dir(b) < 0) {
			/* A directory that vanished or cannot be read:
			 * say so and go on with the rest. */
			const struct sbx_error *e = sbx_error_last();
			struct sbx_bulk_frame f = {
				.kind = SBX_BULK_FRAME_DIR_ERROR,
				.path = b->dpath, .error = e->code,
				.message = e->msg,
			};

			agent_frame(out, sbx_bulk_frame_encode(&f), NULL, 0);
			bulk_dir_done(b);
			sbx_error_clear();
			return 0;
		}
	}
}

static void bulk_fini(struct agent_stream *s)
{
	struct bulk *b = (struct bulk *)s;

	bulk_dir_done(b);
	for (size_t i = b->qhead; i < b->qlen; i++)
		free(b->queue[i]);
	free(b->queue);
	free(b->qdepth);
	free(b);
}

int agent_bulk_stream(struct agent *a, const char *path, long long max_file,
		      long long max_total, long long depth, uint64_t watch_seq,
		      struct agent_stream **out)
{
	struct stat st;
	struct bulk *b;
	int fd, rc;

	*out = NULL;
	/* Refuse a bad root of the walk before the stream starts. */
	rc = agent_open(a, path, O_PATH | O_DIRECTORY, 0, &fd);
	if (rc < 0)
		return rc;
	if (fstat(fd, &st) < 0)
		rc = sbx_error_os("stat %s", path);
	close(fd);
	if (rc < 0)
		return rc;
	b = sbx_xcalloc(1, sizeof(*b));
	b->base.next = bulk_next;
	b->base.fini = bulk_fini;
	b->base.a = a;
	b->max_file = max_file;
	b->max_total = max_total;
	b->max_depth = depth;
	b->watch_seq = watch_seq;
	b->dfd = -1;
	bulk_push(b, sbx_xstrdup(path), 1);
	*out = &b->base;
	return 0;
}

int agent_h_bulk(struct agent_req *r)
{
	long long max_file, max_total, depth;
	struct agent_stream *s = NULL;
	char *path = NULL;
	int rc;

	rc = agent_req_path(r, "path", &path);
	if (rc == 0)
		rc = agent_arg_int(r, "max_file", BULK_DEFAULT_MAX_FILE, 0,
				   SBX_PROTO_MAX_FRAME_DATA, &max_file);
	if (rc == 0)
		rc = agent_arg_int(r, "max_total", BULK_DEFAULT_MAX_TOTAL, 0,
				   LLONG_MAX / 2, &max_total);
	if (rc == 0)
		rc = agent_arg_int(r, "depth", 0, 0, INT32_MAX, &depth);
	/* Take the sequence before reading anything: a change made during
	 * the walk gets a later number, so the client applies it after. */
	uint64_t seq = agent_watch_seq(r->a);

	if (rc == 0)
		rc = agent_bulk_stream(r->a, path, max_file, max_total, depth,
				       seq, &s);
	free(path);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	return agent_reply_stream(r, s);
}

/* ---- POST /v1/fs/bulk: the content of listed files ----------------------- */

/*
 * The look-ahead prefetch of a client (docs/design.md, "Scale") asks for
 * the files its walk will read next, which the walk's own content budget
 * left out: file frames only, in the order asked, then the end frame.
 */
struct bulk_files {
	struct agent_stream base;
	char **paths;
	size_t n, pos;
	long long max_file, max_total, total;
	uint64_t watch_seq;
};

static int files_next(struct agent_stream *s, struct sbx_buf *out)
{
	struct bulk_files *b = (struct bulk_files *)s;
	struct sbx_bulk_frame end = {
		.kind = SBX_BULK_FRAME_END, .watch_seq = b->watch_seq,
	};

	while (b->pos < b->n) {
		const char *path = b->paths[b->pos++];
		struct sbx_bulk_frame f = { .kind = SBX_BULK_FRAME_FILE };
		struct stat st;
		size_t got = 0;
		char *data;
		int fd;

		if (atomic_load(&s->a->stopping))
			return -ECANCELED;
		if (agent_open(s->a, path,
			       O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY,
			       0, &fd) < 0) {
			/* Gone or not ours to read: the client reads it
			 * itself and gets the error there. */
			sbx_error_clear();
			continue;
		}
		data = read_small(fd, b->max_file, b->max_total, &b->total,
				  &st, &got);
		if (!data)
			continue;
		f.path = path;
		f.st = st;
		agent_frame(out, sbx_bulk_frame_encode(&f), data, got);
		free(data);
		return 0;
	}
	agent_frame(out, sbx_bulk_frame_encode(&end), NULL, 0);
	return 1;
}

static void files_fini(struct agent_stream *s)
{
	struct bulk_files *b = (struct bulk_files *)s;

	for (size_t i = 0; i < b->n; i++)
		free(b->paths[i]);
	free(b->paths);
	free(b);
}

/* A non-negative integer field of the body, or def when absent. */
static int body_int(const cJSON *j, const char *key, long long def,
		    long long max, long long *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);

	*out = def;
	if (!v)
		return 0;
	if (!cJSON_IsNumber(v) || v->valuedouble < 0 ||
	    v->valuedouble > (double)max)
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "bulk: bad \"%s\"", key);
	*out = (long long)v->valuedouble;
	return 0;
}

int agent_h_bulk_files(struct agent_req *r)
{
	struct bulk_files *b = NULL;
	const cJSON *files, *e;
	cJSON *j = NULL;
	/* Before reading anything, as for the walk (agent_h_bulk). */
	uint64_t seq = agent_watch_seq(r->a);
	int rc = agent_body_json(r, &j);

	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	b = sbx_xcalloc(1, sizeof(*b));
	b->base.next = files_next;
	b->base.fini = files_fini;
	b->base.a = r->a;
	b->watch_seq = seq;
	files = cJSON_GetObjectItemCaseSensitive(j, "files");
	if (!cJSON_IsArray(files) ||
	    cJSON_GetArraySize(files) > BULK_MAX_FILES)
		rc = sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				   "bulk: \"files\" must be an array of at "
				   "most %d paths", BULK_MAX_FILES);
	if (rc == 0)
		rc = body_int(j, "max_file", BULK_DEFAULT_MAX_FILE,
			      SBX_PROTO_MAX_FRAME_DATA, &b->max_file);
	if (rc == 0)
		rc = body_int(j, "max_total", BULK_DEFAULT_MAX_TOTAL,
			      LLONG_MAX / 2, &b->max_total);
	if (rc == 0) {
		b->paths = sbx_xcalloc((size_t)cJSON_GetArraySize(files) + 1,
				       sizeof(*b->paths));
		cJSON_ArrayForEach(e, files)
		{
			if (!cJSON_IsString(e)) {
				rc = sbx_error_set(SBX_ERR_PROTO, -EINVAL,
						   "bulk: a path that is not "
						   "a string");
				break;
			}
			rc = agent_path_norm(e->valuestring,
					     &b->paths[b->n]);
			if (rc < 0)
				break;
			b->n++;
		}
	}
	cJSON_Delete(j);
	if (rc < 0) {
		files_fini(&b->base);
		return agent_reply_error(r, 0, rc);
	}
	return agent_reply_stream(r, &b->base);
}
