/* Configuration checking, identity and random ids; see pcommon.h. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/hashmap.h"
#include "sbx/paths.h"

#include "pcommon.h"

int pcommon_cfg_bad(const char *section, const char *key, const char *want)
{
	return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
			     "configuration \"%s\": \"%s\" must be %s", section,
			     key, want);
}

int pcommon_cfg_object(const char *section, const cJSON *sec)
{
	if (sec && !cJSON_IsObject(sec))
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "configuration \"%s\" must be an object",
				     section);
	return 0;
}

static const cJSON *item(const cJSON *sec, const char *key)
{
	const cJSON *v = sec ? cJSON_GetObjectItemCaseSensitive(sec, key)
			     : NULL;

	return v && !cJSON_IsNull(v) ? v : NULL;
}

int pcommon_cfg_str(const char *section, const cJSON *sec, const char *key,
		    const char **out, const char *dflt)
{
	const cJSON *v = item(sec, key);

	*out = dflt;
	if (!v)
		return 0;
	if (!cJSON_IsString(v) || !*v->valuestring)
		return pcommon_cfg_bad(section, key, "a non-empty string");
	*out = v->valuestring;
	return 0;
}

int pcommon_cfg_long(const char *section, const cJSON *sec, const char *key,
		     long *out, long dflt, long min, long max)
{
	const cJSON *v = item(sec, key);

	*out = dflt;
	if (!v)
		return 0;
	if (!cJSON_IsNumber(v) || v->valuedouble < (double)min ||
	    v->valuedouble > (double)max ||
	    v->valuedouble != (double)(long)v->valuedouble)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "configuration \"%s\": \"%s\" must be a "
				     "whole number from %ld to %ld", section,
				     key, min, max);
	*out = (long)v->valuedouble;
	return 0;
}

int pcommon_cfg_num(const char *section, const cJSON *sec, const char *key,
		    double *out, double dflt, double min, double max)
{
	const cJSON *v = item(sec, key);

	*out = dflt;
	if (!v)
		return 0;
	if (!cJSON_IsNumber(v) || v->valuedouble < min || v->valuedouble > max)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "configuration \"%s\": \"%s\" must be a "
				     "number from %g to %g", section, key, min,
				     max);
	*out = v->valuedouble;
	return 0;
}

int pcommon_cfg_bool(const char *section, const cJSON *sec, const char *key,
		     bool *out, bool dflt)
{
	const cJSON *v = item(sec, key);

	*out = dflt;
	if (!v)
		return 0;
	if (!cJSON_IsBool(v))
		return pcommon_cfg_bad(section, key, "true or false");
	*out = cJSON_IsTrue(v);
	return 0;
}

int pcommon_cfg_json(const char *section, const cJSON *sec, const char *key,
		     const cJSON **out, bool array)
{
	const cJSON *v = item(sec, key);

	*out = NULL;
	if (!v)
		return 0;
	if (array ? !cJSON_IsArray(v) : !cJSON_IsObject(v))
		return pcommon_cfg_bad(section, key,
				       array ? "a list" : "an object");
	*out = v;
	return 0;
}

int pcommon_cfg_strings(const char *section, const cJSON *sec,
			const char *key, const cJSON **out)
{
	const cJSON *v;
	int rc = pcommon_cfg_json(section, sec, key, out, true);

	if (rc < 0 || !*out)
		return rc;
	cJSON_ArrayForEach(v, *out) {
		if (!cJSON_IsString(v) || !*v->valuestring) {
			*out = NULL;
			return pcommon_cfg_bad(section, key,
					       "a list of non-empty strings");
		}
	}
	return 0;
}

bool pcommon_env_reserved(const char *name)
{
	return !strncmp(name, "SBX_", 4);
}

/* Kubernetes' rule (IsEnvVarName): [-._a-zA-Z0-9]+, not a digit first. */
static bool env_name_ok(const char *n)
{
	if (!*n || isdigit((unsigned char)*n))
		return false;
	for (; *n; n++)
		if (!isalnum((unsigned char)*n) && !strchr("-._", *n))
			return false;
	return true;
}

int pcommon_cfg_env(const char *section, const cJSON *sec, const char *key,
		    const cJSON **out)
{
	const cJSON *v;
	int rc = pcommon_cfg_json(section, sec, key, out, false);

	if (rc < 0 || !*out)
		return rc;
	cJSON_ArrayForEach(v, *out) {
		if (!cJSON_IsString(v)) {
			*out = NULL;
			return pcommon_cfg_bad(section, key,
					       "an object of strings");
		}
		if (!env_name_ok(v->string)) {
			*out = NULL;
			return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					     "configuration \"%s\": \"%s\": "
					     "\"%s\" is not a valid environment "
					     "variable name", section, key,
					     v->string);
		}
		if (pcommon_env_reserved(v->string)) {
			*out = NULL;
			return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					     "configuration \"%s\": \"%s\": %s "
					     "is reserved (sbx sets the SBX_* "
					     "variables of a sandbox itself); "
					     "choose another name", section,
					     key, v->string);
		}
	}
	return 0;
}

void pcommon_hash_hex(char out[17], const char *a, const char *b)
{
	/* The hex names things on disk and in clusters: it must not change. */
	uint64_t h = sbx_fnv1a(a, strlen(a) + 1); /* with the NUL */

	if (b)
		h = sbx_fnv1a_more(h, b, strlen(b));
	snprintf(out, 17, "%016llx", (unsigned long long)h);
}

int pcommon_home_id(char out[17])
{
	char *home = NULL;
	char host[256] = "";
	int rc = sbx_paths_home(&home);

	if (rc < 0)
		return rc;
	gethostname(host, sizeof(host) - 1);
	pcommon_hash_hex(out, host, home);
	free(home);
	return 0;
}

void pcommon_random_hex(char *out, size_t bytes)
{
	unsigned char r[32];
	size_t got = 0;

	if (bytes > sizeof(r))
		abort(); /* a bug */
	while (got < bytes) {
		ssize_t n = getrandom(r + got, bytes - got, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			abort(); /* the kernel's CSPRNG does not fail */
		got += (size_t)n;
	}
	for (size_t i = 0; i < bytes; i++)
		snprintf(out + 2 * i, 3, "%02x", r[i]);
	out[2 * bytes] = '\0';
	explicit_bzero(r, sizeof(r));
}

void pcommon_wipe_free(char *s)
{
	if (!s)
		return;
	explicit_bzero(s, strlen(s));
	free(s);
}
