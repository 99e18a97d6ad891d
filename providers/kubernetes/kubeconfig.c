/*
 * Kubernetes credentials the way kubectl finds them; see kubeconfig.h.
 *
 * Loading keeps every kubeconfig file's YAML document alive while one
 * context is resolved: names are looked up file by file (the first file
 * defining a name wins, kubectl's merge rule), so no merged copy of the
 * whole configuration is ever built.  Everything the selected context
 * needs is copied into struct sbx_kube_config before the documents go.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <yaml.h>

#include "sbx/buf.h"
#include "sbx/json.h"
#include "sbx/paths.h"
#include "sbx/proto.h"
#include "sbx/xmalloc.h"

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
	char *ca_pem;
	size_t ca_len;
	bool insecure;
	char *tls_server_name;
	char *cert_pem;    /* static client certificate */
	size_t cert_len;
	char *key_pem;
	size_t key_len;
	char *token;       /* static token */
	char *token_file;  /* tokenFile or the in-cluster token, absolute */
	char *token_where; /* for messages */
	struct kexec *exec;

	pthread_mutex_t lock; /* protects everything below */
	char *file_token;     /* last good read of token_file */
	struct timespec file_at;
	bool ex_have;
	char *ex_token;
	char *ex_cert;
	size_t ex_cert_len;
	char *ex_key;
	size_t ex_key_len;
	time_t ex_expires;
};

/* ---- small helpers ------------------------------------------------------- */

static void wipe_free(char *p, size_t len)
{
	if (!p)
		return;
	explicit_bzero(p, len);
	free(p);
}

static void wipe_str(char *p)
{
	if (p)
		wipe_free(p, strlen(p));
}

static char *memdup0(const char *p, size_t n)
{
	char *r = sbx_xmalloc(n + 1);

	memcpy(r, p, n);
	r[n] = '\0';
	return r;
}

static void strv_free(char **v)
{
	if (!v)
		return;
	for (char **p = v; *p; p++)
		free(*p);
	free(v);
}

/* A path for messages: the home directory shown as "~". */
static char *shown_path(const char *path)
{
	const char *home = getenv("HOME");
	size_t n = home ? strlen(home) : 0;

	while (n > 1 && home[n - 1] == '/')
		n--;
	if (n > 1 && strncmp(path, home, n) == 0 && path[n] == '/')
		return sbx_xasprintf("~%s", path + n);
	return sbx_xstrdup(path);
}

static const char *why(int rc)
{
	return rc == -EFBIG ? "the file is too large" : strerror(-rc);
}

static long long mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Tokens travel in an HTTP header: no control characters, no spaces. */
static bool token_ok(const char *t)
{
	if (!*t)
		return false;
	for (const unsigned char *p = (const unsigned char *)t; *p; p++)
		if (*p <= 0x20 || *p == 0x7f)
			return false;
	return true;
}

/* Kubernetes namespace: an RFC 1123 label. */
static bool ns_ok(const char *s)
{
	size_t n = strlen(s);

	if (n < 1 || n > 63 || s[0] == '-' || s[n - 1] == '-')
		return false;
	for (size_t i = 0; i < n; i++)
		if (!(islower((unsigned char)s[i]) ||
		      isdigit((unsigned char)s[i]) || s[i] == '-'))
			return false;
	return true;
}

static bool has(const char *p, size_t len, const char *needle)
{
	return memmem(p, len, needle, strlen(needle)) != NULL;
}

/* ---- kubeconfig files and YAML ------------------------------------------- */

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

static void kload_fini(struct kload *L)
{
	for (size_t i = 0; i < L->n; i++) {
		if (L->f[i].loaded)
			yaml_document_delete(&L->f[i].doc);
		free(L->f[i].path);
		free(L->f[i].shown);
		free(L->f[i].dir);
	}
	free(L->f);
	free(L->tried);
}

static void kload_add(struct kload *L, char *abs_take)
{
	struct kfile *f;
	char *slash;

	for (size_t i = 0; i < L->n; i++) {
		if (strcmp(L->f[i].path, abs_take) == 0) {
			free(abs_take);
			return;
		}
	}
	L->f = sbx_xrealloc(L->f, (L->n + 1) * sizeof(*L->f));
	f = &L->f[L->n++];
	memset(f, 0, sizeof(*f));
	f->path = abs_take;
	f->shown = shown_path(abs_take);
	slash = strrchr(abs_take, '/');
	f->dir = slash == abs_take ? sbx_xstrdup("/")
				   : sbx_xstrndup(abs_take,
						  (size_t)(slash - abs_take));
}

/* A file in $KUBECONFIG or the default one: skipped when it is missing. */
static int kload_add_if_exists(struct kload *L, const char *path)
{
	struct stat st;
	char *abs = NULL;
	int rc;

	rc = sbx_path_absolute(path, &abs);
	if (rc < 0)
		return sbx_error_set(SBX_ERR_CONFIG, rc,
				     "kubeconfig path '%s' is not usable",
				     path);
	if (stat(abs, &st) < 0 && (errno == ENOENT || errno == ENOTDIR)) {
		free(abs);
		return 0;
	}
	kload_add(L, abs);
	return 0;
}

static int collect_files(struct kload *L, const struct sbx_kube_load_opts *o)
{
	const char *env = getenv("KUBECONFIG");
	char *home = NULL, *path = NULL, *abs = NULL;
	int rc;

	if (o->kubeconfig) {
		if (!*o->kubeconfig)
			return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					     "the kubeconfig path is empty");
		rc = sbx_path_absolute(o->kubeconfig, &abs);
		if (rc < 0)
			return rc;
		kload_add(L, abs);
		return 0;
	}
	if (env && *env) {
		char *copy = sbx_xstrdup(env), *p = copy;

		L->tried = sbx_xasprintf("none of the files in KUBECONFIG "
					 "(%s) exists", env);
		rc = 0;
		while (p && rc == 0) {
			char *colon = strchr(p, ':');

			if (colon)
				*colon++ = '\0';
			if (*p)
				rc = kload_add_if_exists(L, p);
			p = colon;
		}
		free(copy);
		return rc;
	}
	if (sbx_paths_user_home(&home) < 0) {
		sbx_error_clear();
		L->tried = sbx_xstrdup("KUBECONFIG is not set and there is "
				       "no home directory (HOME)");
		return 0;
	}
	path = sbx_xasprintf("%s/.kube/config", home);
	L->tried = sbx_xasprintf("KUBECONFIG is not set and ~/.kube/config "
				 "does not exist");
	rc = kload_add_if_exists(L, path);
	free(path);
	free(home);
	return rc;
}

static int yaml_error(const yaml_parser_t *p, const char *shown)
{
	const char *prob = p->problem ? p->problem : "unknown problem";

	if (p->error == YAML_MEMORY_ERROR)
		return sbx_error_set(SBX_ERR_INTERNAL, -ENOMEM,
				     "%s: out of memory parsing YAML", shown);
	if (p->error == YAML_READER_ERROR)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s: not valid YAML text at byte %zu: "
				     "%s", shown, p->problem_offset, prob);
	if (p->context)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s: YAML syntax error at line %zu, "
				     "column %zu: %s (%s at line %zu)",
				     shown, p->problem_mark.line + 1,
				     p->problem_mark.column + 1, prob,
				     p->context, p->context_mark.line + 1);
	return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
			     "%s: YAML syntax error at line %zu, column %zu: "
			     "%s", shown, p->problem_mark.line + 1,
			     p->problem_mark.column + 1, prob);
}

