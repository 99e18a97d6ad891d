/*
 * kubeconfig files: which ones (discovery, kubectl's merge rule), their
 * YAML, and the PEM and token files they name.  See kubeconfig_i.h.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <yaml.h>

#include "sbx/buf.h"
#include "sbx/paths.h"
#include "sbx/proto.h"
#include "sbx/xmalloc.h"

#include "kubeconfig_i.h"

/* ---- kubeconfig files and YAML ------------------------------------------- */

void pk8s_kload_fini(struct kload *L)
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
	f->shown = pk8s_shown_path(abs_take);
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

int pk8s_collect_files(struct kload *L, const struct sbx_kube_load_opts *o)
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

int pk8s_kfile_parse(struct kfile *f)
{
	yaml_parser_t p;
	char *text = NULL;
	size_t len = 0;
	int rc;

	rc = sbx_file_read(f->path, FILE_CAP, &text, &len);
	if (rc < 0)
		return sbx_error_set(SBX_ERR_CONFIG, rc,
				     "cannot read kubeconfig %s: %s%s",
				     f->shown, pk8s_why(rc),
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

yaml_node_t *pk8s_ynode(struct kfile *f, int i)
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
		if (yscalar_eq(pk8s_ynode(f, pr->key), key)) {
			/* The last duplicate wins, as a map would keep it. */
			found = pk8s_ynode(f, pr->value);
		}
	}
	return found;
}

/* A scalar as a C string; NULL when null or empty (unset in kubectl). */
int pk8s_yget_str(const char **out, struct kfile *f, const char *where,
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

int pk8s_yget_bool(bool *out, struct kfile *f, const char *where,
		     const yaml_node_t *map, const char *key)
{
	static const char *const yes[] = { "true", "yes", "on", "y" };
	static const char *const no[] = { "false", "no", "off", "n" };
	const char *s;
	int rc;

	*out = false;
	rc = pk8s_yget_str(&s, f, where, map, key);
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

int pk8s_yget_kind(yaml_node_t **out, struct kfile *f, const char *where,
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
int pk8s_find_named(struct kload *L, const char *list, const char *inner,
		      const char *name, yaml_node_t **body_out,
		      struct kfile **f_out)
{
	*body_out = NULL;
	*f_out = NULL;
	for (size_t i = 0; i < L->n; i++) {
		struct kfile *f = &L->f[i];
		yaml_node_t *seq, *hit = NULL;
		int rc;

		rc = pk8s_yget_kind(&seq, f, f->shown, f->root, list,
			       YAML_SEQUENCE_NODE);
		if (rc < 0)
			return rc;
		if (!seq)
			continue;
		for (yaml_node_item_t *it = seq->data.sequence.items.start;
		     it < seq->data.sequence.items.top; it++) {
			yaml_node_t *e = pk8s_ynode(f, *it);
			const char *n;

			if (!e || e->type != YAML_MAPPING_NODE)
				return sbx_error_set(
					SBX_ERR_CONFIG, -EINVAL,
					"%s: every entry of '%s' must be a "
					"mapping with 'name' and '%s'",
					f->shown, list, inner);
			rc = pk8s_yget_str(&n, f, f->shown, e, "name");
			if (rc < 0)
				return rc;
			if (n && strcmp(n, name) == 0)
				hit = e;
		}
		if (hit) {
			char *where = sbx_xasprintf("%s: %s '%s'", f->shown,
						    inner, name);

			rc = pk8s_yget_kind(body_out, f, where, hit, inner,
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
char *pk8s_list_names(struct kload *L, const char *list)
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
			yaml_node_t *n = ymap_get(f, pk8s_ynode(f, *it), "name");
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

char *pk8s_resolve(const struct kfile *f, const char *name)
{
	if (name[0] == '/')
		return sbx_xstrdup(name);
	return sbx_xasprintf("%s/%s", f->dir, name);
}

/* Read a PEM file named by `key` of `where`. */
int pk8s_read_pem_file(char **out, size_t *len_out, const struct kfile *f,
			 const char *where, const char *key, const char *name,
			 const char *marker)
{
	char *path = pk8s_resolve(f, name), *shown = pk8s_shown_path(path);
	char *text = NULL;
	size_t len = 0;
	int rc;

	*out = NULL;
	*len_out = 0;
	rc = sbx_file_read(path, PEM_CAP, &text, &len);
	if (rc < 0) {
		rc = sbx_error_set(SBX_ERR_CONFIG, rc,
				   "%s: %s %s cannot be read: %s", where, key,
				   shown, pk8s_why(rc));
	} else if (!pk8s_has(text, len, marker)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "%s: %s %s is not PEM (no %s)", where, key,
				   shown, marker);
		pk8s_wipe_free(text, len);
	} else {
		*out = text;
		*len_out = len;
	}
	free(shown);
	free(path);
	return rc;
}

/* Decode a "-data" value: base64 of PEM (line breaks allowed). */
int pk8s_decode_pem_data(char **out, size_t *len_out, const char *where,
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
	pk8s_wipe_free(clean, n + 1);
	if (rc < 0)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s: %s is not valid base64 (%s)", where,
				     key, sbx_error_last()->msg);
	if (!pk8s_has((const char *)data, dlen, marker)) {
		pk8s_wipe_free((char *)data, dlen);
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s: %s does not decode to PEM (no %s)",
				     where, key, marker);
	}
	*out = pk8s_memdup0((const char *)data, dlen);
	*len_out = dlen;
	pk8s_wipe_free((char *)data, dlen);
	return 0;
}

/* Read a token file: trimmed, non-empty, header-safe. */
int pk8s_token_file_read(char **out, const char *path, const char *where)
{
	char *text = NULL, *shown = pk8s_shown_path(path), *s, *e;
	size_t len = 0;
	bool nul;
	int rc;

	*out = NULL;
	rc = sbx_file_read(path, TOKEN_CAP, &text, &len);
	if (rc < 0) {
		rc = sbx_error_set(SBX_ERR_CONFIG, rc,
				   "%s: token file %s cannot be read: %s",
				   where, shown, pk8s_why(rc));
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
	else if (!pk8s_token_ok(s) || nul)
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "%s: token file %s contains spaces or "
				   "control characters", where, shown);
	else
		*out = sbx_xstrdup(s);
out:
	pk8s_wipe_free(text, len);
	free(shown);
	return rc;
}
