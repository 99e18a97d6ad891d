/*
 * sbx pull: bring the sandbox's commits on sbx/NAME into the session's
 * repository (repo_pull.c; docs/cli.md).  Also the step `sbx down` takes
 * before it removes a sandbox, and the "branch" of `sbx status`.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/state.h"
#include "sbx/xmalloc.h"
#include "cli_i.h"
#include "repo_i.h"

bool cli_session_has_remote_repo(const struct sbx_session *s)
{
	return s->repo && s->provider && strcmp(s->provider, "local") != 0;
}

/* One line on stderr saying what happened. */
static void report(const struct cli_pull_result *r, const char *name,
		   const char *repo)
{
	char b[13], h[13];

	snprintf(b, sizeof(b), "%.12s", r->before);
	snprintf(h, sizeof(h), "%.12s", r->head);
	switch (r->outcome) {
	case CLI_PULL_NO_REPO:
		fprintf(stderr, "sbx: the sandbox of %s has no git "
				"repository; nothing to pull\n", name);
		break;
	case CLI_PULL_NO_BRANCH:
		fprintf(stderr, "sbx: the sandbox of %s has no branch "
				CLI_BRANCH_PREFIX "%s; nothing to pull\n",
			name, name);
		break;
	case CLI_PULL_UP_TO_DATE:
		fprintf(stderr, "sbx: " CLI_BRANCH_PREFIX "%s in %s is up to "
				"date (%s)\n", name, repo, h);
		break;
	case CLI_PULL_AHEAD:
		fprintf(stderr, "sbx: " CLI_BRANCH_PREFIX "%s in %s (%s) "
				"already contains the sandbox's %s\n",
			name, repo, b, h);
		break;
	case CLI_PULL_CREATED:
		fprintf(stderr, "sbx: pulled " CLI_BRANCH_PREFIX "%s into %s: "
				"new branch at %s (%llu objects, %.1f KiB)\n",
			name, repo, h, (unsigned long long)r->objects,
			(double)r->bytes / 1024.0);
		break;
	case CLI_PULL_FAST_FORWARD:
		fprintf(stderr, "sbx: pulled " CLI_BRANCH_PREFIX "%s into %s: "
				"%s..%s (%llu objects, %.1f KiB)\n",
			name, repo, b, h, (unsigned long long)r->objects,
			(double)r->bytes / 1024.0);
		break;
	}
	/* The agent may have worked on another branch. */
	if (r->sandbox_head[0] && r->outcome != CLI_PULL_NO_REPO) {
		char *want = sbx_xasprintf("ref: refs/heads/" CLI_BRANCH_PREFIX
					   "%s", name);

		if (strcmp(r->sandbox_head, want) != 0)
			fprintf(stderr, "sbx: note: the sandbox's HEAD is "
					"\"%s\", not " CLI_BRANCH_PREFIX "%s; "
					"only " CLI_BRANCH_PREFIX "%s is "
					"pulled\n",
				r->sandbox_head, name, name);
		free(want);
	}
}

int cli_session_pull(const struct sbx_session *s, const char *repo,
		     struct cli_pull_result *out, bool quiet)
{
	struct sbx_provider *p = NULL;
	struct sbx_sandbox *sb = NULL;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = cli_session_provider(&p, s);
	if (rc == 0)
		rc = sbx_provider_open(&sb, p, s->session);
	if (rc < 0) {
		rc = sbx_error_prefix(rc, "open the sandbox of %s",
				      s->session);
		goto out;
	}
	rc = cli_repo_pull(out, sb, repo, s->session);
	if (rc < 0)
		goto out;
	if (!quiet)
		report(out, s->session, repo);
out:
	sbx_sandbox_free(sb);
	sbx_provider_free(p);
	return rc;
}

void cli_status_branch(cJSON *st, const struct sbx_session *s)
{
	struct sbx_provider *p = NULL;
	struct sbx_sandbox *sb = NULL;
	cJSON *b = NULL;

	/* A local sandbox is a worktree of the repository: nothing to say. */
	if (!cli_session_has_remote_repo(s))
		return;
	if (s->state == SBX_STATE_READY &&
		   strcmp(sbx_json_str(st, "state") ? sbx_json_str(st, "state")
						    : "", "ready") == 0 &&
		   cli_session_provider(&p, s) == 0 &&
		   sbx_provider_open(&sb, p, s->session) == 0 &&
		   cli_repo_branch_status(&b, sb, s->repo, s->session) < 0) {
		b = NULL;
	}
	sbx_error_clear();
	sbx_sandbox_free(sb);
	sbx_provider_free(p);
	if (b)
		sbx_json_set_take(st, "branch", b);
}

