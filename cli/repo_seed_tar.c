/*
 * The seeding tar (repo_i.h, cli_seed_send()): the working tree, then
 * .git (HEAD, config, exclude, shallow, the pack), then .git/index, in
 * one request; see cli/repo_seed.c for the whole story.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <git2.h>

#include "sbx/buf.h"
#include "sbx/gitsource.h"
#include "sbx/log.h"
#include "sbx/provider.h"
#include "sbx/xmalloc.h"
#include "repo_i.h"
#include "repo_seed_i.h"

/* ---- the stream ---------------------------------------------------------- */

struct producer {
	struct cli_seed *sd;
	struct cli_tar tar;
	int rc;
	struct sbx_error err;
	int64_t now;
	uint64_t files, total;
	struct timespec start, last;
	bool printed;
};

static double since(const struct timespec *a)
{
	struct timespec b;

	clock_gettime(CLOCK_MONOTONIC, &b);
	return (double)(b.tv_sec - a->tv_sec) +
	       (double)(b.tv_nsec - a->tv_nsec) / 1e9;
}

static int progress(uint64_t written, void *payload)
{
	struct producer *p = payload;

	if (!p->sd->progress || since(&p->last) < 0.2)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &p->last);
	if (p->total > written)
		fprintf(stderr, "\rsbx: seeding %s: %.1f of ~%.1f MiB, %llu "
				"files ",
			p->sd->session, (double)written / 1048576.0,
			(double)p->total / 1048576.0,
			(unsigned long long)p->files);
	else
		fprintf(stderr, "\rsbx: seeding %s: %.1f MiB, %llu files ",
			p->sd->session, (double)written / 1048576.0,
			(unsigned long long)p->files);
	p->printed = true;
	return 0;
}

#define WT_CHANGED                                                       \
	(GIT_STATUS_WT_MODIFIED | GIT_STATUS_WT_DELETED |                  \
	 GIT_STATUS_WT_TYPECHANGE | GIT_STATUS_WT_NEW)

/*
 * The new index: the start commit's tree, then the carried staged state
 * (entries added or replaced, staged deletions removed) with mtime 1 s
 * for paths whose working file differs from the staged blob.
 */
static int build_index(struct cli_seed *sd, git_index **out)
{
	git_commit *c = NULL;
	git_tree *tree = NULL;
	git_index *idx = NULL;
	char *path = sbx_xasprintf("%s/index", sd->tmpdir);
	int rc;

	*out = NULL;
	rc = git_index_open(&idx, path);
	if (rc == 0)
		rc = git_commit_lookup(&c, sd->repo, &sd->start);
	if (rc == 0)
		rc = git_commit_tree(&tree, c);
	if (rc == 0)
		rc = git_index_read_tree(idx, tree);
	if (rc < 0) {
		rc = sbx_git_fail(rc, "cannot build the index");
		goto out;
	}
	for (size_t i = 0; i < sd->ncarry; i++) {
		struct carried *k = &sd->carry[i];
		const git_index_entry *cur;
		git_index_entry e;

		if (k->status & GIT_STATUS_INDEX_DELETED) {
			rc = git_index_remove_bypath(idx, k->path);
		} else if (k->staged) {
			e = k->entry;
			memset(&e.ctime, 0, sizeof(e.ctime));
			memset(&e.mtime, 0, sizeof(e.mtime));
			e.dev = e.ino = e.uid = e.gid = 0;
			e.file_size = 0;
			if (k->status & WT_CHANGED)
				e.mtime.seconds = 1;
			rc = git_index_add(idx, &e);
		} else if ((k->status & WT_CHANGED) &&
			   (cur = git_index_get_bypath(idx, k->path, 0))) {
			/* Unstaged: the entry stays, marked "look again". */
			e = *cur;
			e.mtime.seconds = 1;
			rc = git_index_add(idx, &e);
		} else {
			rc = 0;
		}
		if (rc < 0) {
			rc = sbx_git_fail(rc, "cannot stage %s in the new "
					  "index", k->path);
			goto out;
		}
	}
	*out = idx;
	idx = NULL;
	rc = 0;
out:
	git_index_free(idx);
	git_tree_free(tree);
	git_commit_free(c);
	free(path);
	return rc;
}

