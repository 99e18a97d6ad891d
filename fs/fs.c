/*
 * The daemon: mount, serve, apply the change stream, unmount.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "sbx/fs.h"
#include "sbx/log.h"
#include "sbx/xmalloc.h"
#include "sbx/paths.h"
#include "sbx/waitfd.h"
#include "cache.h"
#include "fs_ctl.h"
#include "fs_i.h"

/* Kernel cache timeouts: FS_TIMEOUT_* in fs_i.h (docs/design.md, "Local
 * cache rule"). */
bool fs_healthy(struct fs *fs)
{
	if (!fs->watching)
		return false;
	return !fs->sb->ops->watch_healthy || fs->sb->ops->watch_healthy(fs->sb);
}

double fs_timeout(struct fs *fs)
{
	return fs_healthy(fs) ? FS_TIMEOUT_WATCHED : FS_TIMEOUT_BLIND;
}

struct sbx_sandbox *fs_sandbox(struct fs *fs)
{
	return fs->sb;
}

const char *fs_session(struct fs *fs)
{
	return fs->session;
}

const char *fs_mountpoint(struct fs *fs)
{
	return fs->mountpoint;
}

static void inval_all_one(struct fs *fs, fuse_ino_t ino, fuse_ino_t parent,
			  const char *name, void *payload)
{
	if (parent && name)
		fuse_lowlevel_notify_inval_entry(fs->se, parent, name,
						 strlen(name));
	fuse_lowlevel_notify_inval_inode(fs->se, ino, 0, 0);
}

/* Forget every cached entry, attribute and page (events were lost, or,
 * without a change stream, a command ran in the sandbox). */
void fs_invalidate_everything(struct fs *fs)
{
	fs_inode_foreach(fs, inval_all_one, NULL);
	fs_negatives_invalidate(fs);
}

/*
 * Events were lost while the kernel had long timeouts: a reply built
 * before invalidate_everything() and sent after it would install what it
 * read for as long, so its replay (fs_entry_replay) must count every
 * change as lost.  (Not for the blind mode's barrier: its timeouts are
 * short, and every directory handle's next listing would walk all
 * inodes.)
 */
static void entries_all_changed(struct fs *fs)
{
	pthread_mutex_lock(&fs->lock);
	__atomic_store_n(&fs->entry_gen, fs->entry_gen + FS_RECENT_ENTRIES + 1,
			 __ATOMIC_RELEASE);
	pthread_mutex_unlock(&fs->lock);
}

uint64_t fs_entry_gen(struct fs *fs)
{
	return __atomic_load_n(&fs->entry_gen, __ATOMIC_ACQUIRE);
}

/* Remember an entry change for replies racing it. */
static void note_entry_change(struct fs *fs, fuse_ino_t parent,
			      const char *name)
{
	struct fs_recent_entry *r;

	pthread_mutex_lock(&fs->lock);
	r = &fs->recent[(fs->entry_gen + 1) % FS_RECENT_ENTRIES];
	free(r->name);
	r->parent = parent;
	r->name = sbx_xstrdup(name);
	__atomic_store_n(&fs->entry_gen, fs->entry_gen + 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&fs->lock);
}

void fs_entry_replay(struct fs *fs, fuse_ino_t parent, const char *name,
		     uint64_t since)
{
	char **names;
	size_t n = 0;
	bool lost;

	if (fs_entry_gen(fs) == since)
		return; /* nothing changed meanwhile: the usual case */
	names = sbx_xcalloc(FS_RECENT_ENTRIES, sizeof(*names));
	pthread_mutex_lock(&fs->lock);
	lost = fs->entry_gen - since > FS_RECENT_ENTRIES;
	for (uint64_t g = since + 1; !lost && g <= fs->entry_gen; g++) {
		const struct fs_recent_entry *r =
			&fs->recent[g % FS_RECENT_ENTRIES];

		if (r->parent == parent)
			names[n++] = sbx_xstrdup(r->name);
	}
	pthread_mutex_unlock(&fs->lock);
	if (!lost && n == 0) {
		free(names);
		return;
	}
	/* Sent by the replay thread (replay.c: sent here, they could take
	 * every FUSE worker while a listing holds the directory's lock). */
	fs_replay_queue(fs, parent, names, n, lost, name);
}

