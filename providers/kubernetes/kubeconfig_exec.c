/*
 * kubeconfig exec credential plugins (kubeconfig.h): run the command
 * (sbx/spawn.h) with its environment, collect its ExecCredential, cache
 * the result in the config.  See kubeconfig_i.h.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/buf.h"
#include "sbx/json.h"
#include "sbx/spawn.h"
#include "sbx/xmalloc.h"

#include "kubeconfig_i.h"

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
	if (tok && !pk8s_token_ok(tok->valuestring)) {
		rc = exec_fail(x, SBX_ERR_JSON, rc,
			       "returned a token with spaces or control "
			       "characters", err);
		goto out;
	}
	if (crt && (!pk8s_has(crt->valuestring, strlen(crt->valuestring),
			 "-----BEGIN CERTIFICATE-----") ||
		    !pk8s_has(key->valuestring, strlen(key->valuestring),
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

	sbx_kube_creds_fini(&k->ex);
	k->ex.bearer = tok ? sbx_xstrdup(tok->valuestring) : NULL;
	k->ex.cert_pem = crt ? sbx_xstrdup(crt->valuestring) : NULL;
	k->ex.cert_pem_len = crt ? strlen(crt->valuestring) : 0;
	k->ex.key_pem = key ? sbx_xstrdup(key->valuestring) : NULL;
	k->ex.key_pem_len = key ? strlen(key->valuestring) : 0;
	k->ex.expires = expires;
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
int pk8s_exec_run(struct sbx_kube_config *k)
{
	const struct kexec *x = k->exec;
	struct sbx_spawn sp = { .in_fd = -1, .out_fd = -1, .err_fd = -1,
				.pty_fd = -1 };
	struct sbx_spawn_opts o;
	struct pollfd pf[2] = { { .fd = -1 }, { .fd = -1 } };
	struct sbx_buf ob, eb;
	char *info = NULL, **envp = NULL, *found = NULL, what[160];
	long timeout = exec_timeout_ms();
	long long deadline;
	bool timed_out = false, too_big = false;
	pid_t pid = -1;
	int status = 0, rc = 0, e = 0;

	sbx_buf_init(&ob, EXEC_OUT_CAP);
	sbx_buf_init(&eb, EXEC_ERR_CAP);
	info = sbx_xasprintf("KUBERNETES_EXEC_INFO={\"apiVersion\":\"%s\","
			     "\"kind\":\"ExecCredential\",\"spec\":"
			     "{\"interactive\":false}}", x->api_version);
	envp = exec_envp(x, info);
	sbx_spawn_opts_init(&o);
	o.argv = (const char *const *)x->argv;
	o.envp = (const char *const *)envp;
	o.stdio[0] = SBX_SPAWN_NULL;
	o.group = SBX_SPAWN_PGROUP;
	/* Only a name without '/' is searched, in our own PATH (as
	 * posix_spawnp did; exec.env does not change where it is found). */
	if (strchr(x->argv[0], '/'))
		o.file = x->argv[0];
	else if ((rc = sbx_spawn_find(&found, x->argv[0], getenv("PATH"),
				      AT_FDCWD, NULL)) < 0)
		e = -rc;
	else
		o.file = found;
	if (!e) {
		rc = sbx_spawn_start(&sp, &o);
		if (rc < 0)
			e = sp.child_failed ? sp.child_errno : -rc;
	}
	if (e) {
		sbx_error_clear();
		if (e == ENOENT)
			snprintf(what, sizeof(what), "was not found%s",
				 strchr(x->argv[0], '/') ? "" : " in PATH");
		else
			snprintf(what, sizeof(what), "cannot be run: %s",
				 strerror(e));
		rc = exec_fail(x, SBX_ERR_CONFIG, -e, what, NULL);
		goto out;
	}
	pid = sp.pid;

	pf[0].fd = sp.out_fd;
	pf[1].fd = sp.err_fd;
	pf[0].events = pf[1].events = POLLIN;
	sp.out_fd = sp.err_fd = -1;
	deadline = pk8s_mono_ms() + timeout;
	while (pf[0].fd >= 0 || pf[1].fd >= 0) {
		long long left = deadline - pk8s_mono_ms();
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
	for (int i = 0; i < 2; i++)
		if (pf[i].fd >= 0)
			close(pf[i].fd);
	sbx_spawn_fini(&sp);
	free(found);
	if (ob.data)
		explicit_bzero(ob.data, ob.len);
	sbx_buf_fini(&ob);
	sbx_buf_fini(&eb);
	free(envp);
	free(info);
	return rc;
}
