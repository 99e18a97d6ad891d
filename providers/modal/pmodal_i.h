/*
 * The modal provider: one Modal sandbox per session (docs/providers.md,
 * "modal").
 *
 *   mgrpc.c        gRPC over libcurl HTTP/2 (mgrpc.h)
 *   modal_creds.c  credentials as Modal's SDKs find them (modal_creds.h)
 *
 * Per-session state of its own: $SBX_HOME/modal/<session>.json pins the
 * sandbox id, app, environment and the agent token (mode 0600: Modal has
 * no way to read a sandbox's entrypoint back).
 *
 * Internals:
 *
 *   pmodal.c          configuration, the pin, the provider ops: create,
 *                     get, list, terminate, snapshots as images, restore,
 *                     open (the remote provider's client over the tunnel,
 *                     sbx/remote.h), construction
 *   pmodal_api.c      the API channel (mgrpc.c with Modal's headers), the
 *                     app and the image (the user's image plus the agent
 *                     bundle as context files)
 *   pmodal_sandbox.c  one sandbox: its definition (the agent as
 *                     entrypoint), start, task and tunnel, waiting for the
 *                     agent, end, filesystem snapshot
 *
 * Nothing here is shared between threads: every operation opens its own
 * channel (struct mchan) and closes it.
 *
 * Errors: 0 / negative errno with sbx_error_last().  Modal's gRPC statuses
 * are mapped by mgrpc.c (NOT_FOUND → -ENOENT, ...).
 */
#ifndef PMODAL_I_H
#define PMODAL_I_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "sbx/error.h"
#include "sbx/provider.h"
#include "sbx/remote.h"

#include "mgrpc.h"
#include "modal_api.pb-c.h"
#include "modal_creds.h"

#define RPC(name) "/modal.client.ModalClient/" name
#define TOKEN_ENV "SBX_AGENT_TOKEN"
#define AGENT_DIR "/opt/sbx-agent"
#define TAG_MANAGED "sbx"
#define TAG_SESSION "sbx-session"
#define TAG_HOME "sbx-home"
#define POLL_S 10.0f
/* The configuration section, pin directory and snapshot store name. */
#define SECTION "modal"

typedef Modal__Client__GenericResult GResult;

/* Free an unpacked message; accepts NULL. */
#define FREE_MSG(p) \
	do { \
		if (p) \
			protobuf_c_message_free_unpacked( \
				(ProtobufCMessage *)(p), NULL); \
	} while (0)

/* ---- configuration (pmodal.c) --------------------------------------------- */

/* The "modal" section, validated (strings borrowed from the JSON). */
struct mcfg {
	const char *image, *app, *environment, *workdir, *agent_bundle,
		*ca_file;
	long timeout_s, idle_timeout_s, port, ready_timeout_s, request_s;
	long memory_mb;
	double cpu;
	const cJSON *env; /* NAME -> value for the sandbox (validated) */
};

/* Validate `sec` into *c: -EINVAL (SBX_ERR_CONFIG) naming the key. */
SBX_WUR int pmodal_cfg_parse(struct mcfg *c, const cJSON *sec);

/* $SBX_HOME/modal/<session>.json: sandbox id, app, environment, token. */
struct pin {
	char *sandbox_id, *app_id, *env, *token;
};

/* Release the strings (the token wiped first). */
void pmodal_pin_fini(struct pin *p);

/*
 * What `sbx status` shows of a sandbox: READY, or ERROR with the reason
 * when `finished` (its result) is given; `gone`: it no longer exists.
 * Pure.
 */
void pmodal_fill_info(struct sbx_sandbox_info *out, const char *session,
		      const struct mcfg *c, const char *sandbox_id,
		      const GResult *finished, const char *env, bool gone);

/* ---- the API channel (pmodal_api.c) ----------------------------------------- */

struct mchan {
	struct sbx_modal_creds creds;
	struct mgrpc *c;
	char *env;    /* environment name ("" = the default one) */
	long deadline_ms;
};

/*
 * Open a channel with the credentials of modal_creds.c, in environment
 * `env` (NULL: the configured one, else the credentials', else the
 * default).  pmodal_chan_close() accepts a closed channel.
 */
SBX_WUR int pmodal_chan_open(struct mchan *m, const struct mcfg *c,
			     const char *env);
void pmodal_chan_close(struct mchan *m);

/*
 * One unary call; `retry` for calls Modal de-duplicates or that are reads.
 * deadline_ms 0: the configured request timeout.  *out (an unpacked `d`)
 * belongs to the caller (FREE_MSG).  Errors are prefixed with where the
 * credentials came from.
 */
SBX_WUR int pmodal_call(struct mchan *m, const char *method, const void *req,
			const ProtobufCMessageDescriptor *d, void *out,
			bool retry, long deadline_ms);

/* The name of a GenericResult status ("success", "timeout", ...).  Pure. */
const char *pmodal_result_name(const GResult *r);

/* The app (created if missing); *app_id malloc'd. */
SBX_WUR int pmodal_get_app(struct mchan *m, const struct mcfg *c,
			   char **app_id);
/* Build (or find) the image of the configuration; *image_id malloc'd. */
SBX_WUR int pmodal_build_image(struct mchan *m, const struct mcfg *c,
			       const char *app_id, char **image_id);

/* ---- one sandbox (pmodal_sandbox.c) ----------------------------------------- */

/*
 * The sandbox's entrypoint: env(1) with the configured "env" and the
 * token (last), then the bundle's loader running the agent.  A
 * NULL-terminated, malloc'd list of malloc'd strings: free it with
 * pmodal_args_free() (which wipes the token).  Pure.
 */
char **pmodal_entrypoint_args(const struct mcfg *c, const char *token,
			      size_t *n_out);
void pmodal_args_free(char **args);

/*
 * The URL of the tunnel to container port `port` in a SandboxGetTunnels
 * answer ("https://host:port", malloc'd), or NULL.  Pure.
 */
char *pmodal_tunnel_url(const Modal__Client__SandboxGetTunnelsResponse *r,
			long port);

/* The sandbox's result when it has finished (caller frees), else NULL. */
SBX_WUR int pmodal_sandbox_result(struct mchan *m, const char *sandbox_id,
				  float wait_s, GResult **out);
/* Wait for the task, then the tunnel of our port; *url malloc'd. */
SBX_WUR int pmodal_wait_tunnel(struct mchan *m, const struct mcfg *c,
			       const char *sandbox_id, time_t deadline,
			       char **url, char **task_id);
/* The agent's configuration at `url` (TLS; the tunnel terminates it). */
void pmodal_agent_cfg(struct premote_config *pc, const struct mcfg *c,
		      const char *url, const char *token);
/*
 * Start a sandbox from image_id and wait until its agent answers.  Fills
 * the pin (sandbox id, token).  On failure the sandbox is terminated.
 */
SBX_WUR int pmodal_start_sandbox(struct mchan *m, const struct mcfg *c,
				 const char *session, const char *app_id,
				 const char *image_id, struct pin *pin);
/* Terminate, keeping the error of the caller (a failure is warned of). */
void pmodal_terminate_quietly(struct mchan *m, const char *sandbox_id);
/* Terminate and wait until it has ended; 0 when it no longer exists. */
int pmodal_terminate_and_wait(struct mchan *m,
				      const char *sandbox_id);
/* The filesystem snapshot of a running sandbox: an image id (malloc'd). */
SBX_WUR int pmodal_snapshot_image(struct mchan *m, const struct mcfg *c,
				  const char *sandbox_id, char **image_id);

#endif