void cli_status_branch_print(const cJSON *st)
{
	const cJSON *b = cJSON_GetObjectItemCaseSensitive(st, "branch");
	const char *head = sbx_json_str(b, "head");

	if (!b)
		return;
	printf("%-11s %s at %.12s, %s\n", "branch",
	       sbx_json_str(b, "name") ? sbx_json_str(b, "name") : "-",
	       head ? head : "(none)",
	       sbx_json_bool(b, "pulled", false) ? "pulled"
						 : "not pulled (`sbx pull`)");
}

int cli_cmd_pull(int argc, char **argv)
{
	static const struct option opts[] = {
		{"repo", required_argument, NULL, 'r'},
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	struct cli_pull_result res;
	struct sbx_session s;
	const char *repo_opt = NULL;
	char *repo = NULL;
	bool json = false;
	int opt, rc, lock = -1, ret = CLI_EXIT_FAIL;

	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'r': repo_opt = optarg; break;
		case 'j': json = true; break;
		default: return cli_common_opt("pull", opt);
		}
	}
	rc = cli_args_name("pull", argc, argv, 1, 1,
			   "expected one session NAME");
	if (rc != CLI_EXIT_OK)
		return rc;
	if (repo_opt && !*repo_opt)
		return cli_usage("pull", "--repo needs a directory");

	rc = cli_session_lock_load(&s, &lock, argv[optind]);
	if (rc < 0)
		return cli_report(CLI_EXIT_FAIL);
	if (s.provider && strcmp(s.provider, "local") == 0) {
		fprintf(stderr, "sbx: session %s is a worktree of %s: its "
				"commits are on " CLI_BRANCH_PREFIX "%s "
				"there already\n",
			s.session, s.repo ? s.repo : "its repository",
			s.session);
		ret = CLI_EXIT_OK;
		goto out;
	}
	if (repo_opt) {
		rc = sbx_path_expand_user(&repo, repo_opt);
		if (rc < 0) {
			ret = cli_report(CLI_EXIT_USAGE);
			goto out;
		}
	} else if (s.repo) {
		repo = sbx_xstrdup(s.repo);
	} else {
		sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
			      "session %s has no repository (it was created "
			      "without one, or with --no-repo); pass --repo "
			      "DIR",
			      s.session);
		ret = cli_report(CLI_EXIT_CONFIG);
		goto out;
	}
	rc = cli_session_pull(&s, repo, &res, json);
	if (rc < 0) {
		ret = cli_report(rc == -EBUSY ? CLI_EXIT_REFUSED
					      : CLI_EXIT_FAIL);
		goto out;
	}
	if (json) {
		cJSON *o = cJSON_CreateObject();

		sbx_json_set_str(o, "session", s.session);
		sbx_json_set_str(o, "repo", repo);
		{
			char *b = sbx_xasprintf(CLI_BRANCH_PREFIX "%s",
						s.session);

			sbx_json_set_str(o, "branch", b);
			free(b);
		}
		sbx_json_set_str(o, "outcome",
				 cli_pull_outcome_name(res.outcome));
		if (res.head[0])
			sbx_json_set_str(o, "head", res.head);
		else
			cJSON_AddNullToObject(o, "head");
		if (res.before[0])
			sbx_json_set_str(o, "before", res.before);
		else
			cJSON_AddNullToObject(o, "before");
		cJSON_AddNumberToObject(o, "objects", (double)res.objects);
		cJSON_AddNumberToObject(o, "bytes", (double)res.bytes);
		cJSON_AddNumberToObject(o, "requests", res.requests);
		cli_print_json(o);
		cJSON_Delete(o);
	}
	ret = CLI_EXIT_OK;
out:
	free(repo);
	sbx_state_unlock(lock);
	sbx_session_fini(&s);
	return ret;
}
