/* Pin files, the snapshot store, failure reports; see pcommon.h. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/xmalloc.h"

#include "pcommon.h"

#define PIN_MAX (1u << 20)

/* ---- pins ------------------------------------------------------------------ */

int pcommon_pin_path(char **out, const char *provider, const char *session)
{
	return sbx_paths_session_file(out, provider, session, ".json");
}

int pcommon_pin_load(cJSON **out, const char *provider, const char *session)
{
	char *path = NULL;
	int rc;

	*out = NULL;
	rc = pcommon_pin_path(&path, provider, session);
	if (rc < 0)
		return rc;
	rc = sbx_json_parse_file(out, path, PIN_MAX);
	if (rc == -ENOENT) {
		sbx_error_clear();
		rc = 0;
	} else if (rc == 0 && !cJSON_IsObject(*out)) {
		cJSON_Delete(*out);
		*out = NULL;
		rc = sbx_error_set(SBX_ERR_JSON, -EINVAL,
				   "%s: not a JSON object; remove the file to "
				   "find the sandbox by its labels", path);
	}
	free(path);
	return rc;
}

int pcommon_pin_save(const char *provider, const char *session,
		     const cJSON *pin)
{
	char *path = NULL, *text = sbx_json_print(pin, true);
	int rc = pcommon_pin_path(&path, provider, session);

	if (rc == 0)
		rc = sbx_file_write_atomic(path, text, strlen(text), 0600);
	pcommon_wipe_free(text); /* a pin may hold a token */
	free(path);
	return rc;
}

void pcommon_pin_remove(const char *provider, const char *session)
{
	char *path = NULL;

	if (pcommon_pin_path(&path, provider, session) == 0 &&
	    unlink(path) < 0 && errno != ENOENT)
		sbx_warn("could not remove %s: %s", path, strerror(errno));
	sbx_error_clear();
	free(path);
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

static int by_name_desc(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*b)->d_name, (*a)->d_name);
}

/* $SBX_HOME/<sub> without creating it (NULL-free on -ENOENT-ish). */
static int home_join(char **out, const char *sub)
{
	char *home = NULL;
	int rc = sbx_paths_home(&home);

	*out = NULL;
	if (rc < 0)
		return rc;
	*out = sbx_xasprintf("%s/%s", home, sub);
	free(home);
	return 0;
}

int pcommon_pin_each(const char *provider, pcommon_pin_cb cb, void *payload)
{
	struct dirent **ents = NULL;
	char *dir = NULL;
	int n, rc = home_join(&dir, provider);

	if (rc < 0)
		return rc;
	n = scandir(dir, &ents, NULL, by_name);
	if (n < 0) {
		rc = errno == ENOENT ? 0 : sbx_error_os("pins: %s", dir);
		free(dir);
		return rc;
	}
	for (int i = 0; i < n; i++) {
		const char *name = ents[i]->d_name;
		size_t l = strlen(name);

		if (rc == 0 && l > 5 && !strcmp(name + l - 5, ".json")) {
			char *sess = sbx_xstrndup(name, l - 5);
			cJSON *pin = NULL;

			if (sbx_name_validate(sess) == 0 &&
			    pcommon_pin_load(&pin, provider, sess) == 0 && pin)
				rc = cb(sess, pin, payload);
			sbx_error_clear();
			cJSON_Delete(pin);
			free(sess);
		}
		free(ents[i]);
	}
	free(ents);
	free(dir);
	return rc;
}

/* ---- the snapshot store ---------------------------------------------------- */

void pcommon_snap_new_id(char out[40], time_t now)
{
	char stamp[32], r[5];
	struct tm tm;

	gmtime_r(&now, &tm);
	strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
	pcommon_random_hex(r, 2);
	snprintf(out, 40, "%s-%s", stamp, r);
}

/* Split "OTHER/ID" (or "ID"): *sess malloc'd, *bare points into id. */
static int snap_split(char **sess, const char **bare, const char *session,
		      const char *id)
{
	const char *slash = strchr(id, '/');

	*sess = slash ? sbx_xstrndup(id, (size_t)(slash - id))
		      : sbx_xstrdup(session);
	*bare = slash ? slash + 1 : id;
	if (!**bare || strchr(*bare, '/') || (*bare)[0] == '.' ||
	    sbx_name_validate(*sess) < 0) {
		sbx_error_clear();
		free(*sess);
		*sess = NULL;
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "bad snapshot id '%s' (use an id from "
				     "`sbx snapshots`, or SESSION/ID)", id);
	}
	return 0;
}

static char *snap_sub(const char *provider, const char *session)
{
	return sbx_xasprintf("%s/snapshots/%s", provider, session);
}

int pcommon_snap_file(char **out, const char *provider, const char *session,
		      const char *id, const char *ext, bool create)
{
	char *sess = NULL, *sub, *dir = NULL;
	const char *bare;
	int rc;

	*out = NULL;
	rc = snap_split(&sess, &bare, session, id);
	if (rc < 0)
		return rc;
	sub = snap_sub(provider, sess);
	rc = home_join(&dir, sub);
	if (rc == 0 && create)
		rc = sbx_paths_mkdir_p(dir, 0700);
	if (rc == 0)
		*out = sbx_xasprintf("%s/%s%s", dir, bare, ext);
	free(dir);
	free(sub);
	free(sess);
	return rc;
}

