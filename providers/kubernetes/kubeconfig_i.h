/*
 * Private to the kubeconfig loader (kubeconfig.c, kubeconfig_yaml.c,
 * kubeconfig_exec.c); the contract is kubeconfig.h.
 *
 *   kubeconfig.c       small helpers, one context out of the loaded files
 *                      (cluster, user, namespace), in-cluster, the public
 *                      load/free/getters and credentials;
 *   kubeconfig_yaml.c  which files (discovery, kubectl's merge rule), their
 *                      YAML, and the PEM and token files they name;
 *   kubeconfig_exec.c  exec credential plugins.
 *
 * Errors as in kubeconfig.h: 0 or a negative errno with detail in
 * sbx_error_last().  Nothing here locks; the callers say when k->lock is
 * held.
 */
#ifndef SBX_KUBECONFIG_I_H
#define SBX_KUBECONFIG_I_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include <yaml.h>

#include "kubeconfig.h"

#define FILE_CAP (16u << 20)     /* a kubeconfig */
#define PEM_CAP (4u << 20)       /* a CA bundle or a client certificate */
#define TOKEN_CAP (1u << 20)     /* a token file */
#define EXEC_OUT_CAP (1u << 20)  /* a plugin's stdout */
#define EXEC_ERR_CAP (64u << 10) /* a plugin's stderr, kept for messages */
#define EXEC_TIMEOUT_MS 30000
#define TOKEN_REREAD_S 60
#define EXPIRY_SLACK_S 10
#define SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"
#define API_V1 "client.authentication.k8s.io/v1"
#define API_V1BETA1 "client.authentication.k8s.io/v1beta1"

struct kexec {
	char **argv;       /* argv[0]: the command, resolved if it has a '/' */
	char **env;        /* "NAME=VALUE" from exec.env, NULL-terminated */
	char *api_version;
	char *hint;        /* installHint or NULL */
	char *where;       /* "<file>: user '<name>'" for messages */
};

struct sbx_kube_config {
	char *server;
	char *ns;
	char *context;
	char *source;
	/*
	 * The static credentials: CA, TLS options, client certificate and
	 * key, and the token of the kubeconfig (bearer).
	 */
	struct sbx_kube_creds st;
	char *token_file;  /* tokenFile or the in-cluster token, absolute */
	char *token_where; /* for messages */
	struct kexec *exec;

	pthread_mutex_t lock; /* protects everything below */
	char *file_token;     /* last good read of token_file */
	struct timespec file_at;
	bool ex_have;
	/* The exec plugin's last answer: bearer, cert/key, expires. */
	struct sbx_kube_creds ex;
};

struct kfile {
	char *path;  /* absolute */
	char *shown; /* for messages */
	char *dir;   /* for relative names in it */
	yaml_document_t doc;
	yaml_node_t *root; /* NULL: empty file */
	bool loaded;
};

struct kload {
	struct kfile *f;
	size_t n;
	char *tried; /* what was looked for, for "nothing found" */
};

/* ---- helpers (kubeconfig.c) --------------------------------------------- */

/* Wipe `len` bytes of `p` and free it (NULL is fine). */
void pk8s_wipe_free(char *p, size_t len);
/* A malloc'd NUL-terminated copy of `n` bytes. */
char *pk8s_memdup0(const char *p, size_t n);
/* A path for messages: the home directory shown as "~" (malloc'd). */
char *pk8s_shown_path(const char *path);
/* strerror(-rc), "the file is too large" for -EFBIG. */
const char *pk8s_why(int rc);
/* CLOCK_MONOTONIC in milliseconds. */
long long pk8s_mono_ms(void);
/* Tokens travel in an HTTP header: no control characters, no spaces. */
bool pk8s_token_ok(const char *t);
/* Does `p` (len bytes) contain `needle`? */
bool pk8s_has(const char *p, size_t len, const char *needle);

/* ---- files, YAML, PEM and tokens (kubeconfig_yaml.c) -------------------- */

/* The files to load for `o` (an explicit one, $KUBECONFIG, the default);
 * none found is not an error (L->n == 0, L->tried says what was tried). */
int pk8s_collect_files(struct kload *L, const struct sbx_kube_load_opts *o);
void pk8s_kload_fini(struct kload *L);
/* Read and parse one file into f->doc / f->root. */
int pk8s_kfile_parse(struct kfile *f);
yaml_node_t *pk8s_ynode(struct kfile *f, int i);
/* Typed values of `key` in mapping `map`; absent or null: NULL/false. */
int pk8s_yget_str(const char **out, struct kfile *f, const char *where,
		  const yaml_node_t *map, const char *key);
int pk8s_yget_bool(bool *out, struct kfile *f, const char *where,
		   const yaml_node_t *map, const char *key);
int pk8s_yget_kind(yaml_node_t **out, struct kfile *f, const char *where,
		   const yaml_node_t *map, const char *key,
		   yaml_node_type_t type);
/*
 * Entry `name` of list `list` ("clusters") with body key `inner`
 * ("cluster"); the first file defining the name wins.  1 found, 0 not,
 * or an error.
 */
int pk8s_find_named(struct kload *L, const char *list, const char *inner,
		    const char *name, yaml_node_t **body_out,
		    struct kfile **f_out);
/* "a, b, c": the names in `list` over all files (malloc'd). */
char *pk8s_list_names(struct kload *L, const char *list);
/* `name` relative to the directory of `f` (malloc'd). */
char *pk8s_resolve(const struct kfile *f, const char *name);
/* A PEM file (must contain `marker`) / a "-data" value (base64 of PEM). */
int pk8s_read_pem_file(char **out, size_t *len_out, const struct kfile *f,
		       const char *where, const char *key, const char *name,
		       const char *marker);
int pk8s_decode_pem_data(char **out, size_t *len_out, const char *where,
			 const char *key, const char *b64,
			 const char *marker);
/* A token file: trimmed, non-empty, header-safe (malloc'd). */
int pk8s_token_file_read(char **out, const char *path, const char *where);

/* ---- exec credential plugins (kubeconfig_exec.c) ------------------------ */

/* Run k->exec and refresh k->ex.  Called with k->lock held. */
int pk8s_exec_run(struct sbx_kube_config *k);

#endif
