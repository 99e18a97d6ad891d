/*
 * The modal provider: one Modal sandbox per session (docs/providers.md,
 * "modal").
 *
 *   pmodal.c       provider ops: environment, app, image (the user's image
 *                  plus the agent bundle as context files), sandbox with
 *                  the agent as entrypoint on an encrypted port, task id,
 *                  tunnel; get/list/terminate/gc by tags; filesystem
 *                  snapshots through the command router; the data plane is
 *                  the remote provider's client over the tunnel (TLS)
 *   mgrpc.c        gRPC over libcurl HTTP/2
 *   modal_creds.c  credentials as Modal's SDKs find them
 *
 * Per-session state of its own: $SBX_HOME/modal/<session>.json pins the
 * sandbox id, app, environment and the agent token (mode 0600: Modal has
 * no way to read a sandbox's entrypoint back).
 */
#ifndef PMODAL_H
#define PMODAL_H

#include "sbx/error.h"

struct cJSON;
struct sbx_provider;

SBX_WUR int pmodal_provider_new(struct sbx_provider **out,
				const struct cJSON *config);

#endif