void fs_apply_change(const struct sbx_change *c, void *payload)
{
	struct fs *fs = payload;
	fuse_ino_t parent, ino;
	/* The objects the name held, and the one it holds now. */
	fuse_ino_t obj[FS_NAME_TAKE_MAX + 1];
	size_t nobj;
	unsigned writers;
	bool data;

	switch (c->kind) {
	case SBX_CHANGE_ENTRY:
		/* (No directory: a change about the object alone.) */
		parent = c->dir_ino ? fs_inode_find(fs, c->dir_dev, c->dir_ino,
						    NULL)
				    : 0;
		nobj = parent && c->name
			       ? fs_names_take(fs, parent, c->name, obj,
						 FS_NAME_TAKE_MAX)
			       : 0;
		/* The object the name holds, when the provider knows it: a
		 * link made to a file the kernel knows by another name,
		 * maybe in a directory the kernel has not seen. */
		if (c->ino && (ino = fs_inode_attr_changed(fs, c->dev, c->ino)))
			obj[nobj++] = ino;
		if (!parent || !c->name)
			goto objects;
		/* (Off the list first: a LOOKUP answered after the
		 * invalidation lists the name again, and stays.) */
		fs_negative_drop(fs, parent, c->name);
		note_entry_change(fs, parent, c->name);
	objects:
		/*
		 * The dentry (positive or negative), the directory's
		 * attributes and listing, and the attributes of the objects
		 * the name held or holds: their link count and ctime
		 * changed, and a change stream watches directories, which
		 * see no attribute event for that (inotify tells only a
		 * watch on the file itself).  Pages stay.  Sent by the
		 * replay thread (replay.c says why).
		 */
		fs_notify_change(fs, parent && c->name ? parent : 0, c->name,
				 obj, NULL, nobj);
		break;
	case SBX_CHANGE_DATA:
	case SBX_CHANGE_ATTR:
		ino = fs_inode_find(fs, c->dev, c->ino, &writers);
		if (!ino)
			return;
		/*
		 * While the file is open for writing through the mount, its
		 * pages are the writer's own (write-through): keep them and
		 * refresh attributes only.  Concurrent writes from both sides
		 * of the mount are as undefined here as on NFS.
		 */
		data = c->kind == SBX_CHANGE_DATA && !writers;
		fs_notify_change(fs, 0, NULL, &ino, &data, 1);
		break;
	case SBX_CHANGE_OVERFLOW:
		sbx_info("change stream overflowed: invalidating all caches");
		entries_all_changed(fs);
		fs_notify_everything(fs);
		break;
	}
}

void fs_ping(struct fs *fs)
{
	pthread_mutex_lock(&fs->lock);
	pthread_mutex_unlock(&fs->lock);
}