static bool ynull(const yaml_node_t *n);

static int kfile_parse(struct kfile *f)
{
	yaml_parser_t p;
	char *text = NULL;
	size_t len = 0;
	int rc;

	rc = sbx_file_read(f->path, FILE_CAP, &text, &len);
	if (rc < 0)
		return sbx_error_set(SBX_ERR_CONFIG, rc,
				     "cannot read kubeconfig %s: %s%s",
				     f->shown, why(rc),
				     rc == -ENOENT
					     ? " (check --kubeconfig)"
					     : "");
	if (!yaml_parser_initialize(&p)) {
		free(text);
		return sbx_error_set(SBX_ERR_INTERNAL, -ENOMEM,
				     "%s: cannot initialise the YAML parser",
				     f->shown);
	}
	yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
	if (!yaml_parser_load(&p, &f->doc)) {
		rc = yaml_error(&p, f->shown);
	} else {
		f->loaded = true;
		f->root = yaml_document_get_root_node(&f->doc);
		if (ynull(f->root))
			f->root = NULL;
		else if (f->root->type != YAML_MAPPING_NODE)
			rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					   "%s: not a kubeconfig (the top "
					   "level must be a mapping with "
					   "clusters, users and contexts)",
					   f->shown);
	}
	yaml_parser_delete(&p);
	free(text);
	return rc;
}

static yaml_node_t *ynode(struct kfile *f, int i)
{
	return yaml_document_get_node(&f->doc, i);
}

static bool yscalar_eq(const yaml_node_t *n, const char *s)
{
	size_t l = strlen(s);

	return n && n->type == YAML_SCALAR_NODE &&
	       n->data.scalar.length == l &&
	       memcmp(n->data.scalar.value, s, l) == 0;
}

/* A YAML null: absent, or a plain "", "~", "null". */
static bool ynull(const yaml_node_t *n)
{
	if (!n)
		return true;
	if (n->type != YAML_SCALAR_NODE ||
	    n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
		return false;
	return n->data.scalar.length == 0 || yscalar_eq(n, "~") ||
	       yscalar_eq(n, "null") || yscalar_eq(n, "Null") ||
	       yscalar_eq(n, "NULL");
}

static const char *ytype(const yaml_node_t *n)
{
	return n->type == YAML_MAPPING_NODE    ? "mapping"
	       : n->type == YAML_SEQUENCE_NODE ? "list"
					       : "scalar";
}

static yaml_node_t *ymap_get(struct kfile *f, const yaml_node_t *map,
			     const char *key)
{
	yaml_node_t *found = NULL;

	if (!map || map->type != YAML_MAPPING_NODE)
		return NULL;
	for (yaml_node_pair_t *pr = map->data.mapping.pairs.start;
	     pr < map->data.mapping.pairs.top; pr++) {
		if (yscalar_eq(ynode(f, pr->key), key)) {
			/* The last duplicate wins, as a map would keep it. */
			found = ynode(f, pr->value);
		}
	}
	return found;
}

/* A scalar as a C string; NULL when null or empty (unset in kubectl). */
static int yget_str(const char **out, struct kfile *f, const char *where,
		    const yaml_node_t *map, const char *key)
{
	yaml_node_t *v = ymap_get(f, map, key);

	*out = NULL;
	if (ynull(v))
		return 0;
	if (v->type != YAML_SCALAR_NODE)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s: '%s' must be a string, not a %s",
				     where, key, ytype(v));
	if (strlen((const char *)v->data.scalar.value) !=
	    v->data.scalar.length)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s: '%s' contains a NUL character",
				     where, key);
	if (v->data.scalar.length)
		*out = (const char *)v->data.scalar.value;
	return 0;
}

static int yget_bool(bool *out, struct kfile *f, const char *where,
		     const yaml_node_t *map, const char *key)
{
	static const char *const yes[] = { "true", "yes", "on", "y" };
	static const char *const no[] = { "false", "no", "off", "n" };
	const char *s;
	int rc;

	*out = false;
	rc = yget_str(&s, f, where, map, key);
	if (rc < 0 || !s)
		return rc;
	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*out = true;
			return 0;
		}
		if (strcasecmp(s, no[i]) == 0)
			return 0;
	}
	return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
			     "%s: '%s' must be true or false, not '%s'",
			     where, key, s);
}

static int yget_kind(yaml_node_t **out, struct kfile *f, const char *where,
		     const yaml_node_t *map, const char *key,
		     yaml_node_type_t type)
{
	yaml_node_t *v = ymap_get(f, map, key);

	*out = NULL;
	if (ynull(v))
		return 0;
	if (v->type != type)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s: '%s' must be a %s, not a %s", where,
				     key,
				     type == YAML_MAPPING_NODE ? "mapping"
							       : "list",
				     ytype(v));
	*out = v;
	return 0;
}

/*
 * Entry `name` of list `list` ("clusters") with body key `inner`
 * ("cluster").  The first file that defines the name wins; within a file
 * the last entry wins (kubectl turns each file's list into a map).
 * Returns 1 when found (*body_out may be NULL: an entry without a body),
 * 0 when not, or an error for a malformed list.
 */
static int find_named(struct kload *L, const char *list, const char *inner,
		      const char *name, yaml_node_t **body_out,
		      struct kfile **f_out)
{
	*body_out = NULL;
	*f_out = NULL;
	for (size_t i = 0; i < L->n; i++) {
		struct kfile *f = &L->f[i];
		yaml_node_t *seq, *hit = NULL;
		int rc;

		rc = yget_kind(&seq, f, f->shown, f->root, list,
			       YAML_SEQUENCE_NODE);
		if (rc < 0)
			return rc;
		if (!seq)
			continue;
		for (yaml_node_item_t *it = seq->data.sequence.items.start;
		     it < seq->data.sequence.items.top; it++) {
			yaml_node_t *e = ynode(f, *it);
			const char *n;

			if (!e || e->type != YAML_MAPPING_NODE)
				return sbx_error_set(
					SBX_ERR_CONFIG, -EINVAL,
					"%s: every entry of '%s' must be a "
					"mapping with 'name' and '%s'",
					f->shown, list, inner);
			rc = yget_str(&n, f, f->shown, e, "name");
			if (rc < 0)
				return rc;
			if (n && strcmp(n, name) == 0)
				hit = e;
		}
		if (hit) {
			char *where = sbx_xasprintf("%s: %s '%s'", f->shown,
						    inner, name);

			rc = yget_kind(body_out, f, where, hit, inner,
				       YAML_MAPPING_NODE);
			free(where);
			if (rc < 0)
				return rc;
			*f_out = f;
			return 1;
		}
	}
	return 0;
}