/* Does the repository ask for checkout filters (attributes, CRLF)? */
static bool needs_filters(struct cli_seed *sd, git_index *idx)
{
	git_config *cfg = NULL;
	const char *v = NULL;
	bool yes = false;

	for (size_t i = 0; i < git_index_entrycount(idx); i++) {
		const char *p = git_index_get_byindex(idx, i)->path;
		const char *b = strrchr(p, '/');

		if (!strcmp(b ? b + 1 : p, ".gitattributes"))
			return true;
	}
	if (git_repository_config_snapshot(&cfg, sd->repo) == 0) {
		if ((git_config_get_string(&v, cfg, "core.autocrlf") == 0 &&
		     strcmp(v, "false") != 0) ||
		    git_config_get_string(&v, cfg, "core.eol") == 0)
			yes = true;
		git_config_free(cfg);
	}
	git_error_clear();
	return yes;
}

/* A file of the checkout (--carry-changes), as it is on disk now. */
static int send_disk(struct producer *p, const char *path)
{
	char *full = sbx_xasprintf("%s/%s", p->sd->workdir, path);
	struct stat st;
	int fd = -1, rc = 0;

	if (lstat(full, &st) < 0) {
		rc = errno == ENOENT ? 0 : sbx_error_os("carry %s", full);
		goto out;
	}
	if (S_ISLNK(st.st_mode)) {
		char target[4096];
		ssize_t n = readlink(full, target, sizeof(target) - 1);

		if (n < 0) {
			rc = sbx_error_os("carry %s", full);
			goto out;
		}
		target[n] = '\0';
		rc = cli_tar_symlink(&p->tar, path, target, p->now);
	} else if (S_ISREG(st.st_mode)) {
		fd = open(full, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0 || fstat(fd, &st) < 0) {
			rc = sbx_error_os("carry %s", full);
			goto out;
		}
		rc = cli_tar_file_fd(&p->tar, path, st.st_mode & 07777, p->now,
				     fd, (uint64_t)st.st_size);
	} else if (S_ISDIR(st.st_mode)) {
		rc = cli_tar_dir(&p->tar, path, 0755, p->now);
	}
	p->files++;
out:
	if (fd >= 0)
		close(fd);
	free(full);
	return rc;
}

/* An index entry's file from its blob. */
static int send_blob(struct producer *p, const git_index_entry *e,
		     bool filters)
{
	git_blob *blob = NULL;
	git_buf buf = GIT_BUF_INIT;
	const void *data;
	size_t len;
	int rc;

	rc = git_blob_lookup(&blob, p->sd->repo, &e->id);
	if (rc < 0)
		return sbx_git_fail(rc, "cannot read the blob of %s",
				    e->path);
	if (S_ISLNK(e->mode)) {
		char *target = sbx_xstrndup(git_blob_rawcontent(blob),
					    (size_t)git_blob_rawsize(blob));

		rc = cli_tar_symlink(&p->tar, e->path, target, p->now);
		free(target);
		goto out;
	}
	data = git_blob_rawcontent(blob);
	len = (size_t)git_blob_rawsize(blob);
	if (filters) {
		git_blob_filter_options fo = GIT_BLOB_FILTER_OPTIONS_INIT;

		fo.flags = GIT_BLOB_FILTER_CHECK_FOR_BINARY |
			   GIT_BLOB_FILTER_ATTRIBUTES_FROM_COMMIT;
		git_oid_cpy(&fo.attr_commit_id, &p->sd->start);
		rc = git_blob_filter(&buf, blob, e->path, &fo);
		if (rc < 0) {
			rc = sbx_git_fail(rc, "cannot filter %s", e->path);
			goto out;
		}
		data = buf.ptr;
		len = buf.size;
	}
	rc = cli_tar_file(&p->tar, e->path,
			  (e->mode & 0111) ? 0755 : 0644, p->now, data, len);
out:
	p->files++;
	git_buf_dispose(&buf);
	git_blob_free(blob);
	return rc;
}