int fs_barrier_before(struct fs *fs)
{
	int fd, rc = 0;

	/*
	 * Writes through the mount are write-through, except dirty pages of
	 * shared writable mappings: syncfs() makes the kernel write them back
	 * (as WRITE requests our workers serve) before the command starts.
	 */
	fd = open(fs->mountpoint, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return sbx_error_os("exec barrier: open %s", fs->mountpoint);
	if (syncfs(fd) < 0)
		rc = sbx_error_os("exec barrier: syncfs %s", fs->mountpoint);
	close(fd);
	/* Then what the caching layer holds back. */
	if (rc == 0 && fs->sb->ops->syncfs)
		rc = fs->sb->ops->syncfs(fs->sb);
	return rc;
}

int fs_barrier_after(struct fs *fs)
{
	int rc = 0;

	pthread_mutex_lock(&fs->barrier_lock);
	if (fs->watching) {
		rc = fs->sb->ops->watch_sync(fs->sb);
		/* The kernel's copies of what changed are dropped by the
		 * replay thread: before the caller reads them. */
		if (rc == 0 &&
		    fs_notify_drain(fs, FS_NOTIFY_DRAIN_MS) < 0)
			sbx_warn("exec barrier: the kernel's caches of some "
				 "changes are not dropped yet (a process "
				 "holds them)");
	} else
		fs_invalidate_everything(fs);
	pthread_mutex_unlock(&fs->barrier_lock);
	return rc;
}

static int open_cache(struct fs *fs, const char *session)
{
	char *dir = NULL;
	int rc = sbx_paths_session_file(&dir, "cache", session, "");

	if (rc < 0) {
		sbx_warn("no disk content cache: %s", sbx_error_last()->msg);
		sbx_error_clear();
	}
	rc = fs_cache_new(&fs->cache, fs->sb, dir);
	free(dir);
	if (rc < 0)
		return rc;
	fs->sb = fs->cache;
	fs->cached = true;
	return 0;
}

static void notify_ready(int fd)
{
	char ok = 0;

	if (fd < 0)
		return;
	if (write(fd, &ok, 1) < 0)
		sbx_warn("could not signal readiness: %s", strerror(errno));
	close(fd);
}

/*
 * The device (mountinfo's "major:minor") of the newest sbx mount of
 * `session`, 0 when there is none.  Read from mountinfo because a stat of
 * our own mountpoint would wait for a loop that is not running yet.
 */
static dev_t mount_dev(const char *session)
{
	char line[4096], want[300];
	unsigned maj, min;
	dev_t dev = 0;
	FILE *f;

	snprintf(want, sizeof(want), " - fuse.sbx sbx:%s ", session);
	f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		if (strstr(line, want) &&
		    sscanf(line, "%*u %*u %u:%u", &maj, &min) == 2)
			dev = makedev(maj, min);
	}
	fclose(f);
	return dev;
}

/* True while any mount of device `dev` is in our mount namespace. */
static bool dev_mounted(dev_t dev)
{
	char line[4096];
	unsigned maj, min;
	bool found = false;
	FILE *f = fopen("/proc/self/mountinfo", "re");

	if (!f)
		return true; /* cannot tell: assume it is */
	while (!found && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%*u %*u %u:%u", &maj, &min) == 2 &&
		    makedev(maj, min) == dev)
			found = true;
	}
	fclose(f);
	return found;
}

/*
 * Read-ahead.  The kernel caps FUSE read-ahead at the bdi's read_ahead_kb,
 * 128 KiB by default, far below what the backend streams; we raise it
 * where we may (root; best effort).  Not before the INIT reply: the kernel
 * offers the bdi's setting of mount time in INIT and, on the reply, lowers
 * the bdi to what was offered, undoing an earlier write.  So a thread,
 * started once the mount exists, stats the mount root: the kernel holds
 * every request until INIT is answered, so when the stat returns, the cap
 * is in place and the write sticks.  Not on a FUSE worker (the stat needs
 * one to answer it), and nothing waits for it; it owns a copy of what it
 * needs, so it may outlive the session (a mount that fails to come up
 * fails its stat).
 */
struct readahead_job {
	char *mountpoint;
	dev_t dev;
	unsigned kib;
};

static void *readahead_thread(void *arg)
{
	struct readahead_job *j = arg;
	char path[64];
	struct stat st;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb",
		 major(j->dev), minor(j->dev));
	if (stat(j->mountpoint, &st) == 0 && st.st_dev == j->dev &&
	    (f = fopen(path, "we"))) {
		fprintf(f, "%u\n", j->kib);
		if (fclose(f) != 0)
			sbx_debug("%s: %s", path, strerror(errno));
	}
	free(j->mountpoint);
	free(j);
	return NULL;
}

static void start_readahead(struct fs *fs)
{
	struct readahead_job *j;
	pthread_attr_t attr;
	pthread_t t;
	int err;

	if (!fs->dev || !fs->mountpoint)
		return;
	j = sbx_xcalloc(1, sizeof(*j));
	j->mountpoint = sbx_xstrdup(fs->mountpoint);
	j->dev = fs->dev;
	/* Remote: more in flight hides the round trip (8 MiB = 8 reads). */
	j->kib = fs->cached ? 8192 : 1024;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	err = pthread_create(&t, &attr, readahead_thread, j);
	if (err != 0) {
		sbx_debug("no read-ahead thread: %s", strerror(err));
		free(j->mountpoint);
		free(j);
	}
	pthread_attr_destroy(&attr);
}