/* "a, b, c" of the names in `list` over all files, for messages. */
static char *list_names(struct kload *L, const char *list)
{
	struct sbx_buf b;
	const char **seen = NULL;
	size_t nseen = 0;
	bool cut = false;

	sbx_buf_init(&b, 240);
	for (size_t i = 0; i < L->n && !cut; i++) {
		struct kfile *f = &L->f[i];
		yaml_node_t *seq = ymap_get(f, f->root, list);

		if (!seq || seq->type != YAML_SEQUENCE_NODE)
			continue;
		for (yaml_node_item_t *it = seq->data.sequence.items.start;
		     it < seq->data.sequence.items.top && !cut; it++) {
			yaml_node_t *n = ymap_get(f, ynode(f, *it), "name");
			const char *s;
			bool dup = false;

			if (!n || n->type != YAML_SCALAR_NODE ||
			    !n->data.scalar.length)
				continue;
			s = (const char *)n->data.scalar.value;
			for (size_t j = 0; j < nseen && !dup; j++)
				dup = strcmp(seen[j], s) == 0;
			if (dup)
				continue;
			seen = sbx_xrealloc(seen, (nseen + 1) * sizeof(*seen));
			seen[nseen++] = s;
			if (sbx_buf_addf(&b, "%s%s", b.len ? ", " : "", s) < 0)
				cut = true;
		}
	}
	free(seen);
	if (cut) {
		sbx_error_clear();
		if (sbx_buf_adds(&b, ", ...") < 0)
			sbx_error_clear();
	}
	if (!b.len && sbx_buf_adds(&b, "none") < 0)
		sbx_error_clear();
	return sbx_buf_take(&b, NULL);
}

static char *resolve(const struct kfile *f, const char *name)
{
	if (name[0] == '/')
		return sbx_xstrdup(name);
	return sbx_xasprintf("%s/%s", f->dir, name);
}

/* Read a PEM file named by `key` of `where`. */
static int read_pem_file(char **out, size_t *len_out, const struct kfile *f,
			 const char *where, const char *key, const char *name,
			 const char *marker)
{
	char *path = resolve(f, name), *shown = shown_path(path);
	char *text = NULL;
	size_t len = 0;
	int rc;

	*out = NULL;
	*len_out = 0;
	rc = sbx_file_read(path, PEM_CAP, &text, &len);
	if (rc < 0) {
		rc = sbx_error_set(SBX_ERR_CONFIG, rc,
				   "%s: %s %s cannot be read: %s", where, key,
				   shown, why(rc));
	} else if (!has(text, len, marker)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "%s: %s %s is not PEM (no %s)", where, key,
				   shown, marker);
		wipe_free(text, len);
	} else {
		*out = text;
		*len_out = len;
	}
	free(shown);
	free(path);
	return rc;
}

/* Decode a "-data" value: base64 of PEM (line breaks allowed). */
static int decode_pem_data(char **out, size_t *len_out, const char *where,
			   const char *key, const char *b64,
			   const char *marker)
{
	size_t n = strlen(b64), o = 0, dlen = 0;
	char *clean = sbx_xmalloc(n + 1);
	unsigned char *data = NULL;
	int rc;

	*out = NULL;
	*len_out = 0;
	for (size_t i = 0; i < n; i++)
		if (!isspace((unsigned char)b64[i]))
			clean[o++] = b64[i];
	clean[o] = '\0';
	rc = sbx_proto_base64_decode(clean, &data, &dlen);
	wipe_free(clean, n + 1);
	if (rc < 0)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s: %s is not valid base64 (%s)", where,
				     key, sbx_error_last()->msg);
	if (!has((const char *)data, dlen, marker)) {
		wipe_free((char *)data, dlen);
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s: %s does not decode to PEM (no %s)",
				     where, key, marker);
	}
	*out = memdup0((const char *)data, dlen);
	*len_out = dlen;
	wipe_free((char *)data, dlen);
	return 0;
}

/* Read a token file: trimmed, non-empty, header-safe. */
static int token_file_read(char **out, const char *path, const char *where)
{
	char *text = NULL, *shown = shown_path(path), *s, *e;
	size_t len = 0;
	bool nul;
	int rc;

	*out = NULL;
	rc = sbx_file_read(path, TOKEN_CAP, &text, &len);
	if (rc < 0) {
		rc = sbx_error_set(SBX_ERR_CONFIG, rc,
				   "%s: token file %s cannot be read: %s",
				   where, shown, why(rc));
		goto out;
	}
	nul = strlen(text) != len;
	for (s = text; isspace((unsigned char)*s); s++)
		;
	for (e = text + strlen(text); e > s && isspace((unsigned char)e[-1]);
	     e--)
		;
	*e = '\0';
	if (!*s && !nul)
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "%s: token file %s is empty", where, shown);
	else if (!token_ok(s) || nul)
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "%s: token file %s contains spaces or "
				   "control characters", where, shown);
	else
		*out = sbx_xstrdup(s);
out:
	wipe_free(text, len);
	free(shown);
	return rc;
}

/* ---- loading a context ----------------------------------------------------- */

static int server_normalise(char **out, const char *s, const char *where)
{
	char *url;
	size_t n, skip;

	*out = NULL;
	if (strncasecmp(s, "https://", 8) == 0) {
		url = sbx_xasprintf("https://%s", s + 8);
		skip = 8;
	} else if (strncasecmp(s, "http://", 7) == 0) {
		url = sbx_xasprintf("http://%s", s + 7);
		skip = 7;
	} else if (strstr(s, "://")) {
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s: server '%s' must be an https:// "
				     "URL", where, s);
	} else {
		/* kubectl's default for a bare host:port with TLS. */
		url = sbx_xasprintf("https://%s", s);
		skip = 8;
	}
	n = strlen(url);
	while (n > skip && url[n - 1] == '/')
		url[--n] = '\0';
	for (size_t i = 0; i < n; i++) {
		if ((unsigned char)url[i] <= 0x20 || url[i] == 0x7f) {
			free(url);
			return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					     "%s: server '%s' contains spaces "
					     "or control characters", where,
					     s);
		}
	}
	if (n == skip || url[skip] == '/' || url[skip] == '?' ||
	    url[skip] == '#') {
		free(url);
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s: server '%s' has no host", where, s);
	}
	*out = url;
	return 0;
}

static int load_cluster(struct sbx_kube_config *k, struct kfile *f,
			const char *name, const yaml_node_t *c)
{
	const char *server, *ca, *ca_data, *sni;
	char *where = sbx_xasprintf("%s: cluster '%s'", f->shown, name);
	int rc;

	if ((rc = yget_str(&server, f, where, c, "server")) < 0 ||
	    (rc = yget_str(&ca, f, where, c, "certificate-authority")) < 0 ||
	    (rc = yget_str(&ca_data, f, where, c,
			   "certificate-authority-data")) < 0 ||
	    (rc = yget_str(&sni, f, where, c, "tls-server-name")) < 0 ||
	    (rc = yget_bool(&k->insecure, f, where, c,
			    "insecure-skip-tls-verify")) < 0)
		goto out;
	if (!server) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "%s: 'server' is not set", where);
		goto out;
	}
	if ((rc = server_normalise(&k->server, server, where)) < 0)
		goto out;
	if (k->insecure && (ca || ca_data)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "%s: both a certificate authority and "
				   "insecure-skip-tls-verify are set (kubectl "
				   "refuses this too); remove one", where);
		goto out;
	}
	if (ca_data)
		rc = decode_pem_data(&k->ca_pem, &k->ca_len, where,
				     "certificate-authority-data", ca_data,
				     "-----BEGIN CERTIFICATE-----");
	else if (ca)
		rc = read_pem_file(&k->ca_pem, &k->ca_len, f, where,
				   "certificate-authority", ca,
				   "-----BEGIN CERTIFICATE-----");
	if (rc < 0)
		goto out;
	if (sni)
		k->tls_server_name = sbx_xstrdup(sni);