static int send_file_at(struct producer *p, const char *name,
			const char *path, unsigned mode)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC), rc;

	if (fd < 0 || fstat(fd, &st) < 0) {
		rc = sbx_error_os("open %s", path);
		if (fd >= 0)
			close(fd);
		return rc;
	}
	rc = cli_tar_file_fd(&p->tar, name, mode, p->now, fd,
			     (uint64_t)st.st_size);
	close(fd);
	return rc;
}

/* A git config value, quoted. */
static void cfg_value(struct sbx_buf *b, const char *v)
{
	int rc = sbx_buf_adds(b, "\"");

	for (; rc == 0 && *v; v++) {
		if (*v == '"' || *v == '\\')
			rc = sbx_buf_addf(b, "\\%c", *v);
		else if (*v == '\n')
			rc = sbx_buf_adds(b, "\\n");
		else
			rc = sbx_buf_add(b, v, 1);
	}
	if (rc == 0)
		rc = sbx_buf_adds(b, "\"\n");
	if (rc < 0)
		abort();
}

static int send_git_dir(struct producer *p, git_index *idx)
{
	struct cli_seed *sd = p->sd;
	char oid[GIT_OID_HEXSZ + 1], *text, *name, *path;
	struct sbx_buf b;
	int rc;

	/* HEAD, the branch, the directories git looks for. */
	text = sbx_xasprintf("ref: refs/heads/%s\n", sd->branch);
	rc = cli_tar_file(&p->tar, ".git/HEAD", 0644, p->now, text,
			  strlen(text));
	free(text);
	git_oid_tostr(oid, sizeof(oid), &sd->start);
	name = sbx_xasprintf(".git/refs/heads/%s", sd->branch);
	text = sbx_xasprintf("%s\n", oid);
	if (rc == 0)
		rc = cli_tar_file(&p->tar, name, 0644, p->now, text,
				  strlen(text));
	free(name);
	free(text);
	if (rc == 0)
		rc = cli_tar_dir(&p->tar, ".git/refs/tags", 0755, p->now);
	if (rc == 0)
		rc = cli_tar_dir(&p->tar, ".git/objects/info", 0755, p->now);
	if (rc == 0)
		rc = cli_tar_dir(&p->tar, ".git/info", 0755, p->now);

	/* config */
	sbx_buf_init(&b, 1024 * 1024);
	if (sbx_buf_adds(&b, "[core]\n\trepositoryformatversion = 0\n"
			     "\tfilemode = true\n\tbare = false\n"
			     "\tlogallrefupdates = true\n") < 0)
		abort();
	if (sd->user_name || sd->user_email) {
		if (sbx_buf_adds(&b, "[user]\n") < 0)
			abort();
		if (sd->user_name) {
			if (sbx_buf_adds(&b, "\tname = ") < 0)
				abort();
			cfg_value(&b, sd->user_name);
		}
		if (sd->user_email) {
			if (sbx_buf_adds(&b, "\temail = ") < 0)
				abort();
			cfg_value(&b, sd->user_email);
		}
	}
	if (rc == 0)
		rc = cli_tar_file(&p->tar, ".git/config", 0644, p->now,
				  sbx_buf_ptr(&b), sbx_buf_len(&b));
	sbx_buf_fini(&b);
	if (rc == 0 && sd->exclude)
		rc = cli_tar_file(&p->tar, ".git/info/exclude", 0644, p->now,
				  sd->exclude, sd->exclude_len);
	if (rc == 0 && sd->nshallow) {
		sbx_buf_init(&b, 64 * 1024 * 1024);
		for (size_t i = 0; i < sd->nshallow; i++) {
			git_oid_tostr(oid, sizeof(oid), &sd->shallow[i]);
			if (sbx_buf_addf(&b, "%s\n", oid) < 0)
				abort();
		}
		rc = cli_tar_file(&p->tar, ".git/shallow", 0644, p->now,
				  sbx_buf_ptr(&b), sbx_buf_len(&b));
		sbx_buf_fini(&b);
	}
	if (rc < 0)
		return rc;

	/* The pack (waits for the builder, keeping the stream alive), its
	 * .idx and a .keep that tells a later pull the sandbox got it from
	 * here. */
	for (unsigned ms = 0; !atomic_load(&sd->pack_done); ms += 100) {
		struct timespec ts = { 0, 100 * 1000000L };

		nanosleep(&ts, NULL);
		if (ms && ms % 5000 == 0) {
			rc = cli_tar_keepalive(&p->tar, "sbx: building the "
							"pack");
			if (rc < 0)
				return rc;
		}
	}
	rc = cli_seed_pack_wait(sd);
	if (rc < 0)
		return rc;
	git_oid_tostr(oid, sizeof(oid), &sd->start);
	text = sbx_xasprintf("sbx seed %s\n", oid);
	for (size_t k = 0; rc == 0 && k <= sd->nreuse; k++) {
		static const char *const ext[] = { "pack", "idx" };
		char *prefix = k < sd->nreuse
				       ? sbx_xstrdup(sd->reuse[k])
				       : sd->pack_name
						 ? sbx_xasprintf("%s/%s",
								 sd->tmpdir,
								 sd->pack_name)
						 : NULL;
		const char *base = prefix ? strrchr(prefix, '/') + 1 : NULL;

		for (size_t i = 0; prefix && i < 2 && rc == 0; i++) {
			name = sbx_xasprintf(".git/objects/pack/%s.%s", base,
					     ext[i]);
			path = sbx_xasprintf("%s.%s", prefix, ext[i]);
			rc = send_file_at(p, name, path, 0444);
			free(name);
			free(path);
		}
		if (prefix && rc == 0) {
			name = sbx_xasprintf(".git/objects/pack/%s.keep",
					     base);
			rc = cli_tar_file(&p->tar, name, 0644, p->now, text,
					  strlen(text));
			free(name);
		}
		free(prefix);
	}
	free(text);

	/* The index, last: the agent refreshes it after extracting. */
	if (rc == 0) {
		rc = git_index_write(idx);
		if (rc < 0)
			rc = sbx_git_fail(rc, "cannot write the index");
	}
	if (rc == 0) {
		path = sbx_xasprintf("%s/index", sd->tmpdir);
		rc = send_file_at(p, ".git/index", path, 0644);
		free(path);
	}
	return rc;
}