/*
 * Noticing a lazy unmount.  `umount -l` (`sbx umount --force` of a busy
 * mount, `fusermount3 -u -z`) detaches the mount at once, but the kernel
 * keeps the connection up while a process still has a file or working
 * directory in it, so the loop would never end.  A thread waits for mount
 * table changes (mountinfo polls POLLPRI on each); when no mount of our
 * device is left, it ends the loop: fuse_session_exit(), then a signal to
 * the loop's thread, which sleeps in sem_wait() (EINTR) until a worker
 * ends.  The signal is repeated until the loop is over, because one sent
 * just before sem_wait() is lost.
 */
#define DETACH_KICK_MS 20

static void wake_handler(int sig)
{
	(void)sig;
}

static void *detach_thread(void *arg)
{
	struct fs *fs = arg;
	sigset_t all;
	int mi;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	mi = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
	if (mi < 0)
		return NULL;
	for (;;) {
		short ev;

		/* Stopped (the wake pipe) or poll failed: give up watching. */
		if (sbx_waitfd(mi, POLLPRI, fs->detach_wake[0], -1, &ev) !=
		    SBX_WAITFD_READY)
			break;
		if (!(ev & (POLLPRI | POLLERR)) || dev_mounted(fs->dev))
			continue;
		sbx_info("session %s: no longer mounted; stopping",
			 fs->session);
		__atomic_store_n(&fs->detached, true, __ATOMIC_RELEASE);
		fuse_session_exit(fs->se);
		while (!__atomic_load_n(&fs->loop_done, __ATOMIC_ACQUIRE)) {
			pthread_kill(fs->main_thread, SIGUSR1);
			if (sbx_waitfd(-1, 0, fs->detach_wake[0],
				       DETACH_KICK_MS, NULL) == SBX_WAITFD_WOKEN)
				break;
		}
		break;
	}
	sbx_error_clear(); /* a failed poll ends the watch, nothing more */
	close(mi);
	return NULL;
}

static void start_detach_watch(struct fs *fs)
{
	/* No SA_RESTART: the kernel would restart the futex wait. */
	struct sigaction sa = { .sa_handler = wake_handler };
	int rc;

	if (!fs->dev || pipe2(fs->detach_wake, O_CLOEXEC) < 0)
		return;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	fs->main_thread = pthread_self();
	rc = pthread_create(&fs->detach_thread, NULL, detach_thread, fs);
	if (rc != 0) {
		sbx_warn("no lazy-unmount watch: %s", strerror(rc));
		return;
	}
	fs->detach_started = true;
}

static void stop_detach_watch(struct fs *fs)
{
	__atomic_store_n(&fs->loop_done, true, __ATOMIC_RELEASE);
	if (fs->detach_started) {
		if (write(fs->detach_wake[1], "x", 1) < 0) {
			/* a fresh pipe has room */
		}
		pthread_join(fs->detach_thread, NULL);
		fs->detach_started = false;
	}
	for (int i = 0; i < 2; i++) {
		if (fs->detach_wake[i] >= 0)
			close(fs->detach_wake[i]);
		fs->detach_wake[i] = -1;
	}
}

/*
 * Each inode the kernel holds costs a descriptor (the local provider's
 * O_PATH node), so the usual soft limit of 1024 is far too low: raise it
 * to the hard limit, and with privilege to 1M, as passthrough_hp does.
 */
static void raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	if (rl.rlim_max < (1u << 20)) {
		struct rlimit big = {1u << 20, 1u << 20};

		if (setrlimit(RLIMIT_NOFILE, &big) == 0)
			return;
	}
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
		sbx_warn("cannot raise the descriptor limit: %s",
			 strerror(errno));
}

static int start_watch(struct fs *fs)
{
	int rc;

	fs->watching = false;
	if (!fs->sb->ops->watch_start)
		return 0;
	rc = fs->sb->ops->watch_start(fs->sb, fs_apply_change, fs);
	if (rc < 0) {
		/* Still correct, only slower: short timeouts. */
		sbx_warn("no change stream (%s); caching for %.0f s only",
			 sbx_error_last()->msg, FS_TIMEOUT_BLIND);
		sbx_error_clear();
		return 0;
	}
	fs->watching = true;
	return 0;
}