out:
	free(where);
	return rc;
}

static int load_exec(struct sbx_kube_config *k, struct kfile *f,
		     const char *uwhere, const yaml_node_t *e)
{
	const char *cmd, *api, *hint, *mode;
	yaml_node_t *args, *env;
	struct kexec *x = sbx_xcalloc(1, sizeof(*x));
	char *where = sbx_xasprintf("%s: exec", uwhere);
	size_t n = 0;
	int rc;

	x->where = sbx_xstrdup(uwhere);
	if ((rc = yget_str(&cmd, f, where, e, "command")) < 0 ||
	    (rc = yget_str(&api, f, where, e, "apiVersion")) < 0 ||
	    (rc = yget_str(&hint, f, where, e, "installHint")) < 0 ||
	    (rc = yget_str(&mode, f, where, e, "interactiveMode")) < 0 ||
	    (rc = yget_kind(&args, f, where, e, "args",
			    YAML_SEQUENCE_NODE)) < 0 ||
	    (rc = yget_kind(&env, f, where, e, "env", YAML_SEQUENCE_NODE)) < 0)
		goto out;
	rc = -EINVAL;
	if (!cmd) {
		sbx_error_set(SBX_ERR_CONFIG, rc, "%s: 'command' is not set",
			      where);
		goto out;
	}
	if (!api) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: 'apiVersion' is not set (use " API_V1 ")",
			      where);
		goto out;
	}
	if (strcmp(api, API_V1) != 0 && strcmp(api, API_V1BETA1) != 0) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: apiVersion '%s' is not supported (use "
			      API_V1 " or " API_V1BETA1 ")", where, api);
		goto out;
	}
	if (!mode && strcmp(api, API_V1) == 0) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: 'interactiveMode' must be set for " API_V1
			      " (use Never or IfAvailable)", where);
		goto out;
	}
	if (mode && strcmp(mode, "Always") == 0) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: interactiveMode Always needs a terminal, "
			      "and sbx runs credential plugins without one; "
			      "use IfAvailable or Never", where);
		goto out;
	}
	if (mode && strcmp(mode, "Never") != 0 &&
	    strcmp(mode, "IfAvailable") != 0) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: interactiveMode '%s' is not one of Never, "
			      "IfAvailable, Always", where, mode);
		goto out;
	}
	x->api_version = sbx_xstrdup(api);
	x->hint = hint ? sbx_xstrdup(hint) : NULL;

	n = args ? (size_t)(args->data.sequence.items.top -
			    args->data.sequence.items.start)
		 : 0;
	x->argv = sbx_xcalloc(n + 2, sizeof(*x->argv));
	x->argv[0] = strchr(cmd, '/') ? resolve(f, cmd) : sbx_xstrdup(cmd);
	for (size_t i = 0; i < n; i++) {
		yaml_node_t *a = ynode(f, args->data.sequence.items.start[i]);

		if (!a || a->type != YAML_SCALAR_NODE ||
		    strlen((const char *)a->data.scalar.value) !=
			    a->data.scalar.length) {
			sbx_error_set(SBX_ERR_CONFIG, rc,
				      "%s: args[%zu] must be a string", where,
				      i);
			goto out;
		}
		x->argv[i + 1] = sbx_xstrdup((const char *)a->data.scalar.value);
	}

	n = env ? (size_t)(env->data.sequence.items.top -
			   env->data.sequence.items.start)
		: 0;
	x->env = sbx_xcalloc(n + 1, sizeof(*x->env));
	for (size_t i = 0; i < n; i++) {
		yaml_node_t *item = ynode(f, env->data.sequence.items.start[i]);
		const char *en, *ev;

		if (!item || item->type != YAML_MAPPING_NODE) {
			sbx_error_set(SBX_ERR_CONFIG, rc,
				      "%s: env[%zu] must be a mapping with "
				      "'name' and 'value'", where, i);
			goto out;
		}
		if ((rc = yget_str(&en, f, where, item, "name")) < 0 ||
		    (rc = yget_str(&ev, f, where, item, "value")) < 0)
			goto out;
		rc = -EINVAL;
		if (!en || strchr(en, '=')) {
			sbx_error_set(SBX_ERR_CONFIG, rc,
				      "%s: env[%zu] needs a 'name' without "
				      "'='", where, i);
			goto out;
		}
		x->env[i] = sbx_xasprintf("%s=%s", en, ev ? ev : "");
	}
	k->exec = x;
	x = NULL;
	rc = 0;
out:
	if (x) {
		strv_free(x->argv);
		strv_free(x->env);
		free(x->api_version);
		free(x->hint);
		free(x->where);
		free(x);
	}
	free(where);
	return rc;
}

static int load_user(struct sbx_kube_config *k, struct kfile *f,
		     const char *name, const yaml_node_t *u)
{
	const char *token, *tfile, *cert, *cert_data, *key, *key_data;
	const char *login, *pass;
	yaml_node_t *exec, *ap;
	char *where = sbx_xasprintf("%s: user '%s'", f->shown, name);
	int rc;

	if ((rc = yget_str(&token, f, where, u, "token")) < 0 ||
	    (rc = yget_str(&tfile, f, where, u, "tokenFile")) < 0 ||
	    (rc = yget_str(&cert, f, where, u, "client-certificate")) < 0 ||
	    (rc = yget_str(&cert_data, f, where, u,
			   "client-certificate-data")) < 0 ||
	    (rc = yget_str(&key, f, where, u, "client-key")) < 0 ||
	    (rc = yget_str(&key_data, f, where, u, "client-key-data")) < 0 ||
	    (rc = yget_str(&login, f, where, u, "username")) < 0 ||
	    (rc = yget_str(&pass, f, where, u, "password")) < 0 ||
	    (rc = yget_kind(&exec, f, where, u, "exec",
			    YAML_MAPPING_NODE)) < 0 ||
	    (rc = yget_kind(&ap, f, where, u, "auth-provider",
			    YAML_MAPPING_NODE)) < 0)
		goto out;
	rc = -EINVAL;
	if (ap) {
		const char *apn = NULL;

		if (yget_str(&apn, f, where, ap, "name") < 0)
			apn = NULL;
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: auth-provider '%s' is not supported "
			      "(kubectl dropped it too); use an exec "
			      "credential plugin such as "
			      "gke-gcloud-auth-plugin or kubelogin", where,
			      apn ? apn : "?");
		goto out;
	}
	if (login || pass) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: username/password (basic auth) is not "
			      "supported; use a token, a client certificate "
			      "or an exec plugin", where);
		goto out;
	}
	if (cert && cert_data) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: both client-certificate and "
			      "client-certificate-data are set; remove one",
			      where);
		goto out;
	}
	if (key && key_data) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: both client-key and client-key-data are "
			      "set; remove one", where);
		goto out;
	}
	if (!!(cert || cert_data) != !!(key || key_data)) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: %s is set without %s", where,
			      cert || cert_data ? "a client certificate"
						: "a client key",
			      cert || cert_data ? "client-key(-data)"
						: "client-certificate(-data)");
		goto out;
	}
	rc = 0;
	if (cert_data)
		rc = decode_pem_data(&k->cert_pem, &k->cert_len, where,
				     "client-certificate-data", cert_data,
				     "-----BEGIN CERTIFICATE-----");
	else if (cert)
		rc = read_pem_file(&k->cert_pem, &k->cert_len, f, where,
				   "client-certificate", cert,
				   "-----BEGIN CERTIFICATE-----");
	if (rc < 0)
		goto out;
	if (key_data)
		rc = decode_pem_data(&k->key_pem, &k->key_len, where,
				     "client-key-data", key_data,
				     "PRIVATE KEY-----");
	else if (key)
		rc = read_pem_file(&k->key_pem, &k->key_len, f, where,
				   "client-key", key, "PRIVATE KEY-----");
	if (rc < 0)
		goto out;
	if (exec) {
		/* The plugin provides the token; token(File) is ignored. */
		rc = load_exec(k, f, where, exec);
		goto out;
	}
	if (token) {
		if (!token_ok(token)) {
			rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					   "%s: 'token' contains spaces or "
					   "control characters", where);
			goto out;
		}
		k->token = sbx_xstrdup(token);
	}
	if (tfile) {
		k->token_file = resolve(f, tfile);
		k->token_where = sbx_xasprintf("%s: tokenFile", where);
		rc = token_file_read(&k->file_token, k->token_file,
				     k->token_where);
		if (rc < 0 && k->token) {
			/* client-go: the static token covers for the file. */
			sbx_error_clear();
			rc = 0;
		}
		clock_gettime(CLOCK_MONOTONIC, &k->file_at);
	}
