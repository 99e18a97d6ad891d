/*
 * The repository of a sandbox on another machine (docs/design.md,
 * "Repository in and out"): `sbx up --repo` seeds it, `sbx pull` and
 * `sbx down` bring its commits back, `sbx status` compares the two.
 *
 *   repo_tar.c   a streaming tar writer (ustar + pax) for the seed
 *   repo_seed.c  the seed: pack (git_packbuilder), index, working files
 *   repo_pull.c  the pull: loose objects and packs into the local odb,
 *                checked, then refs/sbx/pulled/NAME and sbx/NAME
 *
 * The sandbox side is the agent's /v1/repo routes through the data
 * plane's optional repo_* operations (sbx/provider.h); the agent has no
 * git library, so every git computation happens here, with libgit2.
 *
 * Threads: a seed runs two helper threads (the pack builder and the tar
 * producer), both joined before cli_seed_send()/cli_seed_free() return,
 * so the CLI is single-threaded again when it forks the daemon.
 *
 * Errors: 0 / negative errno with sbx_error_last() (class GIT for libgit2
 * failures, CONFIG for a bad repository or revision, STATE/-EBUSY for a
 * refused pull).
 */
#ifndef SBX_CLI_REPO_I_H
#define SBX_CLI_REPO_I_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "sbx/error.h"

struct cJSON;
struct sbx_sandbox;
struct sbx_session;

#define CLI_BRANCH_PREFIX "sbx/"
/* Where a pull keeps the sandbox's branch head, whatever sbx/NAME says. */
#define CLI_PULLED_PREFIX "refs/sbx/pulled/"

/* ---- repo_odb.c --------------------------------------------------------- */

/* A set of object ids (open addressing); zero-initialised is empty. */
struct cli_oidset {
	struct git_oid *slots;
	unsigned char *used;
	size_t cap, n;
};

struct git_oid;
bool cli_oidset_has(const struct cli_oidset *s, const struct git_oid *id);
void cli_oidset_add(struct cli_oidset *s, const struct git_oid *id);
void cli_oidset_fini(struct cli_oidset *s);

/*
 * The object ids listed by a pack index (versions 1 and 2) of `len`
 * bytes: *ids_out (malloc'd, *n_out of them).  -EINVAL when malformed.
 */
SBX_WUR int cli_idx_oids(struct git_oid **ids_out, size_t *n_out,
			 const unsigned char *d, size_t len);

/* ---- repo_tar.c --------------------------------------------------------- */

/*
 * A tar stream written to a descriptor as it is produced: ustar headers,
 * with a pax header for names or link targets longer than ustar holds.
 * `written` counts every byte (for progress).  Errors: -errno of write(2)
 * (SBX_ERR_OS), EPIPE when the reader went away.
 */
struct cli_tar {
	int fd;
	uint64_t written;
	int (*progress)(uint64_t written, void *payload); /* may be NULL */
	void *payload;
};

SBX_WUR int cli_tar_file(struct cli_tar *t, const char *name, unsigned mode,
			 int64_t mtime, const void *data, size_t len);
/* A file whose `size` bytes are read from `fd` (to exactly that size). */
SBX_WUR int cli_tar_file_fd(struct cli_tar *t, const char *name,
			    unsigned mode, int64_t mtime, int fd,
			    uint64_t size);
SBX_WUR int cli_tar_symlink(struct cli_tar *t, const char *name,
			    const char *target, int64_t mtime);
SBX_WUR int cli_tar_dir(struct cli_tar *t, const char *name, unsigned mode,
			int64_t mtime);
/*
 * A pax global header ('g') holding only a comment: readers ignore it.
 * Sent while the stream has nothing else to say, so that the transfer's
 * stall limit (docs/design.md, "Time bounds") does not take a slow pack
 * build for a dead connection.
 */
SBX_WUR int cli_tar_keepalive(struct cli_tar *t, const char *comment);
SBX_WUR int cli_tar_end(struct cli_tar *t);

/* ---- repo_seed.c -------------------------------------------------------- */

struct cli_seed_opts {
	const char *session;
	const char *repo;   /* a directory in the repository; NULL: cwd */
	const char *ref;    /* start point; NULL: sbx/NAME if the repository
			     * has it (continued, as the local provider
			     * does), else HEAD */
	bool carry;         /* the checkout's uncommitted changes too */
	int depth;          /* commits of history; 0: all */
	bool progress;      /* progress lines on stderr */
};

struct cli_seed;

/*
 * Everything that can be checked before the sandbox exists: open the
 * repository (-EINVAL CONFIG when there is none), resolve the start
 * point, apply the local provider's branch rules (-EEXIST STATE for --ref
 * with an existing sbx/NAME), capture --carry-changes.  Starts building
 * the pack in a thread.  *out is freed with cli_seed_free().
 */