/*
 * The end of the session after the FUSE loop ended: nothing answers
 * requests any more.  An invalidation of ours still in flight (the change
 * stream's, the replay thread's) may wait for a page that a reader holds
 * while its READ waits for an answer: the thread that sent it then never
 * returns, its join hangs, and killed, the daemon stays a zombie with the
 * reader stuck in D state for good (stress test: `sbx down` while a
 * process read files the sandbox was changing).  If the end takes longer
 * than EXIT_WATCHDOG_S, the connection is aborted: the waiting requests
 * fail, and the invalidation returns.
 */
#define EXIT_WATCHDOG_S 3

struct exit_watchdog {
	struct fs *fs;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool started, done;
};

static void *exit_watchdog_main(void *arg)
{
	struct exit_watchdog *x = arg;
	struct timespec until;
	bool fire;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += EXIT_WATCHDOG_S;
	pthread_mutex_lock(&x->lock);
	while (!x->done && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&x->cond, &x->lock, &until);
	fire = !x->done;
	pthread_mutex_unlock(&x->lock);
	if (fire) {
		sbx_warn("the end of the session is stuck (an invalidation "
			 "waits for a request nobody answers now): aborting "
			 "the FUSE connection");
		fs_abort_connection(x->fs);
	}
	return NULL;
}

static void exit_watchdog_start(struct exit_watchdog *x, struct fs *fs)
{
	x->fs = fs;
	x->done = false;
	pthread_mutex_init(&x->lock, NULL);
	pthread_cond_init(&x->cond, NULL);
	x->started = pthread_create(&x->thread, NULL, exit_watchdog_main,
				    x) == 0;
	if (!x->started)
		sbx_warn("cannot start the exit watchdog: the end of the "
			 "session is not bounded");
}

static void exit_watchdog_stop(struct exit_watchdog *x)
{
	if (!x->started)
		return;
	pthread_mutex_lock(&x->lock);
	x->done = true;
	pthread_cond_broadcast(&x->cond);
	pthread_mutex_unlock(&x->lock);
	pthread_join(x->thread, NULL);
	pthread_cond_destroy(&x->cond);
	pthread_mutex_destroy(&x->lock);
	x->started = false;
}