out:
	free(where);
	return rc;
}

static int load_kubeconfig(struct sbx_kube_config *k, struct kload *L,
			   const struct sbx_kube_load_opts *o)
{
	const char *ctx_name = o->context && *o->context ? o->context : NULL;
	const char *cluster, *user = NULL, *ns;
	yaml_node_t *ctx, *cl, *us;
	struct kfile *cf, *lf, *uf;
	char *names = NULL, *where = NULL;
	int rc;

	for (size_t i = 0; i < L->n; i++)
		if ((rc = kfile_parse(&L->f[i])) < 0)
			return rc;
	if (!ctx_name) {
		for (size_t i = 0; i < L->n && !ctx_name; i++) {
			rc = yget_str(&ctx_name, &L->f[i], L->f[i].shown,
				      L->f[i].root, "current-context");
			if (rc < 0)
				return rc;
		}
		if (!ctx_name) {
			names = list_names(L, "contexts");
			rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					   "%s: current-context is not set "
					   "(contexts: %s); use --context or "
					   "kubectl config use-context",
					   k->source, names);
			goto out;
		}
	}
	rc = find_named(L, "contexts", "context", ctx_name, &ctx, &cf);
	if (rc < 0)
		goto out;
	if (rc == 0) {
		names = list_names(L, "contexts");
		rc = sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
				   "%s: context '%s' not found (contexts: %s); "
				   "use --context or kubectl config "
				   "get-contexts", k->source, ctx_name, names);
		goto out;
	}
	k->context = sbx_xstrdup(ctx_name);
	where = sbx_xasprintf("%s: context '%s'", cf->shown, ctx_name);
	if ((rc = yget_str(&cluster, cf, where, ctx, "cluster")) < 0 ||
	    (rc = yget_str(&user, cf, where, ctx, "user")) < 0 ||
	    (rc = yget_str(&ns, cf, where, ctx, "namespace")) < 0)
		goto out;
	if (!cluster) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "%s: 'cluster' is not set", where);
		goto out;
	}
	rc = find_named(L, "clusters", "cluster", cluster, &cl, &lf);
	if (rc < 0)
		goto out;
	if (rc == 0) {
		names = list_names(L, "clusters");
		rc = sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
				   "%s: cluster '%s' not found in %s "
				   "(clusters: %s)", where, cluster, k->source,
				   names);
		goto out;
	}
	if ((rc = load_cluster(k, lf, cluster, cl)) < 0)
		goto out;
	if (user) {
		rc = find_named(L, "users", "user", user, &us, &uf);
		if (rc < 0)
			goto out;
		if (rc == 0) {
			names = list_names(L, "users");
			rc = sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
					   "%s: user '%s' not found in %s "
					   "(users: %s)", where, user,
					   k->source, names);
			goto out;
		}
		if ((rc = load_user(k, uf, user, us)) < 0)
			goto out;
	}
	if (strncmp(k->server, "http://", 7) == 0 &&
	    (k->token || k->token_file || k->exec || k->cert_pem)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "%s: server %s is plain http:// but user "
				   "'%s' has credentials; sbx sends "
				   "credentials only over https: use an "
				   "https:// server", where, k->server,
				   user ? user : "");
		goto out;
	}
	if (ns && !ns_ok(ns)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "%s: namespace '%s' is not a valid "
				   "namespace name (lowercase letters, digits "
				   "and '-', at most 63)", where, ns);
		goto out;
	}
	k->ns = sbx_xstrdup(ns ? ns : "default");
	rc = 0;
out:
	free(where);
	free(names);
	return rc;
}

static int load_incluster(struct sbx_kube_config *k,
			  const struct sbx_kube_load_opts *o)
{
	const char *host = getenv("KUBERNETES_SERVICE_HOST");
	const char *port = getenv("KUBERNETES_SERVICE_PORT");
	const char *dir = getenv("SBX_KUBE_SA_DIR");
	const char *pod_ns = getenv("POD_NAMESPACE");
	char *path = NULL, *nsfile = NULL, *shown = NULL;
	int rc;

	if (!dir || !*dir)
		dir = SA_DIR;
	k->source = shown_path(dir);
	k->context = sbx_xstrdup("in-cluster");
	if (o->context && *o->context)
		return sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
				     "context '%s' requested but there is no "
				     "kubeconfig (only the in-cluster service "
				     "account); pass --kubeconfig or drop "
				     "--context", o->context);
	if (!port || !*port || strspn(port, "0123456789") != strlen(port) ||
	    strlen(port) > 5)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "in-cluster: KUBERNETES_SERVICE_HOST is "
				     "set but KUBERNETES_SERVICE_PORT is %s",
				     port && *port ? "not a port number"
						   : "not set");
	for (const char *p = host; *p; p++)
		if ((unsigned char)*p <= 0x20 || strchr("/?#@", *p))
			return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					     "in-cluster: "
					     "KUBERNETES_SERVICE_HOST '%s' is "
					     "not a host name or address",
					     host);
	if (strchr(host, ':') && host[0] != '[')
		k->server = sbx_xasprintf("https://[%s]:%s", host, port);
	else
		k->server = sbx_xasprintf("https://%s:%s", host, port);

	k->token_file = sbx_xasprintf("%s/token", dir);
	k->token_where = sbx_xstrdup("in-cluster service account");
	rc = token_file_read(&k->file_token, k->token_file, k->token_where);
	if (rc < 0)
		return sbx_error_prefix(rc, "in-cluster (is "
				       "automountServiceAccountToken false "
				       "for this pod?)");
	clock_gettime(CLOCK_MONOTONIC, &k->file_at);

	path = sbx_xasprintf("%s/ca.crt", dir);
	rc = sbx_file_read(path, PEM_CAP, &k->ca_pem, &k->ca_len);
	if (rc == -ENOENT) {
		sbx_error_clear(); /* client-go: system CAs then */
		rc = 0;
	} else if (rc < 0) {
		shown = shown_path(path);
		rc = sbx_error_set(SBX_ERR_CONFIG, rc,
				   "in-cluster: %s cannot be read: %s", shown,
				   why(rc));
		goto out;
	} else if (!has(k->ca_pem, k->ca_len,
			"-----BEGIN CERTIFICATE-----")) {
		shown = shown_path(path);
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "in-cluster: %s is not PEM", shown);
		goto out;
	}

	if (o->namespace_override && *o->namespace_override) {
		k->ns = NULL; /* set by the caller */
	} else if (pod_ns && *pod_ns) {
		k->ns = sbx_xstrdup(pod_ns);
	} else {
		char *text = NULL;

		nsfile = sbx_xasprintf("%s/namespace", dir);
		if (sbx_file_read(nsfile, 4096, &text, NULL) == 0) {
			text[strcspn(text, " \t\r\n")] = '\0';
			if (*text)
				k->ns = sbx_xstrdup(text);
		} else {
			sbx_error_clear();
		}
		free(text);
		if (!k->ns)
			k->ns = sbx_xstrdup("default");
	}
	if (k->ns && !ns_ok(k->ns)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "in-cluster: namespace '%s' (POD_NAMESPACE "
				   "or the namespace file) is not a valid "
				   "namespace name", k->ns);
		goto out;
	}
	rc = 0;
