/* Layered configuration; see sbx/config.h. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/config.h"
#include "sbx/env.h"
#include "sbx/json.h"
#include "sbx/paths.h"
#include "sbx/xmalloc.h"

/*
 * The configuration vocabulary, not the compiled-in providers: a file that
 * names "modal" is valid even in a build without it; the provider registry
 * reports that later, when the provider is actually needed.
 */
static const char *const provider_names[] = {
	"local", "remote", "kubernetes", "modal", NULL,
};

const char *const *sbx_config_provider_names(void)
{
	return provider_names;
}

cJSON *sbx_config_defaults(void)
{
	cJSON *root = cJSON_CreateObject();
	cJSON *local = cJSON_CreateObject();

	if (!root || !local)
		abort();
	sbx_json_set_str(root, "provider", "local");
	sbx_json_set_str(root, "mount_root", "~/sbx");
	sbx_json_set_str(local, "isolation", "none");
	sbx_json_set_take(local, "network", cJSON_CreateBool(1));
	sbx_json_set_take(root, "local", local);
	return root;
}

/* JSON getters report SBX_ERR_JSON; in a config file it is a CONFIG error. */
static int reclass(int rc)
{
	char msg[sizeof(sbx_error_last()->msg)];

	if (rc >= 0 || sbx_error_last()->klass == SBX_ERR_CONFIG)
		return rc;
	memcpy(msg, sbx_error_last()->msg, sizeof(msg));
	return sbx_error_set(SBX_ERR_CONFIG, rc, "%s", msg);
}

int sbx_config_validate(const cJSON *layer, const char *source)
{
	const cJSON *local = NULL, *sec = NULL, *mount = NULL;
	const char *s = NULL;
	char where[320];
	bool b;
	int rc;

	if (!cJSON_IsObject(layer))
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s: configuration must be a JSON object, "
				     "not %s", source,
				     sbx_json_type_name(layer));
	rc = sbx_json_get_string(&s, layer, "provider", source);
	if (rc < 0)
		return reclass(rc);
	if (s) {
		size_t i;

		for (i = 0; provider_names[i]; i++)
			if (strcmp(s, provider_names[i]) == 0)
				break;
		if (!provider_names[i])
			return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					     "%s: \"provider\": unknown "
					     "provider '%s' (use local, remote, "
					     "kubernetes or modal)", source, s);
	}
	rc = sbx_json_get_string(&s, layer, "mount_root", source);
	if (rc < 0)
		return reclass(rc);
	if (s && !*s)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s: \"mount_root\" must not be empty",
				     source);
	for (size_t i = 0; provider_names[i]; i++) {
		rc = sbx_json_get_object(&sec, layer, provider_names[i],
					 source);
		if (rc < 0)
			return reclass(rc);
	}

	/* The repository keys of `sbx up` (docs/configuration.md). */
	rc = sbx_json_get_string(&s, layer, "ref", source);
	if (rc == 0)
		rc = sbx_json_get_bool(&b, layer, "carry_changes", false,
				       source);
	if (rc == 0)
		rc = sbx_json_get_bool(&b, layer, "no_repo", false, source);
	if (rc == 0) {
		long long depth;

		rc = sbx_json_get_int(&depth, layer, "depth", 0, source);
		if (rc == 0 && depth < 0)
			return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					     "%s: \"depth\" must be 0 (full "
					     "history) or a number of commits",
					     source);
	}
	if (rc < 0)
		return reclass(rc);

	rc = sbx_json_get_object(&mount, layer, "mount", source);
	if (rc < 0)
		return reclass(rc);
	if (mount) {
		snprintf(where, sizeof(where), "%s: mount", source);
		rc = sbx_json_get_bool(&b, mount, "allow_other", false, where);
		if (rc < 0)
			return reclass(rc);
	}

	rc = sbx_json_get_object(&local, layer, "local", source);
	if (rc < 0 || !local)
		return reclass(rc);
	snprintf(where, sizeof(where), "%s: local", source);
	rc = sbx_json_get_string(&s, local, "isolation", where);
	if (rc < 0)
		return reclass(rc);
	if (s && strcmp(s, "none") != 0 && strcmp(s, "bwrap") != 0)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s: \"isolation\" must be \"none\" or "
				     "\"bwrap\", not \"%s\"", where, s);
	rc = sbx_json_get_bool(&b, local, "network", true, where);
	return reclass(rc);
}

