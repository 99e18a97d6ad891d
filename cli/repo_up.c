/*
 * The repository steps of `sbx up` for sandboxes elsewhere (remote,
 * kubernetes, modal): which repository, and seeding it into the new
 * sandbox (repo_seed.c).  The local provider makes its worktree itself.
 *
 * Which repository: --repo DIR (or the body's "repo"), else the one that
 * holds the working directory, as the local provider does; none with
 * --no-repo (or "no_repo": true in the configuration).  A repository
 * given explicitly must work: any problem fails `up`.  One only found
 * around the working directory is a convenience: when it cannot be used
 * (no commits yet, the sandbox's workdir is not empty), `up` says why on
 * stderr and goes on with the workdir as it is.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/state.h"
#include "sbx/xmalloc.h"
#include "cli_i.h"
#include "repo_i.h"

void cli_up_repo_opts(struct cli_up_opts *eff, const struct cli_up_opts *o,
		      const cJSON *cfg)
{
	const cJSON *d = cJSON_GetObjectItemCaseSensitive(cfg, "depth");

	*eff = *o;
	if (!eff->ref)
		eff->ref = sbx_json_str(cfg, "ref");
	eff->carry = o->carry || sbx_json_bool(cfg, "carry_changes", false);
	eff->no_repo = o->no_repo || sbx_json_bool(cfg, "no_repo", false);
	if (!eff->depth && cJSON_IsNumber(d) && d->valuedouble > 0 &&
	    d->valuedouble < 1e9)
		eff->depth = (int)d->valuedouble;
}

int cli_up_seed_prepare(struct cli_seed **out, bool *implicit_out,
			const struct cli_up_opts *o, const char *provider)
{
	struct cli_seed_opts so = { 0 };
	char *top = NULL;
	int rc;

	*out = NULL;
	*implicit_out = false;
	if (strcmp(provider, "local") == 0 || o->no_repo)
		return 0;
	if (!o->repo) {
		/* Only when the working directory is in a repository. */
		if (sbx_paths_git_toplevel(&top, NULL) < 0) {
			sbx_error_clear();
			return 0;
		}
		*implicit_out = true;
	}
	so.session = o->name;
	so.repo = o->repo ? o->repo : top;
	so.ref = o->ref;
	so.carry = o->carry;
	so.depth = o->depth;
	so.progress = o->progress;
	rc = cli_seed_prepare(out, &so);
	if (rc < 0 && *implicit_out) {
		fprintf(stderr, "sbx: not putting the repository %s into the "
				"sandbox: %s (pass --no-repo to start empty "
				"without this note)\n",
			top, sbx_error_last()->msg);
		sbx_error_clear();
		*implicit_out = false;
		rc = 0;
	}
	free(top);
	return rc;
}

int cli_up_seed(struct cli_seed *sd, bool implicit, struct sbx_provider *p,
		struct sbx_session *s)
{
	struct sbx_sandbox *sb = NULL;
	int rc;

	rc = sbx_provider_open(&sb, p, s->session);
	if (rc == 0)
		rc = cli_seed_send(sd, sb);
	sbx_sandbox_free(sb);
	if (rc == -ENOTEMPTY && implicit) {
		fprintf(stderr, "sbx: not putting the repository %s into the "
				"sandbox: %s (pass --repo to insist, "
				"--no-repo to start without this note)\n",
			cli_seed_repo(sd), sbx_error_last()->msg);
		sbx_error_clear();
		free(s->repo);
		s->repo = NULL;
		return 0;
	}
	if (rc < 0) {
		struct sbx_error e = *sbx_error_last();

		/* The sandbox holds nothing of value yet: remove it. */
		if (p->ops->terminate(p, s->session, SBX_TERMINATE_FORCE) < 0)
			fprintf(stderr, "sbx: could not remove the new sandbox "
					"%s again: %s\n",
				s->sandbox_id ? s->sandbox_id : "",
				sbx_error_last()->msg);
		sbx_error_restore(&e);
		return sbx_error_prefix(rc, "put the repository %s into the "
					"sandbox of session %s",
					cli_seed_repo(sd), s->session);
	}
	free(s->repo);
	s->repo = sbx_xstrdup(cli_seed_repo(sd));
	return 0;
}