out:
	free(shown);
	free(nsfile);
	free(path);
	return rc;
}

/* ---- public: load / free / getters --------------------------------------- */

void sbx_kube_config_free(struct sbx_kube_config *k)
{
	if (!k)
		return;
	free(k->server);
	free(k->ns);
	free(k->context);
	free(k->source);
	free(k->ca_pem);
	free(k->tls_server_name);
	free(k->cert_pem);
	wipe_free(k->key_pem, k->key_len);
	wipe_str(k->token);
	free(k->token_file);
	free(k->token_where);
	if (k->exec) {
		strv_free(k->exec->argv);
		/* exec.env may carry secrets too. */
		for (char **p = k->exec->env; p && *p; p++)
			explicit_bzero(*p, strlen(*p));
		strv_free(k->exec->env);
		free(k->exec->api_version);
		free(k->exec->hint);
		free(k->exec->where);
		free(k->exec);
	}
	wipe_str(k->file_token);
	wipe_str(k->ex_token);
	free(k->ex_cert);
	wipe_free(k->ex_key, k->ex_key_len);
	pthread_mutex_destroy(&k->lock);
	free(k);
}

int sbx_kube_config_load(struct sbx_kube_config **out,
			 const struct sbx_kube_load_opts *o)
{
	static const struct sbx_kube_load_opts defaults;
	const char *over;
	struct sbx_kube_config *k;
	struct kload L;
	int rc;

	SBX_ASSERT_ARG(out);
	*out = NULL;
	if (!o)
		o = &defaults;
	memset(&L, 0, sizeof(L));
	k = sbx_xcalloc(1, sizeof(*k));
	pthread_mutex_init(&k->lock, NULL);

	over = o->namespace_override && *o->namespace_override
		       ? o->namespace_override
		       : NULL;
	if (over && !ns_ok(over)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "namespace '%s' is not a valid namespace "
				   "name (lowercase letters, digits and '-', "
				   "at most 63)", over);
		goto out;
	}
	if ((rc = collect_files(&L, o)) < 0)
		goto out;
	if (L.n) {
		struct sbx_buf b;

		sbx_buf_init(&b, 64 * 1024);
		for (size_t i = 0; i < L.n; i++)
			if (sbx_buf_addf(&b, "%s%s", i ? ":" : "",
					 L.f[i].shown) < 0)
				sbx_error_clear();
		k->source = sbx_buf_take(&b, NULL);
		rc = load_kubeconfig(k, &L, o);
	} else if (getenv("KUBERNETES_SERVICE_HOST") &&
		   *getenv("KUBERNETES_SERVICE_HOST")) {
		rc = load_incluster(k, o);
	} else {
		rc = sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
				   "no Kubernetes configuration: %s, and "
				   "KUBERNETES_SERVICE_HOST is not set (not "
				   "in a pod); pass --kubeconfig FILE or set "
				   "KUBECONFIG", L.tried);
	}
	if (rc < 0)
		goto out;
	if (over) {
		free(k->ns);
		k->ns = sbx_xstrdup(over);
	}
	*out = k;
	k = NULL;
out:
	sbx_kube_config_free(k);
	kload_fini(&L);
	return rc;
}

const char *sbx_kube_server(const struct sbx_kube_config *k)
{
	return k ? k->server : NULL;
}

const char *sbx_kube_namespace(const struct sbx_kube_config *k)
{
	return k ? k->ns : NULL;
}

const char *sbx_kube_context_name(const struct sbx_kube_config *k)
{
	return k ? k->context : NULL;
}

const char *sbx_kube_source(const struct sbx_kube_config *k)
{
	return k ? k->source : NULL;
}

/* ---- exec credential plugins ---------------------------------------------- */

/* The parent's environment, minus what the plugin config overrides. */
static char **exec_envp(const struct kexec *x, const char *info)
{
	size_t n = 0, m = 0, o = 0;
	char **envp;

	for (char **e = environ; e && *e; e++)
		n++;
	for (char **e = x->env; *e; e++)
		m++;
	envp = sbx_xcalloc(n + m + 2, sizeof(*envp));
	for (size_t i = 0; i < n; i++) {
		const char *e = environ[i];
		size_t nl = strcspn(e, "=");
		bool skip = nl == 20 && strncmp(e, "KUBERNETES_EXEC_INFO",
						 20) == 0;

		for (size_t j = 0; j < m && !skip; j++)
			skip = strncmp(x->env[j], e, nl + 1) == 0;
		if (!skip)
			envp[o++] = environ[i];
	}
	for (size_t i = 0; i < m; i++) {
		size_t nl = strcspn(x->env[i], "=");
		bool later = false;

		/* A later entry with the same name wins (Go's os/exec). */
		for (size_t j = i + 1; j < m && !later; j++)
			later = strncmp(x->env[j], x->env[i], nl + 1) == 0;
		if (!later)
			envp[o++] = x->env[i];
	}
	envp[o++] = (char *)info;
	envp[o] = NULL;
	return envp;
}

/* The first non-blank line of `s`, trimmed and shortened, in buf. */
static const char *first_line(char *buf, size_t size, const char *s)
{
	size_t n;

	while (*s && isspace((unsigned char)*s))
		s++;
	n = strcspn(s, "\r\n");
	while (n && isspace((unsigned char)s[n - 1]))
		n--;
	if (n >= size)
		n = size - 1;
	memcpy(buf, s, n);
	buf[n] = '\0';
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)buf[i] < 0x20 || buf[i] == 0x7f)
			buf[i] = '?';
	return buf;
}