int pcommon_snap_record(const char *provider, const char *session,
			const char *id, const char *message, time_t created,
			const cJSON *fields)
{
	cJSON *j = cJSON_CreateObject();
	const cJSON *f;
	char when[40], *text, *path = NULL;
	int rc;

	if (!j)
		abort();
	sbx_json_set_str(j, "id", id);
	sbx_json_set_str(j, "session", session);
	sbx_json_set_str(j, "message", message ? message : "");
	sbx_json_set_str(j, "created_at",
			 sbx_json_time_format(when, sizeof(when), created));
	cJSON_ArrayForEach(f, fields) {
		cJSON *dup = cJSON_Duplicate(f, 1);

		if (!dup)
			abort();
		sbx_json_set_take(j, f->string, dup);
	}
	text = sbx_json_print(j, true);
	cJSON_Delete(j);
	rc = pcommon_snap_file(&path, provider, session, id, ".json", true);
	if (rc == 0)
		rc = sbx_file_write_atomic(path, text, strlen(text), 0600);
	free(text);
	free(path);
	return rc;
}

int pcommon_snap_read(cJSON **out, const char *provider, const char *session,
		      const char *id)
{
	char *path = NULL;
	int rc;

	*out = NULL;
	rc = pcommon_snap_file(&path, provider, session, id, ".json", false);
	if (rc == 0)
		rc = sbx_json_parse_file(out, path, PIN_MAX);
	if (rc == -ENOENT)
		rc = sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT,
				   "no snapshot '%s' of session %s (see `sbx "
				   "snapshots %s`)", id, session, session);
	free(path);
	return rc;
}

int pcommon_snap_list(const char *provider, const char *session,
		      sbx_snapshot_cb cb, void *payload)
{
	struct dirent **ents = NULL;
	char *sub = snap_sub(provider, session), *dir = NULL;
	int n, rc = home_join(&dir, sub);

	free(sub);
	if (rc < 0)
		return rc;
	n = scandir(dir, &ents, NULL, by_name_desc);
	if (n < 0) {
		/* Never snapshotted: nothing to list, nothing to create. */
		rc = errno == ENOENT ? 0
				     : sbx_error_os("snapshots of %s: %s",
						    session, dir);
		free(dir);
		return rc;
	}
	for (int i = 0; i < n; i++) {
		const char *name = ents[i]->d_name;
		size_t l = strlen(name);

		if (rc == 0 && l > 5 && !strcmp(name + l - 5, ".json")) {
			char *path = sbx_xasprintf("%s/%s", dir, name);
			cJSON *j = NULL;

			if (sbx_json_parse_file(&j, path, PIN_MAX) == 0 &&
			    sbx_json_str(j, "id")) {
				struct sbx_snapshot_info si = {
					.id = sbx_json_str(j, "id"),
					.message = sbx_json_str(j, "message"),
				};
				const char *t = sbx_json_str(j, "created_at");

				if (t && sbx_json_time_parse(&si.created_at,
							     t) < 0)
					si.created_at = 0;
				rc = cb(&si, payload);
			}
			sbx_error_clear();
			cJSON_Delete(j);
			free(path);
		}
		free(ents[i]);
	}
	free(ents);
	free(dir);
	return rc < 0 ? rc : 0;
}

void pcommon_snap_prune(const char *provider, const char *session)
{
	char *sub = snap_sub(provider, session), *dir = NULL;

	if (home_join(&dir, sub) == 0)
		(void)rmdir(dir); /* only when empty; ENOENT/ENOTEMPTY fine */
	sbx_error_clear();
	free(dir);
	free(sub);
}

/* ---- what the user is told --------------------------------------------------- */

void pcommon_report_nothing_saved(const char *session, const char *what,
				  const char *why)
{
	fprintf(stderr, "sbx: %s of session %s is not running%s%s: there is "
		"nothing to save (its files ended with it); deleting it\n",
		what, session, why && *why ? ": " : "", why ? why : "");
}

void pcommon_report_log_tail(const char *what, const char *log,
			     int max_lines)
{
	const char *start, *end;
	int lines = 0;

	if (!log || !*log)
		return;
	end = log + strlen(log);
	while (end > log && (end[-1] == '\n' || end[-1] == '\r'))
		end--;
	if (end == log)
		return;
	start = end;
	while (start > log && lines < max_lines) {
		start--;
		if (*start == '\n' && ++lines == max_lines) {
			start++;
			break;
		}
	}
	fprintf(stderr, "sbx: last lines of the log of %s:\n", what);
	while (start < end) {
		const char *nl = memchr(start, '\n', (size_t)(end - start));
		size_t n = nl ? (size_t)(nl - start) : (size_t)(end - start);

		fprintf(stderr, "sbx: | %.*s\n", (int)n, start);
		start += n + (nl ? 1 : 0);
	}
}

void pcommon_info_failed(struct sbx_sandbox_info *info, const char *reason,
			 bool gone, const char *message)
{
	info->state = SBX_STATE_ERROR;
	if (!info->extra) {
		info->extra = cJSON_CreateObject();
		if (!info->extra)
			abort();
	}
	sbx_json_set_str(info->extra, "error", message);
	if (reason)
		sbx_json_set_str(info->extra, "error_reason", reason);
	sbx_json_set_take(info->extra, "gone", cJSON_CreateBool(gone));
}
