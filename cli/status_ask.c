/*
 * What `sbx status` and `sbx ls` say about a session: the status object
 * of the record (sbx/status.h), corrected by what the provider says now
 * about a remote sandbox (it may have been deleted, evicted, crashed or
 * expired behind our back), and by whether the daemon answers.  One
 * function for both commands, so they never disagree; `ls` runs it for
 * every session at once (one child process each) with a short timeout.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
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
#include "sbx/provider.h"
#include "sbx/state.h"
#include "sbx/status.h"
#include "sbx/xmalloc.h"
#include "cli_i.h"

static const char *class_name(int klass)
{
	switch (klass) {
	case SBX_ERR_OS: return "OS";
	case SBX_ERR_GIT: return "GIT";
	case SBX_ERR_HTTP: return "HTTP";
	case SBX_ERR_JSON: return "JSON";
	case SBX_ERR_PROTO: return "PROTO";
	case SBX_ERR_REMOTE: return "REMOTE";
	case SBX_ERR_CONFIG: return "CONFIG";
	case SBX_ERR_NOTFOUND: return "NOTFOUND";
	case SBX_ERR_STATE: return "STATE";
	case SBX_ERR_INTERNAL: return "INTERNAL";
	default: return "NONE";
	}
}

static void set_error(cJSON *st, const char *type, const char *message,
		      const char *klass, const char *reason)
{
	cJSON *e = cJSON_CreateObject();

	if (!e)
		abort();
	sbx_json_set_str(e, "type", type);
	sbx_json_set_str(e, "message", message);
	if (klass)
		sbx_json_set_str(e, "class", klass);
	if (reason)
		sbx_json_set_str(e, "reason", reason);
	sbx_json_set_take(st, "error", e);
}

void cli_status_ask(cJSON *st, const struct sbx_session *s)
{
	struct sbx_provider *p = NULL;
	struct sbx_sandbox_info info;
	const char *err, *reason;
	int rc;

	memset(&info, 0, sizeof(info));
	rc = cli_session_provider(&p, s);
	if (rc == 0)
		rc = p->ops->get(p, s->session, &info);
	if (rc < 0) {
		/* Not an answer: say so, with the real class and reason. */
		const struct sbx_error *e = sbx_error_last();
		char *msg = sbx_xasprintf("cannot tell what became of the "
					  "sandbox: %s", e->msg);

		sbx_json_set_str(st, "state", SBX_STATUS_STATE_UNKNOWN);
		set_error(st, e->klass == SBX_ERR_CONFIG
				      ? SBX_STATUS_CONFIG_ERROR
				      : SBX_STATUS_UNAVAILABLE_ERROR,
			  msg, class_name(e->klass), NULL);
		free(msg);
		sbx_error_clear();
		sbx_provider_free(p);
		return;
	}
	sbx_json_set_str(st, "state", sbx_state_name(info.state));
	err = sbx_json_str(info.extra, "error");
	reason = sbx_json_str(info.extra, "error_reason");
	if (info.state == SBX_STATE_ERROR && err) {
		bool gone = sbx_json_bool(info.extra, "gone", false);

		/* What the sandbox is now matters more than an old error. */
		set_error(st, gone ? SBX_STATUS_NOTFOUND_ERROR
				   : SBX_STATUS_SANDBOX_ERROR,
			  err, gone ? "NOTFOUND" : "REMOTE", reason);
	}
	if (info.extra) {
		sbx_json_set_take(st, "sandbox", info.extra);
		info.extra = NULL;
	}
	sbx_sandbox_info_fini(&info);
	sbx_provider_free(p);
}

cJSON *cli_status_object(const struct sbx_session *s, int ping_ms)
{
	cJSON *st = sbx_status_new(s);

	if (s->remote && s->state == SBX_STATE_READY)
		cli_status_ask(st, s);
	/* Last: a daemon that does not answer overrides what it serves. */
	sbx_status_probe(st, s, ping_ms);
	return st;
}

/* ---- sbx ls: every session at once ---------------------------------------- */

