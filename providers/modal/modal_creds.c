/*
 * Modal credentials from the environment and ~/.modal.toml; see
 * modal_creds.h.
 */
#include "config.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sbx/xmalloc.h"

#include "modal_creds.h"
#include "toml_min.h"

static const char *env(const char *name)
{
	const char *v = getenv(name);

	return v && *v ? v : NULL;
}

static void wipe_free(char *s)
{
	if (!s)
		return;
	memset(s, 0, strlen(s));
	free(s);
}

/* The profile table to use, or NULL (none chosen: no error). */
static int pick_profile(const struct toml_min_table **out,
			const struct toml_min_doc *doc, const char *path)
{
	const char *want = env("MODAL_PROFILE");
	const struct toml_min_table *only = NULL;
	size_t nprof = 0;

	*out = NULL;
	if (want) {
		*out = toml_min_table(doc, want);
		if (!*out || !*want)
			return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					     "Modal profile \"%s\" (from "
					     "MODAL_PROFILE) is not in %s; "
					     "fix MODAL_PROFILE or run `modal "
					     "profile list`", want, path);
		return 0;
	}
	for (size_t i = 1; i < doc->ntables; i++) {
		const struct toml_min_kv *a =
			toml_min_get(&doc->tables[i], "active");

		nprof++;
		only = &doc->tables[i];
		if (a && a->type == TOML_MIN_BOOL && a->b) {
			*out = &doc->tables[i];
			return 0;
		}
	}
	if (nprof == 1)
		*out = only;
	else if (nprof > 1)
		*out = toml_min_table(doc, "default");
	return 0;
}

/* A string key of the profile, copied into *dst unless already set. */
static int take_str(char **dst, const struct toml_min_table *t,
		    const char *key, const char *path)
{
	const struct toml_min_kv *kv = toml_min_get(t, key);

	if (!kv || *dst)
		return 0;
	if (kv->type != TOML_MIN_STRING)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s:%d: \"%s\" of profile \"%s\" must "
				     "be a string", path, kv->line, key,
				     t->name);
	if (*kv->str)
		*dst = sbx_xstrdup(kv->str);
	return 0;
}

int sbx_modal_creds_load(struct sbx_modal_creds *out)
{
	struct toml_min_doc doc = {0};
	const struct toml_min_table *prof = NULL;
	const char *home = getenv("HOME");
	char *path = NULL;
	bool have_file = false, id_env, secret_env;
	int rc;

	memset(out, 0, sizeof(*out));
	if (env("MODAL_TOKEN_ID"))
		out->token_id = sbx_xstrdup(env("MODAL_TOKEN_ID"));
	if (env("MODAL_TOKEN_SECRET"))
		out->token_secret = sbx_xstrdup(env("MODAL_TOKEN_SECRET"));
	if (env("MODAL_ENVIRONMENT"))
		out->environment = sbx_xstrdup(env("MODAL_ENVIRONMENT"));
	if (env("MODAL_SERVER_URL"))
		out->server_url = sbx_xstrdup(env("MODAL_SERVER_URL"));
	id_env = out->token_id;
	secret_env = out->token_secret;

	if (env("MODAL_CONFIG_PATH"))
		path = sbx_xstrdup(env("MODAL_CONFIG_PATH"));
	else if (home && *home)
		path = sbx_xasprintf("%s/.modal.toml", home);

	if (path) {
		rc = toml_min_parse_file(&doc, path);
		if (rc == -ENOENT) {
			sbx_error_clear();
		} else if (rc < 0) {
			rc = sbx_error_prefix(rc, "reading Modal credentials");
			goto out;
		} else {
			have_file = true;
		}
	}
	if (have_file) {
		rc = pick_profile(&prof, &doc, path);
		if (rc < 0)
			goto out;
	} else if (env("MODAL_PROFILE")) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "MODAL_PROFILE is \"%s\" but there is no "
				   "Modal config file (%s); run `modal token "
				   "new` or unset MODAL_PROFILE",
				   env("MODAL_PROFILE"),
				   path ? path : "HOME is not set");
		goto out;
	}
	if (prof) {
		out->profile = sbx_xstrdup(prof->name);
		if ((rc = take_str(&out->token_id, prof, "token_id", path)) < 0 ||
		    (rc = take_str(&out->token_secret, prof, "token_secret",
				   path)) < 0 ||
		    (rc = take_str(&out->environment, prof, "environment",
				   path)) < 0 ||
		    (rc = take_str(&out->server_url, prof, "server_url",
				   path)) < 0)
			goto out;
	}

	if (!out->token_id || !out->token_secret) {
		const char *missing = !out->token_id && !out->token_secret
					      ? "token_id and token_secret"
				      : !out->token_id ? "token_id"
						       : "token_secret";

		if (prof)
			rc = sbx_error_set(SBX_ERR_CONFIG, -EACCES,
					   "no Modal token: profile \"%s\" in "
					   "%s has no %s and MODAL_TOKEN_ID/"
					   "MODAL_TOKEN_SECRET are not set; "
					   "run `modal token new` or set "
					   "MODAL_TOKEN_ID and "
					   "MODAL_TOKEN_SECRET", prof->name,
					   path, missing);
		else if (have_file)
			rc = sbx_error_set(SBX_ERR_CONFIG, -EACCES,
					   "no Modal token: %s has several "
					   "profiles and none is active (and "
					   "none is named \"default\"), and "
					   "MODAL_TOKEN_ID/MODAL_TOKEN_SECRET "
					   "are not both set; set "
					   "MODAL_PROFILE, run `modal profile "
					   "activate`, or set MODAL_TOKEN_ID "
					   "and MODAL_TOKEN_SECRET", path);
		else
			rc = sbx_error_set(SBX_ERR_CONFIG, -EACCES,
					   "no Modal token: MODAL_TOKEN_ID/"
					   "MODAL_TOKEN_SECRET are not both "
					   "set and there is no config file "
					   "(%s); run `modal token new` or set "
					   "MODAL_TOKEN_ID and "
					   "MODAL_TOKEN_SECRET",
					   path ? path : "HOME is not set");
		goto out;
	}
	if (!out->server_url)
		out->server_url = sbx_xstrdup(MODAL_DEFAULT_SERVER_URL);
	if (id_env && secret_env)
		out->source = sbx_xstrdup("environment");
	else if (id_env || secret_env)
		out->source = sbx_xasprintf("environment and %s (profile "
					    "\"%s\")", path, prof->name);
	else
		out->source = sbx_xasprintf("%s (profile \"%s\")", path,
					    prof->name);
	rc = 0;
out:
	toml_min_fini(&doc);
	free(path);
	return rc;
}

void sbx_modal_creds_fini(struct sbx_modal_creds *c)
{
	if (!c)
		return;
	wipe_free(c->token_id);
	wipe_free(c->token_secret);
	free(c->environment);
	free(c->server_url);
	free(c->profile);
	free(c->source);
	memset(c, 0, sizeof(*c));
}