static int exec_fail(const struct kexec *x, int klass, int code,
		     const char *what, const char *err)
{
	char line[200], hint[240] = "";

	first_line(line, sizeof(line), err ? err : "");
	if (x->hint) {
		size_t n;

		/* installHint is often several lines: keep them on one. */
		snprintf(hint, sizeof(hint), "%s", x->hint);
		for (char *p = hint; *p; p++)
			if ((unsigned char)*p < 0x20 || *p == 0x7f)
				*p = ' ';
		for (n = strlen(hint); n && hint[n - 1] == ' '; n--)
			hint[n - 1] = '\0';
	}
	return sbx_error_set(klass, code, "%s: exec plugin '%s' %s%s%s%s%s",
			     x->where, x->argv[0], what, *line ? ": " : "",
			     line, *hint ? "; " : "", hint);
}

static long exec_timeout_ms(void)
{
	const char *s = getenv("SBX_KUBE_EXEC_TIMEOUT_MS");
	char *end;
	long v;

	if (!s || !*s)
		return EXEC_TIMEOUT_MS;
	v = strtol(s, &end, 10);
	return *end || v <= 0 ? EXEC_TIMEOUT_MS : v;
}

/* Turn the plugin's ExecCredential into the cache.  Called locked. */
static int exec_parse(struct sbx_kube_config *k, const char *text,
		      size_t len, const char *err)
{
	const struct kexec *x = k->exec;
	const cJSON *status, *tok = NULL, *crt, *key = NULL, *exp;
	const char *kind, *api;
	time_t expires = 0;
	cJSON *j;
	char what[160];
	int rc = -EPROTO;

	j = cJSON_ParseWithLength(text, len);
	if (!j || !cJSON_IsObject(j)) {
		snprintf(what, sizeof(what),
			 "exited 0 but printed %zu bytes that are not a JSON "
			 "ExecCredential", len);
		rc = exec_fail(x, SBX_ERR_JSON, rc, what, err);
		goto out;
	}
	kind = sbx_json_str(j, "kind");
	api = sbx_json_str(j, "apiVersion");
	status = cJSON_GetObjectItemCaseSensitive(j, "status");
	tok = cJSON_GetObjectItemCaseSensitive(status, "token");
	crt = cJSON_GetObjectItemCaseSensitive(status, "clientCertificateData");
	key = cJSON_GetObjectItemCaseSensitive(status, "clientKeyData");
	exp = cJSON_GetObjectItemCaseSensitive(status, "expirationTimestamp");
	if (!kind || strcmp(kind, "ExecCredential") != 0) {
		rc = exec_fail(x, SBX_ERR_JSON, rc,
			       "printed JSON whose kind is not "
			       "ExecCredential", err);
		goto out;
	}
	if (!api || strcmp(api, x->api_version) != 0) {
		snprintf(what, sizeof(what),
			 "returned apiVersion '%.40s' but is configured "
			 "for %s", api ? api : "", x->api_version);
		rc = exec_fail(x, SBX_ERR_JSON, rc, what, err);
		goto out;
	}
	if (!cJSON_IsObject(status) || (tok && !cJSON_IsString(tok)) ||
	    (crt && !cJSON_IsString(crt)) || (key && !cJSON_IsString(key)) ||
	    (exp && !cJSON_IsString(exp) && !cJSON_IsNull(exp))) {
		rc = exec_fail(x, SBX_ERR_JSON, rc,
			       "returned an ExecCredential with a missing or "
			       "mistyped status", err);
		goto out;
	}
	if (tok && !*tok->valuestring)
		tok = NULL;
	if (crt && !*crt->valuestring)
		crt = NULL;
	if (key && !*key->valuestring)
		key = NULL;
	if (!tok && !crt) {
		rc = exec_fail(x, SBX_ERR_JSON, rc,
			       "returned neither status.token nor "
			       "status.clientCertificateData", err);
		goto out;
	}
	if (!!crt != !!key) {
		rc = exec_fail(x, SBX_ERR_JSON, rc,
			       "returned only one of "
			       "status.clientCertificateData and "
			       "status.clientKeyData", err);
		goto out;
	}
	if (tok && !token_ok(tok->valuestring)) {
		rc = exec_fail(x, SBX_ERR_JSON, rc,
			       "returned a token with spaces or control "
			       "characters", err);
		goto out;
	}
	if (crt && (!has(crt->valuestring, strlen(crt->valuestring),
			 "-----BEGIN CERTIFICATE-----") ||
		    !has(key->valuestring, strlen(key->valuestring),
			 "PRIVATE KEY-----"))) {
		rc = exec_fail(x, SBX_ERR_JSON, rc,
			       "returned a client certificate or key that "
			       "is not PEM", err);
		goto out;
	}
	if (cJSON_IsString(exp) &&
	    sbx_json_time_parse(&expires, exp->valuestring) < 0) {
		snprintf(what, sizeof(what),
			 "returned a bad status.expirationTimestamp "
			 "'%.40s' (RFC 3339 expected)", exp->valuestring);
		rc = exec_fail(x, SBX_ERR_JSON, rc, what, err);
		goto out;
	}

	wipe_str(k->ex_token);
	free(k->ex_cert);
	wipe_free(k->ex_key, k->ex_key_len);
	k->ex_token = tok ? sbx_xstrdup(tok->valuestring) : NULL;
	k->ex_cert = crt ? sbx_xstrdup(crt->valuestring) : NULL;
	k->ex_cert_len = crt ? strlen(crt->valuestring) : 0;
	k->ex_key = key ? sbx_xstrdup(key->valuestring) : NULL;
	k->ex_key_len = key ? strlen(key->valuestring) : 0;
	k->ex_expires = expires;
	k->ex_have = true;
	rc = 0;
out:
	if (j) {
		/* The tree holds the secrets: wipe before releasing. */
		if (tok)
			explicit_bzero(tok->valuestring,
				       strlen(tok->valuestring));
		if (key)
			explicit_bzero(key->valuestring,
				       strlen(key->valuestring));
		cJSON_Delete(j);
	}
	return rc;
}

