/*
 * The change stream (docs/protocol.md, "Watch"): lib/fswatch.c turns
 * recursive inotify into path events; each gets the next sequence number and
 * goes into a ring of the last RING_SIZE events, from which every
 * GET /v1/watch stream reads at its own pace.  A stream that falls behind
 * the ring, or asks for a `since` the ring no longer holds (or one from
 * another boot), gets an overflow: "invalidate everything".
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "sbx/fswatch.h"
#include "sbx/log.h"
#include "sbx/proto.h"
#include "sbx/proto_watch.h"
#include "sbx/xmalloc.h"

#include "agent_i.h"

#define RING_SIZE 65536
#define HEARTBEAT_S 5
/* Stream frames are batched up to this many bytes per write. */
#define BATCH_BYTES (32 * 1024)
#define SYNC_TIMEOUT_MS 10000

struct wevent {
	uint64_t seq;
	int kind; /* enum sbx_fswatch_kind */
	char *path;
	uint64_t ino; /* ENTRY: what the name holds after it (0: none) */
	char *from;   /* ENTRY: the name it was moved from (NULL: none) */
};

struct agent_watch {
	struct sbx_fswatch *fw;
	const char *root;     /* the agent's root_path, borrowed */
	dev_t root_dev;       /* its st_dev */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint64_t seq;         /* protected by lock: the last event's number */
	struct wevent *ring;  /* protected by lock: [seq % RING_SIZE] */
	bool enabled;
};

/* The wire kind of an fswatch kind. */
static int wire_kind(int kind)
{
	switch (kind) {
	case SBX_FSWATCH_ENTRY:
		return SBX_WATCH_ENTRY;
	case SBX_FSWATCH_DATA:
		return SBX_WATCH_DATA;
	case SBX_FSWATCH_ATTR:
		return SBX_WATCH_ATTR;
	default:
		return SBX_WATCH_OVERFLOW;
	}
}

/* fswatch callback (watcher thread). */
static void on_event(const struct sbx_fswatch_event *ev, void *payload)
{
	struct agent_watch *w = payload;
	struct wevent *slot;
	int kind = ev->kind;
	const char *path = ev->path;
	const char *from = ev->from;
	uint64_t ino = 0;
	struct stat st;

	/* A path beyond PATH_MAX (very deep trees) could not be used by a
	 * client anyway and might not fit a frame: say "invalidate all". */
	if (path && strlen(path) >= PATH_MAX) {
		kind = SBX_FSWATCH_OVERFLOW;
		path = NULL;
	}
	if (!path || (from && strlen(from) >= PATH_MAX))
		from = NULL;
	/*
	 * What a name holds now, so a client can refresh the link count of
	 * a file it knows by another name (a link made to it): inotify tells
	 * only a watch on the file itself of that; and, for a rename (a
	 * directory's too), that the new name holds the object that moved.
	 * Before the event is queued, outside the lock; the name may have
	 * changed again since, which a later event says.  Not of a file
	 * system mounted below the root: clients number its inodes their own
	 * way (premote_fix_stat).  Nor for a path too long to send.
	 */
	if (path && sbx_fswatch_entry_stat(ev, w->root, &st) &&
	    st.st_dev == w->root_dev)
		ino = (uint64_t)st.st_ino;
	pthread_mutex_lock(&w->lock);
	w->seq++;
	slot = &w->ring[w->seq % RING_SIZE];
	free(slot->path);
	free(slot->from);
	slot->seq = w->seq;
	slot->kind = kind;
	slot->path = path ? sbx_xstrdup(path) : NULL;
	slot->ino = ino;
	slot->from = from ? sbx_xstrdup(from) : NULL;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

int agent_watch_start(struct agent *a)
{
	struct agent_watch *w = sbx_xcalloc(1, sizeof(*w));
	int rc;

	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	w->ring = sbx_xcalloc(RING_SIZE, sizeof(*w->ring));
	w->root = a->root_path;
	{
		struct stat rst;

		w->root_dev = lstat(a->root_path, &rst) == 0 ? rst.st_dev : 0;
	}
	a->watch = w;
	rc = sbx_fswatch_new(&w->fw, a->root_path, on_event, w);
	if (rc < 0)
		return rc;
	w->enabled = true;
	return 0;
}

void agent_watch_stop(struct agent *a)
{
	struct agent_watch *w = a->watch;

	if (!w)
		return;
	sbx_fswatch_free(w->fw);
	for (size_t i = 0; i < RING_SIZE; i++) {
		free(w->ring[i].path);
		free(w->ring[i].from);
	}
	free(w->ring);
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cond);
	free(w);
	a->watch = NULL;
}

void agent_watch_wake(struct agent *a)
{
	if (!a->watch)
		return;
	pthread_mutex_lock(&a->watch->lock);
	pthread_cond_broadcast(&a->watch->cond);
	pthread_mutex_unlock(&a->watch->lock);
}

bool agent_watch_enabled(struct agent *a)
{
	return a->watch && a->watch->enabled;
}

uint64_t agent_watch_seq(struct agent *a)
{
	uint64_t s;

	if (!a->watch)
		return 0;
	pthread_mutex_lock(&a->watch->lock);
	s = a->watch->seq;
	pthread_mutex_unlock(&a->watch->lock);
	return s;
}

