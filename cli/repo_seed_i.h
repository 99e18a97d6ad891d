/*
 * The state of one seeding (cli/repo_seed.c prepares it and builds the
 * pack; cli/repo_seed_tar.c streams the tar), private to those two files.
 * repo_i.h has the interface (cli_seed_prepare/send/free).
 *
 * Threads: the pack builder (repo_seed.c) and the tar producer
 * (repo_seed_tar.c) each run on a thread of their own; the fields they
 * share are said below.
 */
#ifndef CLI_REPO_SEED_I_H
#define CLI_REPO_SEED_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include <git2.h>

#include "sbx/error.h"

#include "repo_i.h"

/* A submodule entry (mode 160000). */
#define IS_GITLINK(m) (((m) & 0170000) == 0160000)

/* One path that --carry-changes brings along. */
struct carried {
	char *path;
	unsigned status;      /* git_status_t bits */
	bool staged;          /* the source index has an entry to copy */
	git_index_entry entry; /* that entry (path points to `path`) */
};

struct cli_seed {
	char *session;
	char *branch;         /* "sbx/NAME" */
	char *workdir;        /* the source's working directory, no '/' */
	char *repo_path;      /* what git_repository_open takes */
	git_repository *repo;
	git_oid start;
	bool continued;       /* started from an existing sbx/NAME */
	int depth;
	bool progress;
	char *user_name, *user_email;
	char *exclude;        /* info/exclude, or NULL */
	size_t exclude_len;
	struct carried *carry;
	size_t ncarry;
	bool carry_on;

	/* the pack builder (its own thread and repository handle) */
	char *tmpdir;
	pthread_t pack_thread;
	bool pack_started, pack_joined;
	atomic_bool pack_done;   /* set by the pack thread as it ends */
	int pack_rc;
	struct sbx_error pack_err;
	char *pack_name;      /* "pack-<hex>" built here, or NULL */
	size_t pack_objects;
	char **reuse;         /* the repository's packs sent as they are:
			       * paths without ".pack" */
	size_t nreuse;
	git_oid *shallow;
	size_t nshallow;
};

/* The carried change of `path`, or NULL (sd->carry is sorted by path). */
struct carried *cli_seed_carried_find(struct cli_seed *sd, const char *path);

/*
 * Wait for the pack builder; its result (0, or its error, set again on
 * this thread).  Once joined, later calls return the same.
 */
int cli_seed_pack_wait(struct cli_seed *sd);

#endif
