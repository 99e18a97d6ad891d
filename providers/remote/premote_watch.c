/*
 * The change stream: one thread that keeps GET /v1/watch?since=SEQ open and
 * turns its frames into struct sbx_change for the daemon (or fs/cache.c).
 *
 * Sequence numbers.  `seq` is the newest event applied (the callback has
 * returned for it); events at or below it that a resumed stream repeats
 * are skipped.  On a dropped stream the thread reconnects with since=seq
 * after a backoff of 100 ms doubling to 5 s (reset once a stream has said
 * hello), so nothing is lost while the agent still has the events; when it
 * has not, it says "overflow" and we pass that on.  A new boot_id in the
 * hello (the agent restarted) is an overflow too, and the stream is
 * restarted at the new agent's current sequence.
 *
 * Liveness: the agent sends a heartbeat every 5 s; a stream that carries
 * no byte for 15 s is dropped by curl's low-speed limit and reconnected.
 *
 * Threads: the stream thread calls the change callback; watch_sync and
 * watch_healthy run on daemon threads.  `lock` protects the fields marked
 * so; it is never held across the callback or a request.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/clock.h"
#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/proto_watch.h"
#include "sbx/xmalloc.h"

#include "premote_i.h"

#define HEARTBEAT_TIMEOUT_S 15
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000

struct premote_watch {
	struct premote_sandbox *s;
	sbx_change_cb cb;
	void *payload;
	pthread_t thread;
	int cancel_fd;            /* eventfd, readable once stopping */

	pthread_mutex_t lock;
	pthread_cond_t cond;      /* CLOCK_MONOTONIC */
	bool stop;                /* protected by lock */
	bool connected;           /* hello seen on the current stream; lock */
	bool first_done;          /* first attempt decided; lock */
	int first_rc;             /* its result; lock */
	char first_msg[512];      /* its error message; lock */
	uint64_t seq;             /* newest applied event; lock */
	char *boot_id;            /* agent boot of `seq`; lock */
	bool restart;             /* reconnect at once (new boot); lock */
	bool warned;              /* an outage was logged; stream thread only */
};

/* ---- frames → changes ----------------------------------------------------- */

int premote_change_from_frame(const cJSON *hdr, struct sbx_change *c)
{
	struct sbx_watch_frame f;
	int rc = sbx_watch_frame_decode(hdr, &f);

	memset(c, 0, sizeof(*c));
	if (rc < 0)
		return rc;
	switch (f.kind) {
	case SBX_WATCH_ENTRY:
		c->kind = SBX_CHANGE_ENTRY;
		break;
	case SBX_WATCH_DATA:
		c->kind = SBX_CHANGE_DATA;
		break;
	case SBX_WATCH_ATTR:
		c->kind = SBX_CHANGE_ATTR;
		break;
	case SBX_WATCH_OVERFLOW:
		c->kind = SBX_CHANGE_OVERFLOW;
		break;
	default:
		return 0; /* hello, heartbeat, kinds of later versions */
	}
	c->seq = f.seq;
	c->path = f.path;
	c->name = f.name;
	c->ino = (ino_t)f.ino; /* entry: what the name holds now */
	c->from_path = f.from;  /* entry: a rename's old name */
	return 1;
}

/* Resolve the identities the daemon knows and call back. */
static void deliver(struct premote_watch *w, struct sbx_change *c)
{
	struct premote_sandbox *s = w->s;

	c->dev = c->dir_dev = s->dev;
	if (c->kind == SBX_CHANGE_ENTRY) {
		size_t dl = (size_t)(c->name - c->path);
		char *dir = sbx_xstrndup(c->path, dl ? dl - 1 : 0);

		c->dir_ino = (ino_t)premote_ino_at(s, dir);
		free(dir);
		/* c->ino: the agent's word (what the name holds after the
		 * change; 0 for a removal).  The caching layer adds what it
		 * held before, from its own nodes. */
	} else if (c->kind != SBX_CHANGE_OVERFLOW) {
		c->ino = (ino_t)premote_ino_at(s, c->path);
	}
	sbx_debug("change %llu: kind %d path \"%s\" (dir ino %llu, ino %llu)%s%s",
		  (unsigned long long)c->seq, c->kind,
		  c->path ? c->path : "", (unsigned long long)c->dir_ino,
		  (unsigned long long)c->ino, c->from_path ? " from " : "",
		  c->from_path ? c->from_path : "");
	w->cb(c, w->payload);
}

