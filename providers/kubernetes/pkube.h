/*
 * The kubernetes provider: one pod per session (docs/providers.md,
 * "kubernetes").
 *
 *   pkube.c        provider ops: pod manifest, create and wait for
 *                  readiness (watch API), get/list/terminate/gc, snapshots
 *                  as tar streams through the agent, and the data plane
 *                  (the remote provider's client through the API server's
 *                  pod proxy)
 *   kubeconfig.c   credentials as kubectl finds them
 *
 * Per-session state of its own: $SBX_HOME/kubernetes/<session>.json pins
 * the context, namespace and pod chosen at creation, so later commands
 * reach the same pod whatever the current context is then.  Without it
 * (lost, or `sbx gc` after the session record went) the pod is found by
 * its labels.  The agent's token lives in the pod spec (env), readable by
 * whoever may read pods -- and only usable through pods/proxy, which is
 * the access that matters.
 *
 * Errors: 0 / negative errno with sbx_error_last(); API Status objects are
 * turned into messages naming the object and what to do.
 */
#ifndef PKUBE_H
#define PKUBE_H

#include "sbx/error.h"

struct cJSON;
struct sbx_provider;

SBX_WUR int pkube_provider_new(struct sbx_provider **out,
			       const struct cJSON *config);

#endif