struct job {
	pid_t pid;
	int fd;
	struct sbx_buf out;
	bool done;
};

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Start the child that computes the status object of `s`. */
static void job_start(struct job *j, const struct sbx_session *s,
		      int timeout_ms)
{
	int p[2];

	j->pid = -1;
	j->fd = -1;
	sbx_buf_init(&j->out, 16u << 20);
	if (pipe2(p, O_CLOEXEC) < 0)
		return;
	fflush(stdout);
	fflush(stderr);
	j->pid = fork();
	if (j->pid == 0) {
		int ping = timeout_ms < SBX_STATUS_PING_MS ? timeout_ms
							    : SBX_STATUS_PING_MS;
		cJSON *st;
		char *text;

		close(p[0]);
		st = cli_status_object(s, ping);
		text = sbx_json_print(st, false);
		cli_write_all(p[1], text, strlen(text));
		_exit(0);
	}
	close(p[1]);
	if (j->pid < 0) {
		close(p[0]);
		return;
	}
	j->fd = p[0];
}

void cli_status_gather(cJSON **out, const struct sbx_session *s, size_t n,
		       int timeout_ms)
{
	struct job *jobs = sbx_xcalloc(n ? n : 1, sizeof(*jobs));
	long long deadline = now_ms() + timeout_ms;
	size_t pending = 0;

	for (size_t i = 0; i < n; i++) {
		out[i] = sbx_status_new(&s[i]);
		jobs[i].fd = -1;
		jobs[i].pid = -1;
		jobs[i].done = true;
		/* Only what may block goes to a child: a provider question,
		 * a daemon to ping. */
		if ((s[i].remote && s[i].state == SBX_STATE_READY) ||
		    sbx_json_bool(out[i], "mounted", false)) {
			job_start(&jobs[i], &s[i], timeout_ms);
			if (jobs[i].fd >= 0) {
				jobs[i].done = false;
				pending++;
			} else {
				sbx_buf_fini(&jobs[i].out);
			}
		}
	}
	while (pending) {
		struct pollfd *pf = sbx_xcalloc(pending, sizeof(*pf));
		size_t *idx = sbx_xcalloc(pending, sizeof(*idx)), np = 0;
		long long left = deadline - now_ms();
		int r;

		for (size_t i = 0; i < n; i++)
			if (!jobs[i].done) {
				pf[np].fd = jobs[i].fd;
				pf[np].events = POLLIN;
				idx[np++] = i;
			}
		r = left > 0 ? poll(pf, np, (int)left) : 0;
		for (size_t k = 0; r > 0 && k < np; k++) {
			struct job *j = &jobs[idx[k]];
			char buf[65536];
			ssize_t got;

			if (!pf[k].revents)
				continue;
			got = read(j->fd, buf, sizeof(buf));
			if (got < 0 && errno == EINTR)
				continue;
			if (got > 0 && sbx_buf_add(&j->out, buf, (size_t)got) == 0)
				continue;
			sbx_error_clear();
			j->done = true;
			pending--;
		}
		free(pf);
		free(idx);
		if (r == 0 || (r < 0 && errno != EINTR))
			break; /* the time is up */
	}
	for (size_t i = 0; i < n; i++) {
		struct job *j = &jobs[i];
		cJSON *st = NULL;

		if (j->pid <= 0)
			continue;
		if (j->done)
			st = cJSON_ParseWithLength(sbx_buf_ptr(&j->out),
						   sbx_buf_len(&j->out));
		else
			kill(j->pid, SIGKILL);
		while (waitpid(j->pid, NULL, 0) < 0 && errno == EINTR)
			;
		close(j->fd);
		sbx_buf_fini(&j->out);
		if (cJSON_IsObject(st)) {
			cJSON_Delete(out[i]);
			out[i] = st;
			continue;
		}
		cJSON_Delete(st);
		{
			char *msg = sbx_xasprintf(
				"no answer from the %s provider or the "
				"session's daemon within %d ms (`sbx status "
				"%s` waits longer)",
				s[i].provider ? s[i].provider : "?",
				timeout_ms, s[i].session);

			sbx_json_set_str(out[i], "state",
					 SBX_STATUS_STATE_UNKNOWN);
			set_error(out[i], SBX_STATUS_UNAVAILABLE_ERROR, msg,
				  "HTTP", NULL);
			free(msg);
		}
	}
	free(jobs);
}