static int on_frame(const cJSON *hdr, const void *data, size_t len,
		    void *payload)
{
	struct premote_watch *w = payload;
	struct sbx_watch_frame f;
	struct sbx_change c;
	bool skip;
	int rc;

	rc = sbx_watch_frame_decode(hdr, &f);
	if (rc < 0)
		return rc;
	if (f.kind == SBX_WATCH_HELLO) {
		const char *boot = f.boot_id;
		bool reboot;

		pthread_mutex_lock(&w->lock);
		reboot = w->boot_id && strcmp(w->boot_id, boot);
		if (reboot) {
			free(w->boot_id);
			w->boot_id = sbx_xstrdup(boot);
			w->seq = f.watch_seq;
			w->restart = true;
		} else {
			w->connected = true;
		}
		if (!w->first_done) {
			w->first_done = true;
			w->first_rc = 0;
		}
		pthread_cond_broadcast(&w->cond);
		pthread_mutex_unlock(&w->lock);
		if (reboot) {
			sbx_warn("sbx-agent at %s restarted: invalidating all "
				 "caches", w->s->cfg.url);
			memset(&c, 0, sizeof(c));
			c.kind = SBX_CHANGE_OVERFLOW;
			c.seq = f.watch_seq;
			deliver(w, &c);
			return 1; /* resume at the new agent's sequence */
		}
		if (w->warned) {
			sbx_info("change stream of %s is back", w->s->cfg.url);
			w->warned = false;
		}
		return 0;
	}
	if (f.kind == SBX_WATCH_HEARTBEAT) {
		/* Sent only when the stream has caught up: everything up to
		 * watch_seq has been delivered (numbers may have gaps). */
		pthread_mutex_lock(&w->lock);
		if (f.watch_seq > w->seq)
			w->seq = f.watch_seq;
		pthread_cond_broadcast(&w->cond);
		pthread_mutex_unlock(&w->lock);
		return 0;
	}
	rc = premote_change_from_frame(hdr, &c);
	if (rc <= 0)
		return rc;
	pthread_mutex_lock(&w->lock);
	skip = c.seq <= w->seq && c.kind != SBX_CHANGE_OVERFLOW;
	pthread_mutex_unlock(&w->lock);
	if (!skip)
		deliver(w, &c);
	pthread_mutex_lock(&w->lock);
	if (c.seq > w->seq)
		w->seq = c.seq;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	return 0;
}

/* ---- the stream thread ---------------------------------------------------- */

