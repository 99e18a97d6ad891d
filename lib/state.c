/* Session state store; see sbx/state.h. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/paths.h"
#include "sbx/state.h"
#include "sbx/xmalloc.h"

#define LOCK_POLL_MS 50

/* The one table of state names (sbx/sessionstate.h). */
static const char *const state_names[] = {
	[SBX_STATE_CREATING] = "creating",
	[SBX_STATE_READY] = "ready",
	[SBX_STATE_STOPPED] = "stopped",
	[SBX_STATE_ERROR] = "error",
};

#define N_STATES (sizeof(state_names) / sizeof(state_names[0]))

const char *sbx_state_name(enum sbx_state s)
{
	return (unsigned)s < N_STATES ? state_names[s]
				      : state_names[SBX_STATE_ERROR];
}

enum sbx_state sbx_state_parse(const char *name)
{
	for (unsigned i = 0; name && i < N_STATES; i++)
		if (strcmp(name, state_names[i]) == 0)
			return (enum sbx_state)i;
	return SBX_STATE_ERROR;
}

void sbx_session_init(struct sbx_session *s)
{
	memset(s, 0, sizeof(*s));
}

void sbx_session_fini(struct sbx_session *s)
{
	if (!s)
		return;
	free(s->session);
	free(s->provider);
	free(s->sandbox_id);
	free(s->mountpoint);
	free(s->workdir);
	free(s->repo);
	cJSON_Delete(s->provider_config);
	free(s->control_socket);
	free(s->isolation);
	free(s->error_type);
	free(s->error_message);
	memset(s, 0, sizeof(*s));
}

void sbx_session_set_error(struct sbx_session *s, const char *type,
			   const char *message)
{
	free(s->error_type);
	free(s->error_message);
	s->error_type = type ? sbx_xstrdup(type) : NULL;
	s->error_message = type ? sbx_xstrdup(message ? message : "") : NULL;
}

void sbx_session_json_common(cJSON *j, const struct sbx_session *s)
{
	char when[32];

	sbx_json_set_str(j, "session", s->session);
	sbx_json_set_str(j, "provider", s->provider);
	sbx_json_set_str(j, "sandbox_id", s->sandbox_id);
	sbx_json_set_str(j, "state", sbx_state_name(s->state));
	sbx_json_set_take(j, "remote", cJSON_CreateBool(s->remote));
	sbx_json_set_str(j, "mountpoint", s->mountpoint);
	sbx_json_set_str(j, "workdir", s->workdir);
	sbx_json_set_str(j, "created_at",
			 s->created_at ? sbx_json_time_format(when,
							      sizeof(when),
							      s->created_at)
				       : NULL);
}

cJSON *sbx_session_to_json(const struct sbx_session *s)
{
	cJSON *j = cJSON_CreateObject();

	if (!j)
		abort();
	sbx_json_set_take(j, "version", cJSON_CreateNumber(1));
	sbx_session_json_common(j, s);
	sbx_json_set_str(j, "repo", s->repo);
	sbx_json_set_take(j, "provider_config",
			  s->provider_config
				  ? cJSON_Duplicate(s->provider_config, 1)
				  : cJSON_CreateObject());
	sbx_json_set_take(j, "pid", cJSON_CreateNumber((double)s->pid));
	sbx_json_set_str(j, "control_socket", s->control_socket);
	sbx_json_set_str(j, "isolation", s->isolation);
	if (s->allow_other)
		sbx_json_set_take(j, "allow_other", cJSON_CreateBool(1));
	if (s->error_type) {
		cJSON *e = cJSON_CreateObject();

		sbx_json_set_str(e, "type", s->error_type);
		sbx_json_set_str(e, "message", s->error_message);
		sbx_json_set_take(j, "error", e);
	}
	return j;
}

static char *dup_or_null(const char *s)
{
	return s ? sbx_xstrdup(s) : NULL;
}

