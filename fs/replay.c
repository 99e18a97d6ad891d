/*
 * The kernel notifications of the change stream (fs_notify_change,
 * fs_notify_everything) and the invalidations that a reply which raced a
 * change needs (fs_entry_replay, fs.c), sent by a thread of their own.
 *
 * Why not by the change stream's thread: a FUSE handler may wait for the
 * stream (a barrier: a read, stat, listing or push that met a path its
 * file left asks the stream where it went, wb_io_again), and while it
 * waits the kernel holds what the handler's request came with -- a page
 * of the file read, a directory's lock.  An invalidation of that page or
 * entry sent by the stream's thread then waited for the kernel, the
 * kernel for the handler, the handler for the stream: a read stalled for
 * the barrier's timeout, 30 s, up to 8 times in a row, and a `sbx down`
 * meanwhile left the daemon a zombie and the reader unkillable (stress
 * test: a directory removed and made again in the sandbox while its files
 * were read).  The stream's thread now only updates the cache and queues;
 * this thread may wait for the kernel, and nothing any handler waits for
 * waits for this thread (the exec barrier waits here, fs_notify_drain,
 * from the control thread).
 *
 * Why a thread: an entry invalidation waits for its directory's lock, and
 * a process listing that directory holds that lock (shared) while it waits
 * for READDIR answers.  Sent by the FUSE worker that had just answered the
 * previous chunk, each replay kept a worker; a long listing of a big
 * directory that changed in the sandbox meanwhile parked every worker
 * there (one replay per chunk, each invalidating every known child once
 * more than FS_RECENT_ENTRIES changes had come), and nobody was left to
 * answer the READDIR the lock holder waited for: the whole mount hung
 * (stress test: `ls` of 20,000 files made through the mount while a
 * command in the sandbox kept touching one).  Queued, a replay waits for
 * the lock on this thread, and the workers stay free to answer.
 *
 * Order is kept: a job is queued after its reply was sent, and the kernel
 * takes a reply in under the directory's lock, which the invalidation
 * waits for, so it still lands after the stale data.  A whole-directory
 * job ("lost": every known child) still queued absorbs later jobs for the
 * same directory.
 *
 * Locking: fs->replay_lock is a leaf; no notification is sent and no
 * other lock taken while it is held.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "sbx/clock.h"
#include "sbx/log.h"
#include "sbx/xmalloc.h"
#include "fs_i.h"

enum job_kind {
	JOB_REPLAY,     /* fs_replay_queue */
	JOB_CHANGE,     /* fs_notify_change */
	JOB_EVERYTHING, /* fs_notify_everything */
};

struct fs_replay_job {
	enum job_kind kind;
	fuse_ino_t parent;
	char **names;   /* entries to invalidate (owned) */
	size_t n;
	bool lost;      /* and every known child of parent */
	char *name;     /* with lost: this name too (a negative entry);
			 * JOB_CHANGE: the entry to drop, or NULL */
	/* JOB_CHANGE: inodes to invalidate, pages too where data[i]. */
	fuse_ino_t objs[FS_NAME_TAKE_MAX + 1];
	bool data[FS_NAME_TAKE_MAX + 1];
	size_t nobjs;
	struct fs_replay_job *next;
};

static void job_free(struct fs_replay_job *j)
{
	for (size_t i = 0; i < j->n; i++)
		free(j->names[i]);
	free(j->names);
	free(j->name);
	free(j);
}

/* fs_inode_foreach callback: drop the dentry of a child of *payload. */
static void inval_child_of(struct fs *fs, fuse_ino_t ino, fuse_ino_t parent,
			   const char *name, void *payload)
{
	(void)ino;
	if (name && parent == *(const fuse_ino_t *)payload)
		fuse_lowlevel_notify_inval_entry(fs->se, parent, name,
						 strlen(name));
}

/* A change the stream reported (fs_apply_change). */
static void change_run(struct fs *fs, const struct fs_replay_job *j)
{
	if (j->parent && j->name) {
		/* Drops the dentry (positive or negative)... */
		fuse_lowlevel_notify_inval_entry(fs->se, j->parent, j->name,
						 strlen(j->name));
		/* ...and the directory's attributes and listing... */
		fuse_lowlevel_notify_inval_inode(fs->se, j->parent, 0, 0);
	}
	/* ...and the objects' attributes (pages too where said). */
	for (size_t i = 0; i < j->nobjs; i++)
		fuse_lowlevel_notify_inval_inode(fs->se, j->objs[i],
						 j->data[i] ? 0 : -1, 0);
}