static void *stream_thread(void *arg)
{
	struct premote_watch *w = arg;
	struct premote_sandbox *s = w->s;
	long backoff = BACKOFF_MIN_MS;
	sigset_t all;

	/* Signals belong to the daemon's main thread. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	for (;;) {
		struct premote_req r = {
			.method = "GET", .route = "/v1/watch",
			.timeout_ms = -1, .low_speed_s = HEARTBEAT_TIMEOUT_S,
			.cancel_fd = w->cancel_fd, .frames = on_frame,
			.payload = w,
		};
		struct premote_resp resp;
		struct sbx_buf q;
		bool was_connected, restart;
		struct timespec until;
		int rc;

		pthread_mutex_lock(&w->lock);
		if (w->stop) {
			pthread_mutex_unlock(&w->lock);
			break;
		}
		sbx_buf_init(&q, PREMOTE_QUERY_CAP);
		premote_q_u64(&q, "since", w->seq);
		/* Another boot's sequence: the agent answers "overflow". */
		premote_q_str(&q, "boot_id", w->boot_id);
		pthread_mutex_unlock(&w->lock);
		r.query = sbx_buf_ptr(&q);
		premote_resp_init(&resp);
		rc = premote_http_do(s->http, &r, &resp);
		premote_resp_fini(&resp);
		sbx_buf_fini(&q);

		pthread_mutex_lock(&w->lock);
		was_connected = w->connected;
		w->connected = false;
		restart = w->restart;
		w->restart = false;
		if (!w->first_done) {
			w->first_done = true;
			w->first_rc = rc < 0 ? rc : -EIO;
			snprintf(w->first_msg, sizeof(w->first_msg), "%s",
				 rc < 0 ? sbx_error_last()->msg
					: "the stream ended at once");
			pthread_cond_broadcast(&w->cond);
			pthread_mutex_unlock(&w->lock);
			break;
		}
		pthread_cond_broadcast(&w->cond);
		if (w->stop) {
			pthread_mutex_unlock(&w->lock);
			break;
		}
		if (restart) {
			pthread_mutex_unlock(&w->lock);
			sbx_error_clear();
			continue;
		}
		if (was_connected)
			backoff = BACKOFF_MIN_MS;
		if (!w->warned) {
			sbx_warn("change stream of %s lost (%s); caching "
				 "briefly until it is back", s->cfg.url,
				 rc < 0 ? sbx_error_last()->msg
					: "the agent ended it");
			w->warned = true;
		}
		sbx_error_clear();
		until = sbx_clock_deadline(CLOCK_MONOTONIC, (int)backoff);
		while (!w->stop && pthread_cond_timedwait(&w->cond, &w->lock,
							  &until) != ETIMEDOUT)
			;
		pthread_mutex_unlock(&w->lock);
		backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
						       : backoff * 2;
	}
	return NULL;
}

/* ---- ops ------------------------------------------------------------------ */

static void watch_free(struct premote_watch *w)
{
	if (!w)
		return;
	if (w->cancel_fd >= 0)
		close(w->cancel_fd);
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cond);
	free(w->boot_id);
	free(w);
}

static void stop_thread(struct premote_watch *w)
{
	uint64_t one = 1;

	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	if (write(w->cancel_fd, &one, sizeof(one)) < 0) {
		/* an eventfd with room: cannot fail */
	}
	pthread_join(w->thread, NULL);
}

int premote_watch_start(struct sbx_sandbox *sb, sbx_change_cb cb,
			void *payload)
{
	struct premote_sandbox *s = PREMOTE_SB(sb);
	struct premote_watch *w;
	pthread_condattr_t ca;
	struct timespec until;
	int rc;

	if (s->watch)
		return sbx_error_set(SBX_ERR_INTERNAL, -EBUSY,
				     "watch already started");
	if (!s->info.cap_watch)
		return sbx_error_set(SBX_ERR_REMOTE, -ENOSYS,
				     "the agent at %s has no change stream",
				     s->cfg.url);
	w = sbx_xcalloc(1, sizeof(*w));
	w->s = s;
	w->cb = cb;
	w->payload = payload;
	w->seq = s->info.watch_seq;
	w->boot_id = sbx_xstrdup(s->info.boot_id);
	pthread_mutex_init(&w->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&w->cond, &ca);
	pthread_condattr_destroy(&ca);
	w->cancel_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (w->cancel_fd < 0) {
		rc = sbx_error_os("eventfd");
		watch_free(w);
		return rc;
	}
	rc = pthread_create(&w->thread, NULL, stream_thread, w);
	if (rc) {
		rc = sbx_error_set(SBX_ERR_OS, -rc, "start the watch thread: %s",
				   strerror(rc));
		watch_free(w);
		return rc;
	}
	/* Wait for the hello (or the failure) of the first stream. */
	until = sbx_clock_deadline(CLOCK_MONOTONIC,
				   (int)premote_http_timeout_ms(s->http) + 1000);
	pthread_mutex_lock(&w->lock);
	while (!w->first_done &&
	       pthread_cond_timedwait(&w->cond, &w->lock, &until) != ETIMEDOUT)
		;
	if (!w->first_done)
		rc = sbx_error_set(SBX_ERR_HTTP, -ETIMEDOUT,
				   "the change stream of %s did not start in "
				   "time", s->cfg.url);
	else if (w->first_rc < 0)
		rc = sbx_error_set(SBX_ERR_HTTP, w->first_rc,
				   "change stream of %s: %s", s->cfg.url,
				   w->first_msg);
	pthread_mutex_unlock(&w->lock);
	if (rc < 0) {
		stop_thread(w);
		watch_free(w);
		return rc;
	}
	s->watch = w;
	return 0;
}