int sbx_session_from_json(struct sbx_session *out, const cJSON *j,
			  const char *source)
{
	const char *session, *provider, *sid, *state, *mp, *wd, *repo, *when;
	const char *sock, *iso, *etype = NULL, *emsg = NULL;
	const cJSON *pcfg, *err;
	long long pid;
	bool remote, allow_other;
	int rc;

	sbx_session_init(out);
	if (!cJSON_IsObject(j))
		return sbx_error_set(SBX_ERR_JSON, -EINVAL,
				     "%s: session state must be an object",
				     source);
	if ((rc = sbx_json_get_string(&session, j, "session", source)) < 0 ||
	    (rc = sbx_json_get_string(&provider, j, "provider", source)) < 0 ||
	    (rc = sbx_json_get_string(&sid, j, "sandbox_id", source)) < 0 ||
	    (rc = sbx_json_get_string(&state, j, "state", source)) < 0 ||
	    (rc = sbx_json_get_bool(&remote, j, "remote", false, source)) <
		    0 ||
	    (rc = sbx_json_get_string(&mp, j, "mountpoint", source)) < 0 ||
	    (rc = sbx_json_get_string(&wd, j, "workdir", source)) < 0 ||
	    (rc = sbx_json_get_string(&repo, j, "repo", source)) < 0 ||
	    (rc = sbx_json_get_string(&when, j, "created_at", source)) < 0 ||
	    (rc = sbx_json_get_object(&pcfg, j, "provider_config", source)) <
		    0 ||
	    (rc = sbx_json_get_int(&pid, j, "pid", 0, source)) < 0 ||
	    (rc = sbx_json_get_string(&sock, j, "control_socket", source)) <
		    0 ||
	    (rc = sbx_json_get_string(&iso, j, "isolation", source)) < 0 ||
	    (rc = sbx_json_get_bool(&allow_other, j, "allow_other", false,
				    source)) < 0 ||
	    (rc = sbx_json_get_object(&err, j, "error", source)) < 0)
		return rc;
	if (err && ((rc = sbx_json_get_string(&etype, err, "type", source)) <
			    0 ||
		    (rc = sbx_json_get_string(&emsg, err, "message", source)) <
			    0))
		return rc;
	if (!session || !provider)
		return sbx_error_set(SBX_ERR_JSON, -EINVAL,
				     "%s: \"session\" and \"provider\" are "
				     "required", source);
	if (pid < 0 || pid > 0x3fffffff)
		return sbx_error_set(SBX_ERR_JSON, -EINVAL,
				     "%s: bad \"pid\" %lld", source, pid);

	out->state = sbx_state_parse(state);
	if (when) {
		rc = sbx_json_time_parse(&out->created_at, when);
		if (rc < 0)
			return sbx_error_prefix(rc, "%s", source);
	}
	out->session = sbx_xstrdup(session);
	out->provider = sbx_xstrdup(provider);
	out->sandbox_id = dup_or_null(sid);
	out->remote = remote;
	out->mountpoint = dup_or_null(mp);
	out->workdir = dup_or_null(wd);
	out->repo = dup_or_null(repo);
	out->provider_config = pcfg ? cJSON_Duplicate(pcfg, 1) : NULL;
	out->pid = (pid_t)pid;
	out->control_socket = dup_or_null(sock);
	out->isolation = dup_or_null(iso);
	out->allow_other = allow_other;
	if (etype)
		sbx_session_set_error(out, etype, emsg);
	return 0;
}

int sbx_state_load(struct sbx_session *out, const char *name)
{
	cJSON *j = NULL;
	char *path = NULL;
	int rc;

	sbx_session_init(out);
	rc = sbx_paths_session_file(&path, "sessions", name, ".json");
	if (rc < 0)
		return rc;
	rc = sbx_json_parse_file(&j, path, SBX_JSON_FILE_CAP);
	if (rc == -ENOENT) {
		rc = sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT,
				   "no session %s (see `sbx ls`)", name);
		goto out;
	}
	if (rc < 0)
		goto out;
	rc = sbx_session_from_json(out, j, path);
	if (rc < 0) {
		sbx_session_fini(out);
		goto out;
	}
	if (strcmp(out->session, name) != 0) {
		rc = sbx_error_set(SBX_ERR_JSON, -EINVAL,
				   "%s: records session '%s', not '%s'", path,
				   out->session, name);
		sbx_session_fini(out);
	}
out:
	cJSON_Delete(j);
	free(path);
	return rc;
}

int sbx_state_save(const struct sbx_session *s)
{
	char *path = NULL, *text = NULL;
	cJSON *j = NULL;
	int rc;

	rc = sbx_paths_session_file(&path, "sessions", s->session, ".json");
	if (rc < 0)
		return rc;
	j = sbx_session_to_json(s);
	text = sbx_json_print(j, true);
	{
		/* Newline-terminated, as text files should be. */
		char *nl = sbx_xasprintf("%s\n", text);

		free(text);
		text = nl;
	}
	rc = sbx_file_write_atomic(path, text, strlen(text), 0600);
	if (rc < 0)
		rc = sbx_error_prefix(rc, "save session %s", s->session);
	free(text);
	cJSON_Delete(j);
	free(path);
	return rc;
}

int sbx_state_remove(const char *name)
{
	char *path = NULL;
	int rc;

	rc = sbx_paths_session_file(&path, "sessions", name, ".json");
	if (rc < 0)
		return rc;
	if (unlink(path) < 0 && errno != ENOENT)
		rc = sbx_error_os("remove %s", path);
	free(path);
	return rc;
}

