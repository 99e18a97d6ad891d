/* The status object and mount liveness checks; see sbx/status.h. */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/ctl.h"
#include "sbx/json.h"
#include "sbx/paths.h"
#include "sbx/state.h"
#include "sbx/status.h"
#include "sbx/xmalloc.h"

const char *sbx_status_error_type(int klass, const char *fallback)
{
	switch (klass) {
	case SBX_ERR_CONFIG:
		return SBX_STATUS_CONFIG_ERROR;
	case SBX_ERR_NOTFOUND:
		return SBX_STATUS_NOTFOUND_ERROR;
	default:
		return fallback;
	}
}

bool sbx_status_daemon_alive(pid_t pid)
{
	char path[64], comm[32];
	FILE *f;
	bool ok = false;

	if (pid <= 0)
		return false;
	if (kill(pid, 0) < 0 && errno != EPERM)
		return false;
	snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return false;
	if (fgets(comm, sizeof(comm), f)) {
		comm[strcspn(comm, "\n")] = '\0';
		ok = strcmp(comm, SBX_DAEMON_COMM) == 0;
	}
	fclose(f);
	/* A zombie still has its comm; it is not serving anything. */
	if (ok) {
		char stat[512], *p;

		snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
		f = fopen(path, "re");
		if (f) {
			if (fgets(stat, sizeof(stat), f)) {
				p = strrchr(stat, ')');
				if (p && p[1] == ' ' && (p[2] == 'Z' ||
							 p[2] == 'X'))
					ok = false;
			}
			fclose(f);
		}
	}
	return ok;
}

void sbx_mount_entry_fini(struct sbx_mount_entry *e)
{
	if (!e)
		return;
	free(e->mountpoint);
	free(e->fstype);
	free(e->source);
	memset(e, 0, sizeof(*e));
}

char *sbx_mountinfo_unescape(const char *s, size_t n)
{
	char *out = sbx_xmalloc(n + 1), *o = out;

	for (size_t i = 0; i < n; i++) {
		if (s[i] == '\\' && i + 3 < n && s[i + 1] >= '0' &&
		    s[i + 1] <= '3' && s[i + 2] >= '0' && s[i + 2] <= '7' &&
		    s[i + 3] >= '0' && s[i + 3] <= '7') {
			*o++ = (char)((s[i + 1] - '0') * 64 +
				      (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
			i += 3;
		} else {
			*o++ = s[i];
		}
	}
	*o = '\0';
	return out;
}

/* Field `idx` (0-based, space separated) of `line`; NULL if missing. */
static const char *field(const char *line, int idx, size_t *len)
{
	const char *p = line;

	for (int i = 0; i < idx; i++) {
		p = strchr(p, ' ');
		if (!p)
			return NULL;
		p++;
	}
	*len = strcspn(p, " \n");
	return p;
}

int sbx_mountinfo_find(struct sbx_mount_entry *out, const char *mountinfo,
		       const char *mountpoint)
{
	char *line = NULL;
	size_t cap = 0;
	FILE *f;
	int rc = -ENOENT;

	memset(out, 0, sizeof(*out));
	if (!mountinfo)
		mountinfo = "/proc/self/mountinfo";
	f = fopen(mountinfo, "re");
	if (!f)
		return sbx_error_os("open %s", mountinfo);
	while (getline(&line, &cap, f) > 0) {
		const char *mp, *sep, *fs, *src;
		size_t mlen, flen, slen;
		char *m;

		mp = field(line, 4, &mlen);
		sep = strstr(line, " - ");
		if (!mp || !sep)
			continue;
		m = sbx_mountinfo_unescape(mp, mlen);
		if (strcmp(m, mountpoint) != 0) {
			free(m);
			continue;
		}
		fs = field(sep + 3, 0, &flen);
		src = field(sep + 3, 1, &slen);
		if (!fs || !src) {
			free(m);
			continue;
		}
		/* Later lines are mounted on top: keep the last match. */
		sbx_mount_entry_fini(out);
		out->mountpoint = m;
		out->fstype = sbx_mountinfo_unescape(fs, flen);
		out->source = sbx_mountinfo_unescape(src, slen);
		rc = 0;
	}
	free(line);
	fclose(f);
	return rc;
}

bool sbx_status_is_sbx_mount(const char *mountinfo, const char *mountpoint,
			     const char *name)
{
	struct sbx_mount_entry e;
	bool ok;

	if (!mountpoint || !name)
		return false;
	if (sbx_mountinfo_find(&e, mountinfo, mountpoint) < 0) {
		sbx_error_clear();
		return false;
	}
	ok = strcmp(e.fstype, "fuse.sbx") == 0 &&
	     strncmp(e.source, "sbx:", 4) == 0 &&
	     strcmp(e.source + 4, name) == 0;
	sbx_mount_entry_fini(&e);
	return ok;
}

bool sbx_status_mounted(const struct sbx_session *s)
{
	return sbx_status_daemon_alive(s->pid) &&
	       sbx_status_is_sbx_mount(NULL, s->mountpoint, s->session);
}

cJSON *sbx_status_build(const struct sbx_session *s, bool mounted)
{
	cJSON *j = cJSON_CreateObject();

	if (!j)
		abort();
	sbx_session_json_common(j, s);
	sbx_json_set_str(j, "isolation", s->isolation ? s->isolation : "none");
	sbx_json_set_take(j, "mounted", cJSON_CreateBool(mounted));
	/* Only a live daemon's pid means anything to a reader. */
	sbx_json_set_take(j, "pid",
			  cJSON_CreateNumber(mounted ? (double)s->pid : 0));
	if (s->error_type) {
		cJSON *e = cJSON_CreateObject();

		sbx_json_set_str(e, "type", s->error_type);
		sbx_json_set_str(e, "message",
				 s->error_message ? s->error_message : "");
		sbx_json_set_take(j, "error", e);
	}
	return j;
}

cJSON *sbx_status_new(const struct sbx_session *s)
{
	return sbx_status_build(s, sbx_status_mounted(s));
}

void sbx_status_probe(cJSON *st, const struct sbx_session *s, int timeout_ms)
{
	cJSON *e;
	char *msg;
	int rc;

	if (!sbx_json_bool(st, "mounted", false) || !s->control_socket)
		return;
	rc = sbx_ctl_ping(s->control_socket, timeout_ms);
	sbx_error_clear();
	if (rc != -ETIMEDOUT)
		return; /* it answered, or it is gone (not our question) */
	msg = sbx_xasprintf("the daemon (pid %d) of session %s does not "
			    "answer (no reply on its control socket within "
			    "%d ms): it is stopped or stuck; recover with "
			    "`sbx umount --force %s` then `sbx mount %s`",
			    (int)s->pid, s->session, timeout_ms, s->session,
			    s->session);
	sbx_json_set_str(st, "state", "error");
	cJSON_DeleteItemFromObject(st, "error");
	e = cJSON_CreateObject();
	if (!e)
		abort();
	sbx_json_set_str(e, "type", SBX_STATUS_FILE_ERROR);
	sbx_json_set_str(e, "message", msg);
	sbx_json_set_take(st, "error", e);
	free(msg);
}