/*
 * Parse and validate one file layer and merge it into `cfg`.  `section`
 * selects a member ("sandbox" of opencode.json) instead of the whole file.
 * A missing optional file is skipped.
 */
static int merge_file(cJSON *cfg, const char *path, const char *section,
		      bool required)
{
	cJSON *doc = NULL;
	const cJSON *layer;
	char *source = NULL;
	int rc;

	rc = sbx_json_parse_file(&doc, path, SBX_JSON_FILE_CAP);
	if (rc == -ENOENT && sbx_error_last()->klass == SBX_ERR_OS) {
		sbx_error_clear();
		if (!required)
			return 0;
		return sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
				     "configuration file %s does not exist",
				     path);
	}
	if (rc < 0)
		return reclass(rc);
	layer = doc;
	if (section) {
		if (!cJSON_IsObject(doc)) {
			rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					   "%s: must be a JSON object", path);
			goto out;
		}
		layer = cJSON_GetObjectItemCaseSensitive(doc, section);
		if (!layer || cJSON_IsNull(layer)) {
			rc = 0;
			goto out;
		}
		source = sbx_xasprintf("%s: \"%s\"", path, section);
	}
	rc = sbx_config_validate(layer, source ? source : path);
	if (rc < 0)
		goto out;
	sbx_json_merge(cfg, layer);
out:
	free(source);
	cJSON_Delete(doc);
	return rc;
}

int sbx_config_load(cJSON **out, const struct sbx_config_opts *o)
{
	static const char *const opencode[] = {"opencode.json",
					       "opencode.jsonc"};
	cJSON *cfg = sbx_config_defaults();
	char *path = NULL, *top = NULL;
	const char *env;
	int rc;

	*out = NULL;
	if (!o->skip_user) {
		rc = sbx_paths_user_config(&path);
		if (rc < 0)
			goto out;
		rc = merge_file(cfg, path, NULL, false);
		if (rc < 0)
			goto out;
	}

	/* Outside a repository there is simply no opencode layer. */
	rc = sbx_paths_git_toplevel(&top, o->repo);
	if (rc < 0) {
		sbx_error_clear();
	} else {
		for (size_t i = 0; i < 2; i++) {
			free(path);
			path = sbx_xasprintf("%s/%s", top, opencode[i]);
			rc = merge_file(cfg, path, "sandbox", false);
			if (rc < 0)
				goto out;
		}
	}

	env = sbx_env_str("SBX_CONFIG");
	if (env) {
		rc = merge_file(cfg, env, NULL, true);
		if (rc < 0) {
			rc = sbx_error_prefix(rc, "$SBX_CONFIG");
			goto out;
		}
	}
	if (o->config_file) {
		rc = merge_file(cfg, o->config_file, NULL, true);
		if (rc < 0) {
			rc = sbx_error_prefix(rc, "--config");
			goto out;
		}
	}
	if (o->flags) {
		rc = sbx_config_validate(o->flags, "command line");
		if (rc < 0)
			goto out;
		sbx_json_merge(cfg, o->flags);
	}
	*out = cfg;
	cfg = NULL;
	rc = 0;
out:
	free(top);
	free(path);
	cJSON_Delete(cfg);
	return rc;
}

const char *sbx_config_provider(const cJSON *cfg)
{
	const char *s = sbx_json_str(cfg, "provider");

	return s ? s : "local";
}

const cJSON *sbx_config_section(const cJSON *cfg, const char *name)
{
	const cJSON *sec;

	if (!name)
		return NULL;
	sec = cJSON_GetObjectItemCaseSensitive(cfg, name);
	return cJSON_IsObject(sec) ? sec : NULL;
}

bool sbx_config_allow_other(const cJSON *cfg)
{
	const cJSON *mount = cJSON_GetObjectItemCaseSensitive(cfg, "mount");

	return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(mount,
							     "allow_other"));
}

int sbx_config_mount_root(char **out, const cJSON *cfg)
{
	const char *root = sbx_env_or("SBX_MOUNT_ROOT",
				      sbx_json_str(cfg, "mount_root"));

	if (!root || !*root)
		root = "~/sbx";
	return sbx_path_expand_user(out, root);
}