bool sbx_state_exists(const char *name)
{
	char *path = NULL;
	bool ok;

	if (sbx_paths_session_file(&path, "sessions", name, ".json") < 0) {
		sbx_error_clear();
		return false;
	}
	ok = access(path, F_OK) == 0;
	free(path);
	return ok;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

void sbx_state_names_free(char **names, size_t n)
{
	for (size_t i = 0; names && i < n; i++)
		free(names[i]);
	free(names);
}

int sbx_state_list(char ***names_out, size_t *n_out)
{
	char *dir = NULL, **names = NULL;
	size_t n = 0, alloc = 0;
	struct dirent *de;
	DIR *d = NULL;
	int rc;

	*names_out = NULL;
	*n_out = 0;
	rc = sbx_paths_subdir(&dir, "sessions");
	if (rc < 0)
		return rc;
	d = opendir(dir);
	if (!d) {
		rc = sbx_error_os("open %s", dir);
		goto out;
	}
	while ((errno = 0, de = readdir(d))) {
		size_t len = strlen(de->d_name);
		char *name;

		if (len <= 5 || strcmp(de->d_name + len - 5, ".json") != 0)
			continue;
		name = sbx_xstrndup(de->d_name, len - 5);
		/* Skip temp files and anything we would not have written. */
		if (sbx_name_validate(name) < 0) {
			sbx_error_clear();
			free(name);
			continue;
		}
		if (n == alloc) {
			alloc = alloc ? alloc * 2 : 16;
			names = sbx_xrealloc(names, alloc * sizeof(*names));
		}
		names[n++] = name;
	}
	if (errno) {
		rc = sbx_error_os("read %s", dir);
		goto out;
	}
	if (n)
		qsort(names, n, sizeof(*names), cmp_names);
	*names_out = names;
	*n_out = n;
	names = NULL;
	n = 0;
	rc = 0;
out:
	sbx_state_names_free(names, n);
	if (d)
		closedir(d);
	free(dir);
	return rc;
}

int sbx_state_lock(int *fd_out, const char *name, bool exclusive,
		   int timeout_ms)
{
	struct timespec start, now, nap = {0, LOCK_POLL_MS * 1000000L};
	char *path = NULL;
	int fd = -1, rc;

	*fd_out = -1;
	rc = sbx_paths_session_file(&path, "sessions", name, ".lock");
	if (rc < 0)
		return rc;
	clock_gettime(CLOCK_MONOTONIC, &start);
again:
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOCTTY, 0600);
	if (fd < 0) {
		rc = sbx_error_os("open lock file %s", path);
		goto out;
	}
	/*
	 * Poll with LOCK_NB instead of blocking with an alarm: no signal
	 * handlers to install, and the wait is bounded exactly.
	 */
	for (;;) {
		long elapsed;

		if (flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0)
			break;
		if (errno == EINTR)
			continue;
		if (errno != EWOULDBLOCK) {
			rc = sbx_error_os("lock %s", path);
			goto out;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		elapsed = (now.tv_sec - start.tv_sec) * 1000L +
			  (now.tv_nsec - start.tv_nsec) / 1000000L;
		if (timeout_ms >= 0 && elapsed >= timeout_ms) {
			rc = sbx_error_set(SBX_ERR_STATE, -EBUSY,
					   "another sbx command is working on "
					   "session %s (lock %s is held); wait "
					   "for it to finish and try again",
					   name, path);
			goto out;
		}
		nanosleep(&nap, NULL);
	}
	/*
	 * The holder we waited for may have removed the lock file
	 * (sbx_state_unlock_forget()): then this lock is on a file nobody
	 * else will open.  Lock the one at the path instead.
	 */
	{
		struct stat a, b;

		if (fstat(fd, &a) == 0 &&
		    (stat(path, &b) < 0 || a.st_ino != b.st_ino ||
		     a.st_dev != b.st_dev)) {
			close(fd);
			fd = -1;
			goto again;
		}
	}
	*fd_out = fd;
	fd = -1;
	rc = 0;
out:
	if (fd >= 0)
		close(fd);
	free(path);
	return rc;
}

void sbx_state_unlock(int fd)
{
	if (fd >= 0)
		close(fd); /* closing the last reference drops the flock */
}

void sbx_state_unlock_forget(int fd, const char *name)
{
	struct sbx_error saved = *sbx_error_last(); /* the caller's */
	char *path = NULL;

	if (fd < 0)
		return;
	/* Still held: nobody can be between locking and checking it. */
	if (name && !sbx_state_exists(name) &&
	    sbx_paths_session_file(&path, "sessions", name, ".lock") == 0)
		(void)unlink(path);
	free(path);
	close(fd);
	if (saved.klass == SBX_ERR_NONE)
		sbx_error_clear();
	else
		sbx_error_restore(&saved);
}
