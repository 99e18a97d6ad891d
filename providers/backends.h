/*
 * The constructors of sbx's provider backends, for the registry
 * (providers/provider.c) and nothing else: each backend's internals stay
 * in its own directory behind a private *_i.h header, so the registry
 * needs no private header of any backend.
 *
 * Each constructor validates the backend's configuration section
 * (`config`, may be NULL: the defaults) and returns 0 with *out (freed
 * through its ops' free()), or -EINVAL (SBX_ERR_CONFIG) with a message
 * naming the key.  A backend left out of the build (meson -Dkubernetes=,
 * -Dmodal=) has no definition: the registry must not name it then.
 *
 *   local       providers/local/       a git worktree on this machine
 *   remote      providers/remote/      any running sbx-agent (sbx/remote.h)
 *   kubernetes  providers/kubernetes/  one pod per session
 *   modal       providers/modal/       one Modal sandbox per session
 */
#ifndef SBX_PROVIDERS_BACKENDS_H
#define SBX_PROVIDERS_BACKENDS_H

#include <stdlib.h>

#include <cjson/cJSON.h>

#include "sbx/error.h"
#include "sbx/provider.h"
#include "sbx/remote.h" /* premote_provider_new() */
#include "sbx/xmalloc.h"

SBX_WUR int plocal_provider_new(struct sbx_provider **out,
				const struct cJSON *config);
SBX_WUR int pkube_provider_new(struct sbx_provider **out,
			       const struct cJSON *config);
SBX_WUR int pmodal_provider_new(struct sbx_provider **out,
				const struct cJSON *config);

/* ---- what every backend's construction shares ---------------------------- */

/*
 * The control-plane entries of a backend's ops table, for a backend that
 * names them <prefix>_create, _get, _list, _terminate, _snapshot,
 * _snapshots, _restore and _open (all of them: none is left NULL by
 * mistake).  The table adds .free:
 *
 *	static const struct sbx_provider_ops pkube_ops = {
 *		PBACKEND_OPS(pkube, "kubernetes"),
 *		.free = pbackend_free,
 *	};
 */
#define PBACKEND_OPS(prefix, pname) \
	.version = SBX_PROVIDER_OPS_VERSION, .name = (pname), \
	.create = prefix##_create, .get = prefix##_get, \
	.list = prefix##_list, .terminate = prefix##_terminate, \
	.snapshot = prefix##_snapshot, .snapshots = prefix##_snapshots, \
	.restore = prefix##_restore, .open = prefix##_open

/*
 * A zeroed backend object of `size` bytes (its struct sbx_provider
 * first) with `ops` and its own copy of `config` (an empty object when
 * NULL).  Cannot fail (out of memory aborts).
 */
static inline void *pbackend_new(size_t size,
				 const struct sbx_provider_ops *ops,
				 const cJSON *config)
{
	struct sbx_provider *p = sbx_xcalloc(1, size);

	p->ops = ops;
	p->config = config ? cJSON_Duplicate(config, 1) : cJSON_CreateObject();
	if (!p->config)
		abort(); /* out of memory, as sbx_xmalloc */
	return p;
}

/* The free() of a backend that owns nothing but pbackend_new()'s. */
static inline void pbackend_free(struct sbx_provider *p)
{
	if (!p)
		return;
	cJSON_Delete(p->config);
	free(p);
}

/*
 * The end of a constructor: `rc` is its configuration check.  0 hands `p`
 * over in *out; an error frees it with its ops' free() and is returned.
 */
static inline int pbackend_done(struct sbx_provider **out,
				struct sbx_provider *p, int rc)
{
	*out = NULL;
	if (rc < 0) {
		p->ops->free(p);
		return rc;
	}
	*out = p;
	return 0;
}

#endif
