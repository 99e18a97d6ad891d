/*
 * The in-memory sandbox's instrumentation (call counters, injected faults,
 * the hook and the gate) and its change stream; see pmem.h and pmem_i.h.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sbx/clock.h"
#include "sbx/proto.h"
#include "sbx/provider.h"
#include "sbx/xmalloc.h"

#include "pmem_i.h"

static const char *const op_names[OP_COUNT] = {
	"lookup", "forget", "getattr", "setattr", "readlink", "mknod",
	"mkdir", "symlink", "link", "unlink", "rmdir", "rename",
	"open", "create", "read", "write", "flush", "fsync",
	"release", "fallocate", "lseek", "opendir", "readdir",
	"fsyncdir", "releasedir", "statfs", "node_path", "watch_start",
	"watch_sync", "watch_stop", "bulk", "syncfs", "node_at",
	"write_then", "setattr_many", "then",
};

static int op_index(const char *name)
{
	for (int i = 0; i < OP_COUNT; i++)
		if (strcmp(op_names[i], name) == 0)
			return i;
	return -1;
}

/* ---- instrumentation ----------------------------------------------------- */

void pmem_hook_point(struct pmem *s, const char *name, const char *path)
{
	pmem_hook_fn hook;
	void *payload;

	pthread_mutex_lock(&s->lock);
	hook = s->hook;
	payload = s->hook_payload;
	pthread_mutex_unlock(&s->lock);
	if (hook)
		hook(name, path, payload);
}

/* See pmem_i.h. */
void pmem_gate_locked(struct pmem *s, enum op op, const char *path,
			bool after)
{
	if (s->gate_op != (int)op || s->gate_after != after ||
	    s->gate_parked || s->gate_open ||
	    (s->gate_path && strcmp(s->gate_path, path) != 0))
		return;
	s->gate_parked = true;
	pthread_cond_broadcast(&s->gate_cond);
	while (!s->gate_open)
		pthread_cond_wait(&s->gate_cond, &s->lock);
	/* Disarmed: the next arm starts afresh. */
	s->gate_op = -1;
	s->gate_parked = false;
	s->gate_open = false;
	free(s->gate_path);
	s->gate_path = NULL;
	pthread_cond_broadcast(&s->gate_cond);
}

/*
 * Start of an operation: gate, hook, counter, fault (see pmem.h).  Returns
 * 0 or the injected error.  Called without s->lock.
 */