static int write_tar(struct producer *p)
{
	struct cli_seed *sd = p->sd;
	git_index *idx = NULL;
	git_odb *odb = NULL;
	bool filters;
	int rc;

	rc = build_index(sd, &idx);
	if (rc < 0)
		return rc;
	filters = needs_filters(sd, idx);
	/* A size estimate for the progress line. */
	if (sd->progress && git_repository_odb(&odb, sd->repo) == 0) {
		for (size_t i = 0; i < git_index_entrycount(idx); i++) {
			size_t len;
			git_object_t type;

			if (git_odb_read_header(
				    &len, &type, odb,
				    &git_index_get_byindex(idx, i)->id) == 0)
				p->total += len;
		}
		git_odb_free(odb);
		git_error_clear();
	}
	/* 1. the working tree */
	for (size_t i = 0; rc == 0 && i < git_index_entrycount(idx); i++) {
		const git_index_entry *e = git_index_get_byindex(idx, i);
		struct carried *k;

		if (GIT_INDEX_ENTRY_STAGE(e) != 0)
			continue;
		if (IS_GITLINK(e->mode)) {
			rc = cli_tar_dir(&p->tar, e->path, 0755, p->now);
			continue;
		}
		k = sd->carry_on ? cli_seed_carried_find(sd, e->path) : NULL;
		if (k && (k->status & WT_CHANGED))
			rc = send_disk(p, e->path); /* absent: deleted */
		else
			rc = send_blob(p, e, filters);
	}
	/* untracked files of --carry-changes */
	for (size_t i = 0; rc == 0 && i < sd->ncarry; i++)
		if (sd->carry[i].status & GIT_STATUS_WT_NEW)
			rc = send_disk(p, sd->carry[i].path);
	/* 2 and 3 */
	if (rc == 0)
		rc = send_git_dir(p, idx);
	if (rc == 0)
		rc = cli_tar_end(&p->tar);
	git_index_free(idx);
	return rc;
}