SBX_WUR int cli_seed_prepare(struct cli_seed **out,
			     const struct cli_seed_opts *o);

/* The repository's working directory (toplevel), for the session record. */
const char *cli_seed_repo(const struct cli_seed *sd);

/*
 * Stream the repository into `sb`'s workdir in one request (repo_seed):
 * the working tree, .git with HEAD on sbx/NAME, the pack and its index,
 * the index file.  -ENOTEMPTY when the workdir is not empty, -ENOSYS when
 * the provider (or its agent) cannot receive one.
 */
SBX_WUR int cli_seed_send(struct cli_seed *sd, struct sbx_sandbox *sb);

/* Join the helper threads, remove temporary files.  Accepts NULL. */
void cli_seed_free(struct cli_seed *sd);

/* ---- repo_pull.c -------------------------------------------------------- */

enum cli_pull_outcome {
	CLI_PULL_NO_REPO = 0,  /* the sandbox has no repository */
	CLI_PULL_NO_BRANCH,    /* ... but no sbx/NAME */
	CLI_PULL_UP_TO_DATE,   /* sbx/NAME is the sandbox's head */
	CLI_PULL_CREATED,      /* sbx/NAME made at the sandbox's head */
	CLI_PULL_FAST_FORWARD, /* sbx/NAME moved forward to it */
	CLI_PULL_AHEAD,        /* sbx/NAME already contains it */
};

struct cli_pull_result {
	int outcome;        /* enum cli_pull_outcome */
	char head[41];      /* the sandbox's sbx/NAME ("" when none) */
	char before[41];    /* local sbx/NAME before ("" when none) */
	char sandbox_head[128]; /* the sandbox's HEAD as stored */
	uint64_t objects;   /* objects received */
	uint64_t bytes;     /* bytes received */
	unsigned requests;  /* requests to the sandbox */
};

const char *cli_pull_outcome_name(int outcome);

/*
 * Bring the sandbox's sbx/NAME into the repository at `repo` (a directory
 * in it): receive the objects it lacks, check that the head's history is
 * complete, set refs/sbx/pulled/NAME, then create or fast-forward
 * refs/heads/sbx/NAME.  A diverged sbx/NAME, or one checked out in a
 * worktree that would have to move, is never touched: -EBUSY (STATE)
 * naming both commits and what to do (the sandbox's commits are then in
 * refs/sbx/pulled/NAME).
 */
SBX_WUR int cli_repo_pull(struct cli_pull_result *out, struct sbx_sandbox *sb,
			  const char *repo, const char *session);

/*
 * The "branch" object of `sbx status`: {"name","head","local","pulled"}
 * from the sandbox's sbx/NAME and the local one.  *out NULL when the
 * sandbox has no repository.  One request to the sandbox.
 */
SBX_WUR int cli_repo_branch_status(struct cJSON **out, struct sbx_sandbox *sb,
				   const char *repo, const char *session);

/* ---- repo_up.c ----------------------------------------------------------- */

struct cli_up_opts;
struct sbx_provider;

/* `o` with the configuration's "ref", "carry_changes", "no_repo" and
 * "depth" filled in where the caller left them unset. */
void cli_up_repo_opts(struct cli_up_opts *eff, const struct cli_up_opts *o,
		      const struct cJSON *cfg);

/*
 * Before the sandbox is created: the seed for a sandbox of `provider`
 * (NULL: none -- the local provider, --no-repo, no repository around the
 * working directory).  *implicit_out: the repository was found around
 * the working directory (problems with it are notes, not errors).
 */
SBX_WUR int cli_up_seed_prepare(struct cli_seed **out, bool *implicit_out,
				const struct cli_up_opts *o,
				const char *provider);

/*
 * After the sandbox was created: seed it and set s->repo.  On failure
 * the new sandbox is terminated (forced) and the error says what failed.
 */
SBX_WUR int cli_up_seed(struct cli_seed *sd, bool implicit,
			struct sbx_provider *p, struct sbx_session *s);

/* ---- cmd_pull.c ---------------------------------------------------------- */

/* A session whose sandbox lives elsewhere and was given a repository. */
bool cli_session_has_remote_repo(const struct sbx_session *s);

/*
 * Open `s`'s sandbox and pull into `repo` (cli_repo_pull()); unless
 * `quiet`, one line on stderr says what happened.
 */
SBX_WUR int cli_session_pull(const struct sbx_session *s, const char *repo,
			     struct cli_pull_result *out, bool quiet);

/*
 * Add "branch": {"name","head","local","pulled"} to the status object
 * `st` of `s` (one request to a sandbox elsewhere; nothing when the
 * session has no repository or the sandbox cannot be asked), and print
 * it as a line of `sbx status`.
 */
void cli_status_branch(struct cJSON *st, const struct sbx_session *s);
void cli_status_branch_print(const struct cJSON *st);

#endif