/* Run the plugin and refresh the cache.  Called locked. */
static int exec_run(struct sbx_kube_config *k)
{
	const struct kexec *x = k->exec;
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t none, all;
	struct pollfd pf[2] = { { .fd = -1 }, { .fd = -1 } };
	int outp[2] = { -1, -1 }, errp[2] = { -1, -1 };
	struct sbx_buf ob, eb;
	char *info = NULL, **envp = NULL, what[160];
	long timeout = exec_timeout_ms();
	long long deadline;
	bool timed_out = false, too_big = false;
	pid_t pid = -1;
	int status = 0, rc = 0, e;

	sbx_buf_init(&ob, EXEC_OUT_CAP);
	sbx_buf_init(&eb, EXEC_ERR_CAP);
	info = sbx_xasprintf("KUBERNETES_EXEC_INFO={\"apiVersion\":\"%s\","
			     "\"kind\":\"ExecCredential\",\"spec\":"
			     "{\"interactive\":false}}", x->api_version);
	envp = exec_envp(x, info);
	if (pipe2(outp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0) {
		rc = sbx_error_os("%s: exec plugin: pipe", x->where);
		goto out;
	}
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_adddup2(&fa, outp[1], 1);
	posix_spawn_file_actions_adddup2(&fa, errp[1], 2);
	posix_spawnattr_init(&at);
	sigemptyset(&none);
	sigfillset(&all);
	posix_spawnattr_setsigmask(&at, &none);
	posix_spawnattr_setsigdefault(&at, &all);
	posix_spawnattr_setpgroup(&at, 0);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK |
					      POSIX_SPAWN_SETSIGDEF |
					      POSIX_SPAWN_SETPGROUP);
	/* Only a name without '/' is searched in PATH. */
	e = strchr(x->argv[0], '/')
		    ? posix_spawn(&pid, x->argv[0], &fa, &at, x->argv, envp)
		    : posix_spawnp(&pid, x->argv[0], &fa, &at, x->argv, envp);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	close(outp[1]);
	close(errp[1]);
	outp[1] = errp[1] = -1;
	if (e) {
		pid = -1;
		if (e == ENOENT)
			snprintf(what, sizeof(what), "was not found%s",
				 strchr(x->argv[0], '/') ? "" : " in PATH");
		else
			snprintf(what, sizeof(what), "cannot be run: %s",
				 strerror(e));
		rc = exec_fail(x, SBX_ERR_CONFIG, -e, what, NULL);
		goto out;
	}

	pf[0].fd = outp[0];
	pf[1].fd = errp[0];
	pf[0].events = pf[1].events = POLLIN;
	outp[0] = errp[0] = -1;
	deadline = mono_ms() + timeout;
	while (pf[0].fd >= 0 || pf[1].fd >= 0) {
		long long left = deadline - mono_ms();
		char buf[16384];
		int n;

		if (left <= 0) {
			timed_out = true;
			break;
		}
		n = poll(pf, 2, left > INT_MAX ? INT_MAX : (int)left);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = sbx_error_os("%s: exec plugin: poll", x->where);
			break;
		}
		for (int i = 0; i < 2; i++) {
			ssize_t r;

			if (pf[i].fd < 0 || !pf[i].revents)
				continue;
			r = read(pf[i].fd, buf, sizeof(buf));
			if (r < 0 && (errno == EINTR || errno == EAGAIN))
				continue;
			if (r <= 0) {
				close(pf[i].fd);
				pf[i].fd = -1;
			} else if (i == 0) {
				if (sbx_buf_add(&ob, buf, (size_t)r) < 0) {
					sbx_error_clear();
					too_big = true;
				}
			} else {
				size_t room = eb.cap - eb.len;

				if (room && sbx_buf_add(&eb, buf,
							(size_t)r < room
								? (size_t)r
								: room) < 0)
					sbx_error_clear();
			}
		}
		explicit_bzero(buf, sizeof(buf));
		if (too_big)
			break;
	}
	if (timed_out || too_big || rc < 0)
		kill(-pid, SIGKILL);
	while (waitpid(pid, &status, 0) < 0) {
		if (errno != EINTR) {
			status = 0; /* reaped elsewhere (SIGCHLD ignored) */
			break;
		}
	}
	if (rc < 0)
		goto out;
	if (timed_out) {
		snprintf(what, sizeof(what),
			 "did not finish within %ld s and was killed",
			 (timeout + 999) / 1000);
		rc = exec_fail(x, SBX_ERR_CONFIG, -ETIMEDOUT, what,
			       sbx_buf_ptr(&eb));
	} else if (too_big) {
		rc = exec_fail(x, SBX_ERR_CONFIG, -EFBIG,
			       "printed more than 1 MiB and was killed",
			       sbx_buf_ptr(&eb));
	} else if (WIFSIGNALED(status)) {
		snprintf(what, sizeof(what), "was killed by signal %d (%s)",
			 WTERMSIG(status), strsignal(WTERMSIG(status)));
		rc = exec_fail(x, SBX_ERR_CONFIG, -EIO, what,
			       sbx_buf_ptr(&eb));
	} else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
		snprintf(what, sizeof(what), "failed with exit status %d",
			 WEXITSTATUS(status));
		rc = exec_fail(x, SBX_ERR_CONFIG, -EIO, what,
			       sbx_buf_ptr(&eb));
	} else {
		rc = exec_parse(k, sbx_buf_ptr(&ob), sbx_buf_len(&ob),
				sbx_buf_ptr(&eb));
	}
out:
	for (int i = 0; i < 2; i++) {
		if (pf[i].fd >= 0)
			close(pf[i].fd);
		if (outp[i] >= 0)
			close(outp[i]);
		if (errp[i] >= 0)
			close(errp[i]);
	}
	if (ob.data)
		explicit_bzero(ob.data, ob.len);
	sbx_buf_fini(&ob);
	sbx_buf_fini(&eb);
	free(envp);
	free(info);
	return rc;
}

/* ---- public: credentials -------------------------------------------------- */

int sbx_kube_creds_get(struct sbx_kube_config *k, bool refresh,
		       struct sbx_kube_creds *out)
{
	const char *bearer = NULL, *cert = NULL, *key = NULL;
	size_t cert_len = 0, key_len = 0;
	time_t expires = 0;
	int rc = 0;

	SBX_ASSERT_ARG(out);
	memset(out, 0, sizeof(*out));
	SBX_ASSERT_ARG(k);
	pthread_mutex_lock(&k->lock);
	if (k->exec) {
		time_t now = time(NULL);

		if (!k->ex_have || refresh ||
		    (k->ex_expires && k->ex_expires - now <= EXPIRY_SLACK_S)) {
			rc = exec_run(k);
			if (rc < 0)
				goto out;
		}
		bearer = k->ex_token;
		expires = k->ex_expires;
		if (k->ex_cert) {
			cert = k->ex_cert;
			cert_len = k->ex_cert_len;
			key = k->ex_key;
			key_len = k->ex_key_len;
		}
	} else if (k->token_file) {
		struct timespec now;

		clock_gettime(CLOCK_MONOTONIC, &now);
		if (refresh || !k->file_token ||
		    now.tv_sec - k->file_at.tv_sec >= TOKEN_REREAD_S) {
			char *t = NULL;

			rc = token_file_read(&t, k->token_file,
					     k->token_where);
			if (rc == 0) {
				wipe_str(k->file_token);
				k->file_token = t;
				k->file_at = now;
			} else if (k->file_token || k->token) {
				/* Keep the last good token (client-go). */
				sbx_error_clear();
				rc = 0;
			} else {
				goto out;
			}
		}
		bearer = k->file_token ? k->file_token : k->token;
	} else {
		bearer = k->token;
	}
	if (!cert && k->cert_pem) {
		cert = k->cert_pem;
		cert_len = k->cert_len;
		key = k->key_pem;
		key_len = k->key_len;
	}
	if (k->ca_pem) {
		out->ca_pem = memdup0(k->ca_pem, k->ca_len);
		out->ca_pem_len = k->ca_len;
	}
	out->insecure = k->insecure;
	if (k->tls_server_name)
		out->tls_server_name = sbx_xstrdup(k->tls_server_name);
	if (bearer)
		out->bearer = sbx_xstrdup(bearer);
	if (cert) {
		out->cert_pem = memdup0(cert, cert_len);
		out->cert_pem_len = cert_len;
		out->key_pem = memdup0(key, key_len);
		out->key_pem_len = key_len;
	}
	out->expires = expires;
out:
	pthread_mutex_unlock(&k->lock);
	return rc;
}

void sbx_kube_creds_fini(struct sbx_kube_creds *c)
{
	if (!c)
		return;
	free(c->ca_pem);
	free(c->tls_server_name);
	wipe_str(c->bearer);
	free(c->cert_pem);
	wipe_free(c->key_pem, c->key_pem_len);
	memset(c, 0, sizeof(*c));
}
