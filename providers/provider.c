/* Provider registry and shared helpers; see sbx/provider.h. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/provider.h"
#include "backends.h"

typedef int (*provider_ctor)(struct sbx_provider **out,
			     const struct cJSON *config);

/*
 * Every provider sbx knows, in the order `sbx help` lists them.  A backend
 * left out of the build (meson -Dkubernetes=disabled, -Dmodal=disabled:
 * they need libyaml and protobuf-c) keeps its row with a NULL ctor and
 * the option that brings it back, so that asking for it says so instead
 * of "unknown provider".
 */
static const struct {
	const char *name;
	provider_ctor ctor;
	const char *needs; /* what a build without it lacks */
} registry[] = {
	{"local", plocal_provider_new, NULL},
	{"remote", premote_provider_new, NULL},
#if SBX_HAVE_KUBERNETES
	{"kubernetes", pkube_provider_new, NULL},
#else
	{"kubernetes", NULL, "-Dkubernetes=enabled and libyaml"},
#endif
#if SBX_HAVE_MODAL
	{"modal", pmodal_provider_new, NULL},
#else
	{"modal", NULL, "-Dmodal=enabled and protobuf-c"},
#endif
};

#define N_REGISTRY (sizeof(registry) / sizeof(registry[0]))

static const char *const names[] = {
	"local",
	"remote",
#if SBX_HAVE_KUBERNETES
	"kubernetes",
#endif
#if SBX_HAVE_MODAL
	"modal",
#endif
	NULL,
};

const char *const *sbx_provider_names(void)
{
	return names;
}

/* "local, remote, ..." of the compiled-in providers, into buf. */
static const char *built_list(char *buf, size_t size)
{
	size_t off = 0;

	buf[0] = '\0';
	for (size_t i = 0; names[i] && off < size; i++)
		off += (size_t)snprintf(buf + off, size - off, "%s%s",
					i ? ", " : "", names[i]);
	return buf;
}

int sbx_provider_new(struct sbx_provider **out, const char *name,
		     const struct cJSON *config)
{
	struct sbx_provider *p = NULL;
	char built[128];
	int rc;

	*out = NULL;
	for (size_t i = 0; i < N_REGISTRY; i++) {
		if (strcmp(registry[i].name, name) != 0)
			continue;
		if (!registry[i].ctor)
			return sbx_error_set(SBX_ERR_CONFIG, -ENOTSUP,
					     "provider '%s' is not built in "
					     "(this build has: %s); rebuild "
					     "sbx with %s", name,
					     built_list(built, sizeof(built)),
					     registry[i].needs);
		rc = registry[i].ctor(&p, config);
		if (rc < 0)
			return rc;
		rc = sbx_provider_ops_check(p->ops, name);
		if (rc < 0) {
			p->ops->free(p);
			return rc;
		}
		*out = p;
		return 0;
	}
	return sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
			     "unknown provider '%s' (this build has: %s); set "
			     "\"provider\" in the configuration or pass "
			     "--provider local", name,
			     built_list(built, sizeof(built)));
}

/* The refusal of both checks below: one message for both tables. */
static int version_check(unsigned got, unsigned want, const char *table,
			 const char *provider)
{
	if (got == want)
		return 0;
	return sbx_error_set(SBX_ERR_INTERNAL, -EPROTO,
			     "provider %s: %s ops version %u, expected %u "
			     "(built against another sbx/provider.h)",
			     provider, table, got, want);
}

int sbx_provider_ops_check(const struct sbx_provider_ops *ops,
			   const char *provider)
{
	return version_check(ops->version, SBX_PROVIDER_OPS_VERSION,
			     "provider", provider);
}

int sbx_sandbox_ops_check(const struct sbx_sandbox_ops *ops,
			  const char *provider)
{
	return version_check(ops->version, SBX_SANDBOX_OPS_VERSION, "sandbox",
			     provider);
}

int sbx_provider_open(struct sbx_sandbox **out, struct sbx_provider *p,
		      const char *session)
{
	struct sbx_sandbox *sb = NULL;
	const char *name = p->ops->name ? p->ops->name : "?";
	int rc;

	*out = NULL;
	if (!p->ops->open)
		return sbx_error_set(SBX_ERR_INTERNAL, -ENOSYS,
				     "provider %s cannot open sandboxes",
				     name);
	rc = p->ops->open(p, session, &sb);
	if (rc < 0)
		return rc;
	rc = sbx_sandbox_ops_check(sb->ops, name);
	if (rc < 0) {
		/*
		 * free() is the one entry of a refused table still called
		 * (sbx_provider_new() does the same): the handle must not
		 * leak in a long-lived daemon.
		 */
		sb->ops->free(sb);
		return rc;
	}
	*out = sb;
	return 0;
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

/* Attributes on the side (sbx/provider.h): a pointer, owned by the caller. */
static __thread struct sbx_side *tl_side;

void sbx_side_arm(struct sbx_side *s)
{
	tl_side = s;
}

struct sbx_side *sbx_side_get(void)
{
	return tl_side;
}

void sbx_sandbox_free(struct sbx_sandbox *sb)
{
	if (sb)
		sb->ops->free(sb);
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
