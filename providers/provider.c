/* Provider registry and shared helpers; see sbx/provider.h. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/provider.h"
#include "local/plocal_i.h"
#include "remote/premote_i.h"
#include "kubernetes/pkube.h"
#include "modal/pmodal.h"

typedef int (*provider_ctor)(struct sbx_provider **out,
			     const struct cJSON *config);

static const struct {
	const char *name;
	provider_ctor ctor;
} registry[] = {
	{"local", plocal_provider_new},
	{"remote", premote_provider_new},
	{"kubernetes", pkube_provider_new},
	{"modal", pmodal_provider_new},
};

static const char *const names[] = {"local", "remote", "kubernetes", "modal",
				    NULL};

const char *const *sbx_provider_names(void)
{
	return names;
}

int sbx_provider_new(struct sbx_provider **out, const char *name,
		     const struct cJSON *config)
{
	struct sbx_provider *p = NULL;
	int rc;

	*out = NULL;
	for (size_t i = 0; i < sizeof(registry) / sizeof(registry[0]); i++) {
		if (strcmp(registry[i].name, name) != 0)
			continue;
		rc = registry[i].ctor(&p, config);
		if (rc < 0)
			return rc;
		if (p->ops->version != SBX_PROVIDER_OPS_VERSION) {
			p->ops->free(p);
			return sbx_error_set(SBX_ERR_INTERNAL, -EPROTO,
					     "provider %s: ops version %u, "
					     "expected %u", name,
					     p->ops->version,
					     SBX_PROVIDER_OPS_VERSION);
		}
		*out = p;
		return 0;
	}
	return sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
			     "unknown provider '%s' (this build has: local, "
			     "remote, kubernetes, modal); set \"provider\" in the configuration or pass "
			     "--provider local", name);
}

void sbx_provider_free(struct sbx_provider *p)
{
	if (p)
		p->ops->free(p);
}

static __thread struct sbx_caller tl_caller;
static __thread bool tl_caller_set;

void sbx_caller_set(const struct sbx_caller *c)
{
	tl_caller_set = c != NULL;
	if (c)
		tl_caller = *c;
}

const struct sbx_caller *sbx_caller_get(void)
{
	return tl_caller_set ? &tl_caller : NULL;
}

void sbx_sandbox_free(struct sbx_sandbox *sb)
{
	if (sb)
		sb->ops->free(sb);
}

const char *sbx_state_name(enum sbx_state s)
{
	switch (s) {
	case SBX_STATE_CREATING:
		return "creating";
	case SBX_STATE_READY:
		return "ready";
	case SBX_STATE_STOPPED:
		return "stopped";
	case SBX_STATE_ERROR:
		return "error";
	}
	return "error";
}

void sbx_sandbox_info_fini(struct sbx_sandbox_info *info)
{
	if (!info)
		return;
	free(info->session);
	free(info->provider);
	free(info->sandbox_id);
	free(info->workdir);
	free(info->isolation);
	cJSON_Delete(info->extra);
	memset(info, 0, sizeof(*info));
}

void sbx_repo_state_fini(struct sbx_repo_state *st)
{
	if (!st)
		return;
	free(st->head);
	free(st->oid);
	for (size_t i = 0; i < st->nloose; i++)
		free(st->loose[i]);
	free(st->loose);
	for (size_t i = 0; i < st->npacks; i++) {
		free(st->packs[i].name);
		free(st->packs[i].keep);
	}
	free(st->packs);
	memset(st, 0, sizeof(*st));
}