static void job_run(struct fs *fs, const struct fs_replay_job *j)
{
	fuse_ino_t parent = j->parent;

	if (j->kind == JOB_CHANGE) {
		change_run(fs, j);
		return;
	}
	if (j->kind == JOB_EVERYTHING) {
		fs_invalidate_everything(fs);
		return;
	}

	for (size_t i = 0; i < j->n; i++)
		fuse_lowlevel_notify_inval_entry(fs->se, parent, j->names[i],
						 strlen(j->names[i]));
	if (j->lost) {
		/* Too many changes to tell which: every known child, and the
		 * name the reply was about (a negative entry has no inode). */
		fs_inode_foreach(fs, inval_child_of, &parent);
		if (j->name)
			fuse_lowlevel_notify_inval_entry(fs->se, parent,
							 j->name,
							 strlen(j->name));
	}
	fuse_lowlevel_notify_inval_inode(fs->se, parent, 0, 0);
}

static void *replay_thread(void *arg)
{
	struct fs *fs = arg;

	pthread_mutex_lock(&fs->replay_lock);
	for (;;) {
		struct fs_replay_job *j;

		while (!fs->replay_head && !fs->replay_stop)
			pthread_cond_wait(&fs->replay_cond, &fs->replay_lock);
		if (fs->replay_stop)
			break;
		j = fs->replay_head;
		fs->replay_head = j->next;
		if (!fs->replay_head)
			fs->replay_tail = NULL;
		fs->replay_busy = true;
		pthread_mutex_unlock(&fs->replay_lock);
		job_run(fs, j);
		job_free(j);
		pthread_mutex_lock(&fs->replay_lock);
		fs->replay_busy = false;
		/* (fs_notify_drain waits for this.) */
		pthread_cond_broadcast(&fs->replay_cond);
	}
	pthread_mutex_unlock(&fs->replay_lock);
	return NULL;
}

void fs_replay_init(struct fs *fs)
{
	pthread_mutex_init(&fs->replay_lock, NULL);
	pthread_cond_init(&fs->replay_cond, NULL);
	fs->replay_head = fs->replay_tail = NULL;
	fs->replay_started = fs->replay_stop = fs->replay_busy = false;
}

int fs_replay_start(struct fs *fs)
{
	int rc = pthread_create(&fs->replay_thread, NULL, replay_thread, fs);

	if (rc != 0)
		return sbx_error_set(SBX_ERR_INTERNAL, -rc,
				     "cannot start the replay thread: %s",
				     strerror(rc));
	fs->replay_started = true;
	return 0;
}

void fs_abort_connection(struct fs *fs)
{
	char path[96];
	int fd;

	/* The connection is named by the kernel's device number, which
	 * for FUSE's anonymous devices (major 0) is the minor. */
	if (!fs->dev || major(fs->dev) != 0) {
		sbx_error("cannot abort the FUSE connection: unknown device");
		return;
	}
	snprintf(path, sizeof(path), "/sys/fs/fuse/connections/%u/abort",
		 minor(fs->dev));
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "1", 1) != 1)
		sbx_error("cannot abort the FUSE connection (%s): %s", path,
			  strerror(errno));
	if (fd >= 0)
		close(fd);
}

void fs_replay_fini(struct fs *fs)
{
	if (fs->replay_started) {
		struct timespec until;

		pthread_mutex_lock(&fs->replay_lock);
		fs->replay_stop = true;
		pthread_cond_broadcast(&fs->replay_cond);
		pthread_mutex_unlock(&fs->replay_lock);
		/*
		 * An invalidation in flight may wait for a directory whose
		 * lister waits for an answer: with the FUSE loop ended, none
		 * will come until the connection goes.
		 */
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += 2;
		if (pthread_timedjoin_np(fs->replay_thread, NULL, &until) !=
		    0) {
			sbx_warn("an invalidation still waits for a directory "
				 "that a process lists: aborting the FUSE "
				 "connection");
			fs_abort_connection(fs);
			pthread_join(fs->replay_thread, NULL);
		}
		fs->replay_started = false;
	}
	/* Left over at the end of the session: nobody to tell. */
	while (fs->replay_head) {
		struct fs_replay_job *j = fs->replay_head;

		fs->replay_head = j->next;
		job_free(j);
	}
	fs->replay_tail = NULL;
	pthread_cond_destroy(&fs->replay_cond);
	pthread_mutex_destroy(&fs->replay_lock);
}

