/*
 * sbx down: unmount, terminate the sandbox, forget the session.
 *
 * Order: unmount first, then terminate.  Unmounting flushes every dirty
 * page and open file to the sandbox, so the provider's "uncommitted work?"
 * check sees everything; terminating first could miss data still in the
 * kernel's cache.  When terminate refuses (-EBUSY: uncommitted changes) the
 * mount is restored, so a refused `down` changes nothing.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/state.h"
#include "sbx/status.h"
#include "cli_i.h"
#include "repo_i.h"

/* Remount after a refused terminate; reports both errors if that fails. */
static void restore_mount(struct sbx_session *s, int lock)
{
	struct sbx_error refused = *sbx_error_last();

	if (cli_daemon_start(s, lock) < 0 || sbx_state_save(s) < 0)
		fprintf(stderr, "sbx: could not mount session %s again (%s); "
				"run `sbx mount %s`\n", s->session,
			sbx_error_last()->msg, s->session);
	sbx_error_set(refused.klass, refused.code, "%s", refused.msg);
}

/*
 * Pull a sandbox elsewhere that was given a repository (repo_i.h).  After
 * the unmount, so what the mount still buffered (a commit made through
 * it) is in the sandbox; before terminate (which snapshots and deletes).
 * Anything but a clean pull refuses the `down` (-EBUSY), unless forced:
 * then it is a warning and the sandbox goes.
 */
static int pull_before_down(const struct sbx_session *s, unsigned flags)
{
	struct cli_pull_result res;
	int rc;

	if (!cli_session_has_remote_repo(s))
		return 0;
	rc = cli_session_pull(s, s->repo, &res, false);
	if (rc == 0)
		return 0;
	if (flags & SBX_TERMINATE_FORCE) {
		fprintf(stderr, "sbx: warning: removing the sandbox of %s "
				"without pulling (--force): %s\n",
			s->session, sbx_error_last()->msg);
		sbx_error_clear();
		return 0;
	}
	if (rc == -EBUSY)
		return sbx_error_prefix(rc, "session %s kept (`sbx down %s "
					"--force` removes it without pulling)",
					s->session, s->session);
	return sbx_error_set(SBX_ERR_STATE, -EBUSY,
			     "session %s kept: pulling its branch failed (%s); "
			     "retry `sbx down %s`, or pass --force to remove "
			     "the sandbox without pulling",
			     s->session, sbx_error_last()->msg, s->session);
}

/* Best-effort removal of what belonged only to the session. */
static void cleanup(const struct sbx_session *s)
{
	char *log = NULL;

	if (sbx_paths_session_file(&log, "logs", s->session, ".log") == 0)
		unlink(log);
	free(log);
	/* Only removes the directory if empty: never user files. */
	if (s->mountpoint)
		rmdir(s->mountpoint);
	sbx_error_clear();
}

int cli_session_down(const char *name, unsigned flags, bool keep)
{
	struct sbx_provider *p = NULL;
	struct sbx_session s;
	bool was_mounted;
	int rc, lock = -1;

	sbx_session_init(&s);
	rc = cli_session_lock_load(&s, &lock, name);
	if (rc < 0)
		goto out;
	was_mounted = sbx_status_mounted(&s);
	rc = cli_daemon_stop(&s, flags & SBX_TERMINATE_FORCE);
	if (rc < 0)
		goto out;
	if (keep) {
		s.state = SBX_STATE_STOPPED;
		rc = sbx_state_save(&s);
		goto out;
	}

	/* The agent's commits come home before the sandbox goes. */
	rc = pull_before_down(&s, flags);
	if (rc < 0) {
		if (was_mounted)
			restore_mount(&s, lock);
		goto out;
	}
	rc = cli_session_provider(&p, &s);
	if (rc == 0)
		rc = p->ops->terminate(p, s.session, flags);
	if (rc == -ENOENT && sbx_error_last()->klass != SBX_ERR_CONFIG) {
		/* Already gone at the provider: finish forgetting it. */
		sbx_error_clear();
		rc = 0;
	}
	if (rc < 0) {
		rc = sbx_error_prefix(rc, "session %s", s.session);
		if (rc == -EBUSY) {
			if (was_mounted)
				restore_mount(&s, lock);
			else if (sbx_state_save(&s) < 0)
				sbx_error_clear();
			goto out;
		}
		/* Keep the record so `down` can be retried. */
		{
			struct sbx_error e = *sbx_error_last();

			/* No "TerminateError" in the API: removing the
			 * sandbox's files failed, so FileError. */
			sbx_session_set_error(
				&s, sbx_status_error_type(
					    e.klass, SBX_STATUS_FILE_ERROR),
				e.msg);
			if (sbx_state_save(&s) < 0)
				sbx_warn("could not save session %s",
					 s.session);
			sbx_error_set(e.klass, e.code, "%s", e.msg);
		}
		goto out;
	}
	rc = sbx_state_remove(s.session);
	if (rc < 0)
		goto out;
	cleanup(&s);
out:
	sbx_provider_free(p);
	/* A session that is gone leaves no lock file (issue: leftovers). */
	sbx_state_unlock_forget(lock, name);
	sbx_session_fini(&s);
	return rc;
}

int cli_cmd_down(int argc, char **argv)
{
	static const struct option opts[] = {
		{"keep-sandbox", no_argument, NULL, 'k'},
		{"delete-branch", no_argument, NULL, 'd'},
		{"force", no_argument, NULL, 'f'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	bool keep = false;
	unsigned flags = 0;
	int opt, rc;

	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'k': keep = true; break;
		case 'd': flags |= SBX_TERMINATE_DELETE_BRANCH; break;
		case 'f': flags |= SBX_TERMINATE_FORCE; break;
		default: return cli_common_opt("down", opt);
		}
	}
	rc = cli_args_name("down", argc, argv, 1, 1,
			   "expected one session NAME");
	if (rc != CLI_EXIT_OK)
		return rc;
	if (keep && flags)
		return cli_usage("down", "--keep-sandbox cannot be combined "
					 "with --force or --delete-branch");

	rc = cli_session_down(argv[optind], flags, keep);
	if (rc == -EBUSY && !keep) {
		/* The provider's message says what holds the work. */
		bool hinted = strstr(sbx_error_last()->msg, "--force");
		int ret = cli_report(CLI_EXIT_REFUSED);

		if (!hinted)
			fprintf(stderr, "sbx: commit or snapshot the work, or "
					"run `sbx down %s --force` to discard "
					"it\n", argv[optind]);
		return ret;
	}
	if (rc < 0)
		return cli_report(CLI_EXIT_FAIL);
	return CLI_EXIT_OK;
}