int fs_daemon_run(const struct fs_options *o)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct exit_watchdog watchdog = {0};
	struct fuse_loop_config *loop = NULL;
	struct fs fs;
	struct stat st;
	char *opts = NULL;
	bool mounted = false, handlers = false;
	int rc;

	memset(&fs, 0, sizeof(fs));
	fs.detach_wake[0] = fs.detach_wake[1] = -1;
	fs.sb = o->sandbox;
	if (o->cache) {
		/* The decorator the caller chose (-EINVAL if it cannot). */
		rc = open_cache(&fs, o->session);
		if (rc < 0)
			return rc;
	}
	fs.session = o->session;
	fs.mountpoint = o->mountpoint;
	if (o->control_socket)
		fs.control_socket = sbx_xstrdup(o->control_socket);
	pthread_mutex_init(&fs.lock, NULL);
	pthread_mutex_init(&fs.barrier_lock, NULL);
	fs_negatives_init(&fs);
	fs_replay_init(&fs);
	fs_inodes_init(&fs);

	fs.root.node = fs.sb->ops->root(fs.sb);
	rc = fs.sb->ops->getattr(fs.sb, fs.root.node, NULL, &st);
	if (rc < 0) {
		rc = sbx_error_prefix(rc, "sandbox root of session %s",
				      o->session);
		goto out;
	}
	fs.root.dev = st.st_dev;
	fs.root.ino = st.st_ino;
	fs.root.nlookup = 2;
	fs.zero_open = fs.sb->ops->file_fd != NULL;

	/* Modes from the kernel are already masked by the caller's umask. */
	umask(0);
	raise_fd_limit();

	/* default_permissions always: with allow_other the kernel checks
	 * every user's access against the modes we report. */
	opts = sbx_xasprintf("fsname=sbx:%s,subtype=sbx,default_permissions%s",
			     o->session, o->allow_other ? ",allow_other" : "");
	if (fuse_opt_add_arg(&args, "sbx") != 0 ||
	    fuse_opt_add_arg(&args, "-o") != 0 ||
	    fuse_opt_add_arg(&args, opts) != 0 ||
	    (o->debug && fuse_opt_add_arg(&args, "-d") != 0)) {
		rc = sbx_error_set(SBX_ERR_INTERNAL, -ENOMEM,
				   "cannot build FUSE arguments");
		goto out;
	}
	fs.se = fuse_session_new(&args, &fs_ops, sizeof(fs_ops), &fs);
	if (!fs.se) {
		rc = sbx_error_set(SBX_ERR_OS, -EIO,
				   "cannot create the FUSE session (is "
				   "/dev/fuse available?)");
		goto out;
	}
	if (fuse_set_signal_handlers(fs.se) != 0) {
		rc = sbx_error_set(SBX_ERR_OS, -EIO,
				   "cannot install signal handlers");
		goto out;
	}
	handlers = true;
	if (fuse_session_mount(fs.se, o->mountpoint) != 0) {
		if (o->allow_other && geteuid() != 0) {
			rc = sbx_error_set(SBX_ERR_CONFIG, -EPERM,
					   "cannot mount %s with allow_other: "
					   "a user other than root needs "
					   "user_allow_other in /etc/fuse.conf",
					   o->mountpoint);
			goto out;
		}
		rc = sbx_error_set(SBX_ERR_OS, -EIO,
				   "cannot mount %s (see the log above; is it "
				   "an existing directory, and is /dev/fuse "
				   "usable?)", o->mountpoint);
		goto out;
	}
	mounted = true;
	fs.dev = mount_dev(o->session);
	start_readahead(&fs);

	rc = start_watch(&fs);
	if (rc < 0)
		goto out;
	if (o->control_socket) {
		rc = fs_ctl_start(&fs, o->control_socket, &fs.ctl);
		if (rc < 0)
			goto out;
	}
	sbx_info("serving session %s at %s (%s caching)", o->session,
		 o->mountpoint, fs.watching ? "change-stream" : "short-timeout");
	notify_ready(o->ready_fd);
	start_detach_watch(&fs);
	if (fs_replay_start(&fs) < 0) {
		sbx_warn("%s; replies that raced a change are fixed up by "
			 "the FUSE workers", sbx_error_last()->msg);
		sbx_error_clear();
	}

	loop = fuse_loop_cfg_create();
	fuse_loop_cfg_set_clone_fd(loop, 1);
	fuse_loop_cfg_set_max_threads(loop, o->max_threads ? o->max_threads
							   : 16);
	fuse_loop_cfg_set_idle_threads(loop, 4);
	rc = fuse_session_loop_mt(fs.se, loop);
	exit_watchdog_start(&watchdog, &fs);
	stop_detach_watch(&fs);
	if (rc != 0 && !fs.detached)
		sbx_warn("FUSE loop ended with %d", rc);
	rc = 0;

out:
	stop_detach_watch(&fs);
	fuse_loop_cfg_destroy(loop);
	fs_ctl_stop(fs.ctl);
	if (fs.watching)
		fs.sb->ops->watch_stop(fs.sb);
	/*
	 * Not when it is gone already (a lazy unmount, or an abort): the
	 * unmount would go by path, and fail, or detach a newer mount there.
	 * fuse_session_destroy() closes the connection.
	 */
	if (mounted && (!fs.dev || dev_mounted(fs.dev)))
		fuse_session_unmount(fs.se);
	fs_replay_fini(&fs);
	exit_watchdog_stop(&watchdog);
	if (handlers)
		fuse_remove_signal_handlers(fs.se);
	if (fs.se)
		fuse_session_destroy(fs.se);
	fuse_opt_free_args(&args);
	free(opts);
	fs_inodes_fini(&fs);
	for (size_t i = 0; i < FS_RECENT_ENTRIES; i++)
		free(fs.recent[i].name);
	free(fs.control_socket);
	sbx_sandbox_free(fs.cache);
	pthread_mutex_destroy(&fs.lock);
	pthread_mutex_destroy(&fs.barrier_lock);
	fs_negatives_fini(&fs);
	return rc;
}
