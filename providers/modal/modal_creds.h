/*
 * Modal credentials, found the way Modal's SDKs find them.
 *
 * Sources, highest first:
 *   1. environment: MODAL_TOKEN_ID, MODAL_TOKEN_SECRET, MODAL_ENVIRONMENT,
 *      MODAL_SERVER_URL (each overrides its own field; empty means unset);
 *   2. the config file: $MODAL_CONFIG_PATH, else ~/.modal.toml (a missing
 *      file is fine), one TOML table per profile with token_id,
 *      token_secret, environment, server_url and active = true.  The
 *      profile is $MODAL_PROFILE (which must exist), else the table with
 *      active = true, else the only table, else a table named "default".
 *   3. server_url defaults to MODAL_DEFAULT_SERVER_URL.
 * A config file that exists but cannot be read or parsed is an error even
 * when the environment has the tokens (as in Modal's Python SDK), so that
 * a mistake in it does not go unnoticed.
 *
 * Secrets are never put in error messages; sbx_modal_creds_fini() wipes
 * them from memory.
 */
#ifndef SBX_MODAL_CREDS_H
#define SBX_MODAL_CREDS_H

#include "sbx/error.h"

#define MODAL_DEFAULT_SERVER_URL "https://api.modal.com:443"

struct sbx_modal_creds {
	char *token_id;     /* never NULL after a successful load */
	char *token_secret; /* never NULL after a successful load */
	char *environment;  /* NULL: the workspace's default environment */
	char *server_url;   /* never NULL after a successful load */
	char *profile;      /* profile used from the file; NULL: none */
	/* Where the token came from, for messages: "environment", or
	 * "<file> (profile \"<name>\")". */
	char *source;
};

/*
 * Load credentials into *out (zeroed first; free with
 * sbx_modal_creds_fini(), also after a failure).
 * Returns 0, or:
 *   -EACCES  no token (SBX_ERR_CONFIG, saying to run `modal token new` or
 *            set MODAL_TOKEN_ID/MODAL_TOKEN_SECRET);
 *   -EINVAL  a bad config file (SBX_ERR_CONFIG: file and line), a key of
 *            the wrong type, or an unknown MODAL_PROFILE;
 *   another negative errno when the config file cannot be read (SBX_ERR_OS).
 * Reads the environment: not to be called while another thread changes it.
 */
SBX_WUR int sbx_modal_creds_load(struct sbx_modal_creds *out);

/* Wipe and free (NULL is fine); *c is zeroed. */
void sbx_modal_creds_fini(struct sbx_modal_creds *c);

#endif