static void enqueue_locked(struct fs *fs, struct fs_replay_job *j);

void fs_replay_queue(struct fs *fs, fuse_ino_t parent, char **names,
		     size_t n, bool lost, const char *name)
{
	struct fs_replay_job *j = sbx_xcalloc(1, sizeof(*j));

	j->parent = parent;
	j->names = names;
	j->n = n;
	j->lost = lost;
	j->name = lost && name ? sbx_xstrdup(name) : NULL;
	if (!fs->replay_started) {
		/* No thread (tests, or it could not start): here. */
		job_run(fs, j);
		job_free(j);
		return;
	}
	pthread_mutex_lock(&fs->replay_lock);
	if (lost) {
		/* A whole-directory job still queued covers this one, but
		 * not the name of a negative entry it does not know. */
		for (struct fs_replay_job *q = fs->replay_head; q;
		     q = q->next)
			if (q->kind == JOB_REPLAY && q->lost &&
			    q->parent == parent &&
			    (!j->name ||
			     (q->name && !strcmp(q->name, j->name)))) {
				pthread_mutex_unlock(&fs->replay_lock);
				job_free(j);
				return;
			}
	}
	enqueue_locked(fs, j);
	pthread_mutex_unlock(&fs->replay_lock);
}

/* Append j to the queue.  fs->replay_lock held. */
static void enqueue_locked(struct fs *fs, struct fs_replay_job *j)
{
	if (fs->replay_tail)
		fs->replay_tail->next = j;
	else
		fs->replay_head = j;
	fs->replay_tail = j;
	pthread_cond_broadcast(&fs->replay_cond);
}

/* Send j from the thread, or here when it is not running (tests). */
static void send_or_queue(struct fs *fs, struct fs_replay_job *j)
{
	pthread_mutex_lock(&fs->replay_lock);
	if (fs->replay_started && !fs->replay_stop) {
		enqueue_locked(fs, j);
		pthread_mutex_unlock(&fs->replay_lock);
		return;
	}
	pthread_mutex_unlock(&fs->replay_lock);
	job_run(fs, j);
	job_free(j);
}

void fs_notify_change(struct fs *fs, fuse_ino_t parent, const char *name,
		      const fuse_ino_t *objs, const bool *data, size_t nobjs)
{
	struct fs_replay_job *j = sbx_xcalloc(1, sizeof(*j));

	j->kind = JOB_CHANGE;
	j->parent = parent;
	j->name = parent && name ? sbx_xstrdup(name) : NULL;
	for (size_t i = 0; i < nobjs && j->nobjs < FS_NAME_TAKE_MAX + 1;
	     i++) {
		bool seen = objs[i] == parent && j->name;

		for (size_t k = 0; k < j->nobjs && !seen; k++)
			seen = j->objs[k] == objs[i];
		if (seen)
			continue;
		j->objs[j->nobjs] = objs[i];
		j->data[j->nobjs++] = data && data[i];
	}
	send_or_queue(fs, j);
}

void fs_notify_everything(struct fs *fs)
{
	struct fs_replay_job *j = sbx_xcalloc(1, sizeof(*j));

	j->kind = JOB_EVERYTHING;
	send_or_queue(fs, j);
}

int fs_notify_drain(struct fs *fs, int timeout_ms)
{
	/* (replay_cond waits on CLOCK_REALTIME, the default.) */
	struct timespec until = sbx_clock_deadline(CLOCK_REALTIME, timeout_ms);
	int rc = 0;

	pthread_mutex_lock(&fs->replay_lock);
	while (fs->replay_started && !fs->replay_stop &&
	       (fs->replay_head || fs->replay_busy) && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&fs->replay_cond,
					    &fs->replay_lock, &until);
	if (fs->replay_started && !fs->replay_stop &&
	    (fs->replay_head || fs->replay_busy))
		rc = -ETIMEDOUT;
	else
		rc = 0;
	pthread_mutex_unlock(&fs->replay_lock);
	return rc;
}