static void *produce(void *arg)
{
	struct producer *p = arg;

	p->rc = write_tar(p);
	if (p->rc < 0)
		p->err = *sbx_error_last();
	/* EOF for the request body (a cut stream if we failed). */
	shutdown(p->tar.fd, SHUT_WR);
	close(p->tar.fd);
	return NULL;
}

int cli_seed_send(struct cli_seed *sd, struct sbx_sandbox *sb)
{
	struct sbx_repo_seed_result res;
	struct producer p;
	pthread_t th;
	char oid[GIT_OID_HEXSZ + 1];
	int sv[2], rc;

	if (!sb->ops->repo_seed)
		return sbx_error_set(SBX_ERR_CONFIG, -ENOSYS,
				     "this provider's sandboxes cannot receive "
				     "a repository");
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return sbx_error_os("socketpair");
	memset(&p, 0, sizeof(p));
	p.sd = sd;
	p.tar.fd = sv[0];
	p.tar.progress = progress;
	p.tar.payload = &p;
	p.now = (int64_t)time(NULL);
	clock_gettime(CLOCK_MONOTONIC, &p.start);
	p.last = p.start;
	rc = pthread_create(&th, NULL, produce, &p);
	if (rc) {
		close(sv[0]);
		close(sv[1]);
		return sbx_error_set(SBX_ERR_OS, -rc, "cannot start a thread");
	}
	rc = sb->ops->repo_seed(sb, "", sv[1], &res);
	/* The producer stops at its next write if the request failed. */
	shutdown(sv[1], SHUT_RDWR);
	close(sv[1]);
	pthread_join(th, NULL);
	if (p.printed)
		fputc('\n', stderr);
	if (p.rc < 0 && (rc == 0 || rc == -EINVAL || rc == -EPIPE ||
			 rc == -ECONNRESET || rc == -EIO))
		/* Our failure is the cause: say that, not "truncated". */
		rc = sbx_error_setd(p.err.klass, p.err.code, p.err.detail,
				    "%s", p.err.msg);
	if (rc < 0)
		return rc;
	git_oid_tostr(oid, sizeof(oid), &sd->start);
	fprintf(stderr,
		"sbx: seeded session %s with %s at %.12s on branch %s%s: "
		"%llu files, %zu objects, %.1f MiB in %.1f s\n",
		sd->session, sd->workdir, oid, sd->branch,
		sd->continued ? " (continued)" : "",
		(unsigned long long)p.files, sd->pack_objects,
		(double)p.tar.written / 1048576.0, since(&p.start));
	sbx_debug("seed %s: %llu entries, %llu bytes, index %llu/%llu "
		  "refreshed",
		  sd->session, (unsigned long long)res.entries,
		  (unsigned long long)res.bytes,
		  (unsigned long long)res.index_refreshed,
		  (unsigned long long)res.index_entries);
	return 0;
}

/* rm -r of the temporary directory (flat: pack, idx, index). */