void premote_watch_stop(struct sbx_sandbox *sb)
{
	struct premote_sandbox *s = PREMOTE_SB(sb);
	struct premote_watch *w = s->watch;

	if (!w)
		return;
	stop_thread(w);
	watch_free(w);
	s->watch = NULL;
}

bool premote_watch_healthy(struct sbx_sandbox *sb)
{
	struct premote_watch *w = PREMOTE_SB(sb)->watch;
	bool ok;

	if (!w)
		return false;
	pthread_mutex_lock(&w->lock);
	ok = w->connected && !w->stop;
	pthread_mutex_unlock(&w->lock);
	return ok;
}

/*
 * The exec barrier.  The target is the watch_seq an exec reported at its
 * exit when there is one (no round trip), else the agent's current one
 * from /v1/info.  Then wait, bounded by the timeout, until the stream has
 * applied it.  A stream that is down cannot promise anything: -EIO, and
 * the daemon invalidates everything instead.
 */
int premote_watch_sync(struct sbx_sandbox *sb)
{
	struct premote_sandbox *s = PREMOTE_SB(sb);
	struct premote_watch *w = s->watch;
	uint64_t target = 0;
	bool have = false;
	struct timespec until;
	int rc = 0;

	if (!w)
		return sbx_error_set(SBX_ERR_INTERNAL, -ENOSYS,
				     "watch_sync without a change stream");
	pthread_mutex_lock(&s->seq_lock);
	if (s->exec_seq_set) {
		target = s->exec_seq;
		have = true;
		s->exec_seq_set = false;
	}
	pthread_mutex_unlock(&s->seq_lock);
	if (!have) {
		struct premote_info info;
		cJSON *j = NULL;

		rc = premote_http_json(s->http, "GET", "/v1/info", NULL, NULL,
				       true, &j);
		if (rc == 0)
			rc = premote_info_parse(&info, j);
		cJSON_Delete(j);
		if (rc < 0)
			return premote_fs_errno(
				sbx_error_prefix(rc, "exec barrier"));
		target = info.watch_seq;
		pthread_mutex_lock(&w->lock);
		if (w->boot_id && strcmp(w->boot_id, info.boot_id))
			rc = sbx_error_set(SBX_ERR_REMOTE, -EIO,
					   "exec barrier: sbx-agent at %s has "
					   "restarted", s->cfg.url);
		pthread_mutex_unlock(&w->lock);
		premote_info_fini(&info);
		if (rc < 0)
			return rc;
	}
	until = sbx_clock_deadline(CLOCK_MONOTONIC,
				   (int)premote_http_timeout_ms(s->http));
	pthread_mutex_lock(&w->lock);
	while (w->seq < target && w->connected && !w->stop) {
		if (pthread_cond_timedwait(&w->cond, &w->lock, &until) ==
		    ETIMEDOUT)
			break;
	}
	if (w->seq >= target)
		rc = 0;
	else if (!w->connected || w->stop)
		rc = sbx_error_set(SBX_ERR_HTTP, -EIO,
				   "exec barrier: the change stream of %s is "
				   "down, so changes made by the command may "
				   "not be visible yet", s->cfg.url);
	else
		rc = sbx_error_set(SBX_ERR_HTTP, -ETIMEDOUT,
				   "exec barrier: the change stream of %s is "
				   "at %llu, the command ended at %llu",
				   s->cfg.url, (unsigned long long)w->seq,
				   (unsigned long long)target);
	pthread_mutex_unlock(&w->lock);
	return rc;
}