int pmem_enter(struct pmem *s, enum op op, const char *path)
{
	pmem_hook_fn hook;
	void *payload;
	int rc;

	pthread_mutex_lock(&s->lock);
	pmem_gate_locked(s, op, path, false);
	hook = s->hook;
	payload = s->hook_payload;
	pthread_mutex_unlock(&s->lock);

	if (hook)
		hook(op_names[op], path, payload);

	pthread_mutex_lock(&s->lock);
	rc = pmem_fault_locked(s, op, path);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

int pmem_fault_locked(struct pmem *s, enum op op, const char *path)
{
	struct fault *f = &s->faults[op];
	int rc = 0;

	s->calls[op]++;
	if (f->count != 0 && f->err) {
		rc = f->err;
		if (f->count > 0)
			f->count--;
	}
	if (rc)
		return sbx_error_set(SBX_ERR_REMOTE, rc, "%s %s: injected",
				     op_names[op], path);
	return 0;
}

int pmem_path_op(struct pmem *s, enum op op, const char *path,
		 pmem_locked_fn fn, void *arg)
{
	int rc = pmem_enter(s, op, path);

	if (rc < 0)
		return rc;
	pthread_mutex_lock(&s->lock);
	rc = fn(s, path, arg);
	if (rc == 0)
		pmem_side_locked(s, op, path, NULL);
	pmem_gate_locked(s, op, path, true);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

/* Stat the directory part of path into *st; true when it worked. */
static bool stat_parent_locked(struct pmem *s, const char *path,
			       struct stat *st)
{
	const char *slash = strrchr(path, '/');
	char *dir = slash ? sbx_xstrndup(path, (size_t)(slash - path))
			  : sbx_xstrdup("");
	bool ok = pmem_stat_locked(s, dir, st) == 0;

	free(dir);
	if (!ok)
		sbx_error_clear();
	return ok;
}

void pmem_side_locked(struct pmem *s, enum op op, const char *path,
		      const char *newpath)
{
	struct sbx_side *side = sbx_side_get();

	if (!side)
		return;
	switch (op) {
	case OP_MKNOD: case OP_MKDIR: case OP_SYMLINK: case OP_LINK:
	case OP_UNLINK: case OP_RMDIR: case OP_CREATE: case OP_RENAME:
		side->has_dir = stat_parent_locked(s, path, &side->dir);
		if (newpath) {
			side->has_newdir =
				stat_parent_locked(s, newpath, &side->newdir);
			side->has_obj = pmem_stat_locked(s, newpath,
							 &side->obj) == 0;
			if (!side->has_obj)
				sbx_error_clear();
		}
		break;
	case OP_WRITE: case OP_WRITE_THEN:
		side->has_file = pmem_stat_locked(s, path, &side->file) == 0;
		if (!side->has_file)
			sbx_error_clear();
		break;
	default:
		break;
	}
}

int pmem_child_op(struct pmem *s, enum op op, struct sbx_node *parent,
		  const char *name, pmem_locked_fn fn, void *arg,
		  struct sbx_node **out)
{
	char *path;
	int rc;

	if (out)
		*out = NULL;
	rc = pmem_child(parent, name, &path);
	if (rc < 0)
		return rc;
	rc = pmem_path_op(s, op, path, fn, arg);
	if (rc == 0 && out)
		*out = (struct sbx_node *)pmem_node_new(path);
	free(path);
	return rc;
}

int pmem_fail(struct sbx_sandbox *sb, const char *op, int neg_errno, int count)
{
	struct pmem *s = PMEM(sb);
	int i = op_index(op);

	if (i < 0 || neg_errno > 0)
		return sbx_error_set(SBX_ERR_INTERNAL, -EINVAL,
				     "pmem_fail: bad op '%s' or errno %d", op,
				     neg_errno);
	pthread_mutex_lock(&s->lock);
	s->faults[i].err = count ? neg_errno : 0;
	s->faults[i].count = neg_errno ? count : 0;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

unsigned long pmem_calls(struct sbx_sandbox *sb, const char *op)
{
	struct pmem *s = PMEM(sb);
	int i = op_index(op);
	unsigned long n;

	if (i < 0)
		return 0;
	pthread_mutex_lock(&s->lock);
	n = s->calls[i];
	pthread_mutex_unlock(&s->lock);
	return n;
}

void pmem_calls_reset(struct sbx_sandbox *sb)
{
	struct pmem *s = PMEM(sb);

	pthread_mutex_lock(&s->lock);
	memset(s->calls, 0, sizeof(s->calls));
	pthread_mutex_unlock(&s->lock);
}

void pmem_set_hook(struct sbx_sandbox *sb, pmem_hook_fn fn, void *payload)
{
	struct pmem *s = PMEM(sb);

	pthread_mutex_lock(&s->lock);
	s->hook = fn;
	s->hook_payload = payload;
	pthread_mutex_unlock(&s->lock);
}

static int gate_arm(struct sbx_sandbox *sb, const char *op, const char *path,
		    bool after)
{
	struct pmem *s = PMEM(sb);
	int i = op_index(op);

	if (i < 0)
		return sbx_error_set(SBX_ERR_INTERNAL, -EINVAL,
				     "pmem_gate_arm: unknown op '%s'", op);
	pthread_mutex_lock(&s->lock);
	if (s->gate_parked) {
		pthread_mutex_unlock(&s->lock);
		return sbx_error_set(SBX_ERR_INTERNAL, -EBUSY,
				     "pmem_gate_arm: a call is parked");
	}
	free(s->gate_path);
	s->gate_path = path ? sbx_xstrdup(path) : NULL;
	s->gate_op = i;
	s->gate_after = after;
	s->gate_open = false;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int pmem_gate_arm(struct sbx_sandbox *sb, const char *op, const char *path)
{
	return gate_arm(sb, op, path, false);
}

int pmem_gate_arm_after(struct sbx_sandbox *sb, const char *op,
			const char *path)
{
	return gate_arm(sb, op, path, true);
}

int pmem_gate_wait(struct sbx_sandbox *sb, int timeout_ms)
{
	struct pmem *s = PMEM(sb);
	struct timespec until = sbx_clock_deadline(CLOCK_REALTIME, timeout_ms);
	int rc = 0;

	pthread_mutex_lock(&s->lock);
	while (!s->gate_parked && rc == 0)
		rc = pthread_cond_timedwait(&s->gate_cond, &s->lock, &until);
	rc = s->gate_parked ? 0 : -ETIMEDOUT;
	pthread_mutex_unlock(&s->lock);
	return rc;
}

void pmem_gate_release(struct sbx_sandbox *sb)
{
	struct pmem *s = PMEM(sb);

	pthread_mutex_lock(&s->lock);
	if (s->gate_parked) {
		s->gate_open = true;
		pthread_cond_broadcast(&s->gate_cond);
	} else {
		s->gate_op = -1;
		free(s->gate_path);
		s->gate_path = NULL;
	}
	pthread_mutex_unlock(&s->lock);
}

void pmem_gate_fini(struct pmem *s)
{
	pthread_mutex_lock(&s->lock);
	if (s->gate_parked) {
		s->gate_open = true;
		pthread_cond_broadcast(&s->gate_cond);
		while (s->gate_parked)
			pthread_cond_wait(&s->gate_cond, &s->lock);
	}
	pthread_mutex_unlock(&s->lock);
	free(s->gate_path);
	s->gate_path = NULL;
	pthread_cond_destroy(&s->gate_cond);
}

/* ---- events -------------------------------------------------------------- */

/* Queue a change.  Caller holds s->lock.  `path` NULL for OVERFLOW. */
static struct pevent *emit_locked(struct pmem *s, int kind, const char *path)
{
	struct pevent *e;

	if (!s->watching)
		return NULL;
	e = sbx_xcalloc(1, sizeof(*e));
	e->seq = ++s->seq;
	e->kind = kind;
	e->path = path ? sbx_xstrdup(path) : NULL;
	if (s->ev_tail)
		s->ev_tail->next = e;
	else
		s->ev_head = e;
	s->ev_tail = e;
	s->ev_count++;
	pthread_cond_broadcast(&s->ev_cond);
	return e;
}

void pmem_emit_locked(struct pmem *s, int kind, const char *path)
{
	(void)emit_locked(s, kind, path);
}

void pmem_emit_move_locked(struct pmem *s, const char *from, const char *to,
			   uint64_t ino)
{
	struct pevent *e;

	(void)emit_locked(s, SBX_CHANGE_ENTRY, from);
	e = emit_locked(s, SBX_CHANGE_ENTRY, to);
	if (e && !s->unpaired) {
		e->from = sbx_xstrdup(from);
		e->ino = ino;
	}
}

void pmem_pair_renames(struct sbx_sandbox *sb, bool paired)
{
	struct pmem *s = PMEM(sb);

	pthread_mutex_lock(&s->lock);
	s->unpaired = !paired;
	pthread_mutex_unlock(&s->lock);
}

static void event_free(struct pevent *e)
{
	if (e) {
		free(e->path);
		free(e->from);
		free(e);
	}
}

static void deliver_one(struct pmem *s, sbx_change_cb cb, void *payload,
			struct pevent *e)
{
	struct sbx_change c;

	memset(&c, 0, sizeof(c));
	c.seq = e->seq;
	c.kind = e->kind;
	c.path = e->path;
	c.from_path = e->from;
	if (e->from) {
		c.dev = s->dev;
		c.ino = (ino_t)e->ino;
	}
	if (e->kind == SBX_CHANGE_ENTRY && e->path) {
		const char *slash = strrchr(e->path, '/');

		c.name = slash ? slash + 1 : e->path;
	}
	if (cb)
		cb(&c, payload);
}

/*
 * Deliver queued events with seq <= upto.  Caller holds s->deliver, not
 * s->lock.
 */
static void deliver_upto(struct pmem *s, uint64_t upto)
{
	for (;;) {
		struct pevent *e;
		sbx_change_cb cb;
		void *payload;

		pthread_mutex_lock(&s->lock);
		e = s->ev_head;
		if (!e || e->seq > upto) {
			pthread_mutex_unlock(&s->lock);
			return;
		}
		s->ev_head = e->next;
		if (!s->ev_head)
			s->ev_tail = NULL;
		s->ev_count--;
		cb = s->cb;
		payload = s->cb_payload;
		pthread_mutex_unlock(&s->lock);
		deliver_one(s, cb, payload, e);
		event_free(e);
	}
}

static void *watch_thread(void *arg)
{
	struct pmem *s = arg;

	for (;;) {
		uint64_t upto;

		pthread_mutex_lock(&s->lock);
		while (!s->stopping && (s->held || !s->ev_head))
			pthread_cond_wait(&s->ev_cond, &s->lock);
		if (s->stopping) {
			pthread_mutex_unlock(&s->lock);
			return NULL;
		}
		upto = s->seq;
		pthread_mutex_unlock(&s->lock);
		pthread_mutex_lock(&s->deliver);
		deliver_upto(s, upto);
		pthread_mutex_unlock(&s->deliver);
	}
}

void pmem_watch_hold(struct sbx_sandbox *sb, bool hold)
{
	struct pmem *s = PMEM(sb);

	pthread_mutex_lock(&s->lock);
	s->held = hold;
	pthread_cond_broadcast(&s->ev_cond);
	pthread_mutex_unlock(&s->lock);
}

void pmem_watch_deliver(struct sbx_sandbox *sb, size_t n)
{
	struct pmem *s = PMEM(sb);
	uint64_t upto = 0;

	if (n == 0)
		return;
	pthread_mutex_lock(&s->deliver);
	pthread_mutex_lock(&s->lock);
	/* (Queued events have consecutive numbers.) */
	if (s->ev_head)
		upto = s->ev_head->seq + n - 1;
	pthread_mutex_unlock(&s->lock);
	deliver_upto(s, upto);
	pthread_mutex_unlock(&s->deliver);
}

size_t pmem_watch_pending(struct sbx_sandbox *sb)
{
	struct pmem *s = PMEM(sb);
	size_t n;

	pthread_mutex_lock(&s->lock);
	n = s->ev_count;
	pthread_mutex_unlock(&s->lock);
	return n;
}

void pmem_set_healthy(struct sbx_sandbox *sb, bool healthy)
{
	__atomic_store_n(&PMEM(sb)->healthy, healthy, __ATOMIC_RELEASE);
}

/* ---- watch --------------------------------------------------------------- */

int pmem_op_watch_start(struct sbx_sandbox *sb, sbx_change_cb cb,
			void *payload)
{
	struct pmem *s = PMEM(sb);
	int rc = pmem_enter(s, OP_WATCH_START, "");

	if (rc < 0)
		return rc;
	pthread_mutex_lock(&s->lock);
	if (s->watching) {
		pthread_mutex_unlock(&s->lock);
		return sbx_error_set(SBX_ERR_REMOTE, -EBUSY,
				     "the change stream is already on");
	}
	s->cb = cb;
	s->cb_payload = payload;
	s->stopping = false;
	__atomic_store_n(&s->watching, true, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&s->lock);
	rc = pthread_create(&s->thread, NULL, watch_thread, s);
	if (rc != 0) {
		pthread_mutex_lock(&s->lock);
		__atomic_store_n(&s->watching, false, __ATOMIC_RELEASE);
		s->cb = NULL;
		pthread_mutex_unlock(&s->lock);
		return sbx_error_set(SBX_ERR_OS, -rc,
				     "cannot start the watch thread");
	}
	return 0;
}

int pmem_op_watch_sync(struct sbx_sandbox *sb)
{
	struct pmem *s = PMEM(sb);
	uint64_t upto;
	int rc = pmem_enter(s, OP_WATCH_SYNC, "");

	if (rc < 0)
		return rc;
	pthread_mutex_lock(&s->lock);
	upto = s->seq;
	if (!s->watching) {
		pthread_mutex_unlock(&s->lock);
		return sbx_error_set(SBX_ERR_REMOTE, -EIO,
				     "the change stream is off");
	}
	pthread_mutex_unlock(&s->lock);
	/* Whatever the thread took is delivered once we hold this. */
	pthread_mutex_lock(&s->deliver);
	deliver_upto(s, upto);
	pthread_mutex_unlock(&s->deliver);
	return 0;
}

void pmem_watch_fini(struct pmem *s)
{
	bool joining;

	pthread_mutex_lock(&s->lock);
	joining = s->watching;
	s->stopping = true;
	pthread_cond_broadcast(&s->ev_cond);
	pthread_mutex_unlock(&s->lock);
	if (joining)
		pthread_join(s->thread, NULL);
	pthread_mutex_lock(&s->lock);
	while (s->ev_head) {
		struct pevent *e = s->ev_head;

		s->ev_head = e->next;
		event_free(e);
	}
	s->ev_tail = NULL;
	s->ev_count = 0;
	__atomic_store_n(&s->watching, false, __ATOMIC_RELEASE);
	s->cb = NULL;
	s->cb_payload = NULL;
	pthread_mutex_unlock(&s->lock);
}

void pmem_op_watch_stop(struct sbx_sandbox *sb)
{
	struct pmem *s = PMEM(sb);

	(void)pmem_enter(s, OP_WATCH_STOP, "");
	sbx_error_clear();
	pmem_watch_fini(s);
}

bool pmem_op_watch_healthy(struct sbx_sandbox *sb)
{
	struct pmem *s = PMEM(sb);

	return __atomic_load_n(&s->watching, __ATOMIC_ACQUIRE) &&
	       __atomic_load_n(&s->healthy, __ATOMIC_ACQUIRE);
}
