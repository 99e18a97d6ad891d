/*
 * The local provider: its ops table, construction and open().
 *
 * The control plane lives in plocal_git.c, the data plane in plocal_fs.c.
 * The provider itself holds only its configuration section and the
 * directory under which worktrees live ($SBX_HOME/worktrees).
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/error.h"
#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/xmalloc.h"
#include "plocal_i.h"

/*
 * Open the data plane of an existing sandbox.  Only a READY sandbox can be
 * opened: a worktree whose git registration is broken would mount, but
 * exec and git inside it would fail in confusing ways, so the error from
 * get() is reported instead.
 */
static int plocal_open(struct sbx_provider *p, const char *session,
		       struct sbx_sandbox **out)
{
	struct plocal_provider *lp = (struct plocal_provider *)p;
	struct sbx_sandbox_info info;
	const cJSON *err;
	int rc;

	*out = NULL;
	if ((rc = plocal_get(p, session, &info)) < 0)
		return rc;
	if (info.state != SBX_STATE_READY) {
		err = cJSON_GetObjectItemCaseSensitive(info.extra, "error");
		rc = sbx_error_set(SBX_ERR_STATE, -EIO,
				   "sandbox %s cannot be opened: %s; remove it "
				   "with `sbx down %s --force`", session,
				   cJSON_IsString(err) ? err->valuestring
						       : "it is not ready",
				   session);
		goto out;
	}
	rc = plocal_sandbox_open(lp, session, info.workdir, out);
out:
	sbx_sandbox_info_fini(&info);
	return rc;
}

static void plocal_free(struct sbx_provider *p)
{
	struct plocal_provider *lp = (struct plocal_provider *)p;

	if (!lp)
		return;
	cJSON_Delete(lp->base.config);
	free(lp->worktrees);
	free(lp);
}

static const struct sbx_provider_ops plocal_ops = {
	PBACKEND_OPS(plocal, "local"),
	.free = plocal_free,
};

/*
 * Configuration keys (the "local" section): "isolation": "none" (default)
 * or "bwrap".  Anything else is refused here, so that a typo does not
 * silently run commands without the isolation the user asked for.
 */
int plocal_provider_new(struct sbx_provider **out, const struct cJSON *config)
{
	struct plocal_provider *lp;
	const cJSON *iso;
	char *dir = NULL;
	int rc;

	*out = NULL;
	iso = cJSON_GetObjectItemCaseSensitive(config, "isolation");
	if (iso && (!cJSON_IsString(iso) ||
		    (strcmp(iso->valuestring, "none") &&
		     strcmp(iso->valuestring, "bwrap"))))
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "local provider: \"isolation\" must be "
				     "\"none\" or \"bwrap\"");
	if ((rc = sbx_paths_subdir(&dir, "worktrees")) < 0)
		return sbx_error_prefix(rc, "local provider");
	lp = pbackend_new(sizeof(*lp), &plocal_ops, config);
	lp->worktrees = dir;
	*out = &lp->base;
	return 0;
}
