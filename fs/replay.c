/*
 * The invalidations that a reply which raced a change needs
 * (fs_entry_replay, fs.c), sent by a thread of their own.
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

#include "sbx/log.h"
#include "sbx/xmalloc.h"
#include "fs_i.h"

struct fs_replay_job {
	fuse_ino_t parent;
	char **names;   /* entries to invalidate (owned) */
	size_t n;
	bool lost;      /* and every known child of parent */
	char *name;     /* with lost: this name too (a negative entry) */
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

static void job_run(struct fs *fs, const struct fs_replay_job *j)
{
	fuse_ino_t parent = j->parent;

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
		pthread_mutex_unlock(&fs->replay_lock);
		job_run(fs, j);
		job_free(j);
		pthread_mutex_lock(&fs->replay_lock);
	}
	pthread_mutex_unlock(&fs->replay_lock);
	return NULL;
}

void fs_replay_init(struct fs *fs)
{
	pthread_mutex_init(&fs->replay_lock, NULL);
	pthread_cond_init(&fs->replay_cond, NULL);
	fs->replay_head = fs->replay_tail = NULL;
	fs->replay_started = fs->replay_stop = false;
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

/*
 * Abort our FUSE connection (fusectl): every request still waiting fails,
 * and a process that held a directory's lock while it waited lets go.
 */
static void abort_connection(struct fs *fs)
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
			abort_connection(fs);
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
			if (q->lost && q->parent == parent &&
			    (!j->name ||
			     (q->name && !strcmp(q->name, j->name)))) {
				pthread_mutex_unlock(&fs->replay_lock);
				job_free(j);
				return;
			}
	}
	if (fs->replay_tail)
		fs->replay_tail->next = j;
	else
		fs->replay_head = j;
	fs->replay_tail = j;
	pthread_cond_signal(&fs->replay_cond);
	pthread_mutex_unlock(&fs->replay_lock);
}