uint64_t agent_watch_sync_seq(struct agent *a)
{
	struct agent_watch *w = a->watch;

	if (!w || !w->enabled)
		return agent_watch_seq(a);
	if (sbx_fswatch_sync(w->fw, SYNC_TIMEOUT_MS) < 0) {
		/* A sequence that may miss changes must not be trusted:
		 * number an overflow so clients invalidate. */
		struct sbx_fswatch_event ev = { .kind = SBX_FSWATCH_OVERFLOW };

		sbx_warn("watch barrier: %s", sbx_error_last()->msg);
		sbx_error_clear();
		on_event(&ev, w);
	}
	return agent_watch_seq(a);
}

/* ---- the stream ------------------------------------------------------------ */

struct wstream {
	struct agent_stream base;
	uint64_t sent;     /* last sequence delivered (or skipped) */
	bool hello_done;
	bool overflow_first;
	uint64_t last_frame_ns;
};

static void frame_event(struct sbx_buf *out, const struct wevent *e)
{
	struct sbx_watch_frame f = {
		.kind = wire_kind(e->kind), .seq = e->seq, .path = e->path,
		.ino = e->ino, .from = e->from,
	};

	agent_frame(out, sbx_watch_frame_encode(&f), NULL, 0);
}

static void frame_overflow(struct sbx_buf *out, uint64_t seq)
{
	struct wevent e = { .seq = seq, .kind = SBX_FSWATCH_OVERFLOW };

	frame_event(out, &e);
}

static int wstream_next(struct agent_stream *s, struct sbx_buf *out)
{
	struct wstream *ws = (struct wstream *)s;
	struct agent_watch *w = s->a->watch;
	int rc = 0;

	pthread_mutex_lock(&w->lock);
	if (!ws->hello_done) {
		struct sbx_watch_frame f = {
			.kind = SBX_WATCH_HELLO, .seq = w->seq,
			.boot_id = s->a->boot_id, .watch_seq = w->seq,
		};

		agent_frame(out, sbx_watch_frame_encode(&f), NULL, 0);
		ws->hello_done = true;
		if (ws->overflow_first) {
			frame_overflow(out, w->seq);
			ws->sent = w->seq;
		}
		goto done;
	}
	for (;;) {
		uint64_t oldest = w->seq >= RING_SIZE ? w->seq - RING_SIZE + 1
						      : 1;

		if (atomic_load(&s->a->stopping)) {
			rc = -ECANCELED;
			goto out;
		}
		if (ws->sent < w->seq) {
			if (ws->sent + 1 < oldest) {
				/* Lapped by the ring: events are lost. */
				frame_overflow(out, w->seq);
				ws->sent = w->seq;
				goto done;
			}
			while (ws->sent < w->seq && out->len < BATCH_BYTES) {
				ws->sent++;
				frame_event(out, &w->ring[ws->sent % RING_SIZE]);
			}
			goto done;
		}
		{
			uint64_t now = agent_now_ns();
			uint64_t due = ws->last_frame_ns +
				       (uint64_t)HEARTBEAT_S * 1000000000ULL;
			struct timespec ts;

			if (now >= due) {
				struct sbx_watch_frame f = {
					.kind = SBX_WATCH_HEARTBEAT,
					.watch_seq = w->seq,
				};

				agent_frame(out, sbx_watch_frame_encode(&f),
					    NULL, 0);
				goto done;
			}
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += (time_t)((due - now) / 1000000000ULL);
			ts.tv_nsec += (long)((due - now) % 1000000000ULL);
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&w->cond, &w->lock, &ts);
		}
	}
done:
	ws->last_frame_ns = agent_now_ns();
out:
	pthread_mutex_unlock(&w->lock);
	return rc;
}

static void wstream_fini(struct agent_stream *s)
{
	free(s);
}

int agent_h_watch(struct agent_req *r)
{
	struct agent_watch *w = r->a->watch;
	const char *boot = agent_arg(r, "boot_id");
	long long since;
	struct wstream *ws;
	uint64_t cur, oldest;
	int rc;

	rc = agent_arg_int(r, "since", -1, -1, INT64_MAX, &since);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	if (!agent_watch_enabled(r->a)) {
		sbx_error_set(SBX_ERR_STATE, -ENOSYS,
			      "no change stream (inotify unavailable)");
		return agent_reply_error(r, 501, -ENOSYS);
	}
	ws = sbx_xcalloc(1, sizeof(*ws));
	ws->base.next = wstream_next;
	ws->base.fini = wstream_fini;
	pthread_mutex_lock(&w->lock);
	cur = w->seq;
	oldest = cur >= RING_SIZE ? cur - RING_SIZE + 1 : 1;
	if (since < 0) {
		ws->sent = cur; /* from now on */
	} else if ((uint64_t)since > cur || (uint64_t)since + 1 < oldest ||
		   (boot && *boot && strcmp(boot, r->a->boot_id) != 0)) {
		/* From another boot, or older than the ring. */
		ws->overflow_first = true;
		ws->sent = cur;
	} else {
		ws->sent = (uint64_t)since;
	}
	pthread_mutex_unlock(&w->lock);
	return agent_reply_stream(r, &ws->base);
}
