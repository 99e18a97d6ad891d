/*
 * Recursive inotify over a directory tree, reported as paths.
 *
 * One inotify watch per directory beneath `root`; a thread of its own reads
 * the events and hands them to a callback as paths relative to the root.
 * Directories created or moved into the tree later get watches as their
 * events arrive; because entries may appear in such a directory before its
 * watch exists, every entry found while adding the watch is reported too.
 * Directory renames inside the tree keep their watches and only rewrite the
 * recorded paths; a directory moved out of the tree is forgotten.  In a
 * burst the thread lets events accumulate for a few milliseconds so inotify
 * merges repeated ones.  After a queue overflow (or when the inotify watch
 * limit is hit) an OVERFLOW event says "invalidate everything" and the tree
 * is re-scanned for directories it may have missed.
 *
 * The exec barrier rests on one property of inotify: an event is queued
 * inside the system call that causes it, so after a process has exited,
 * sbx_fswatch_sync() delivers every change the process made.
 *
 * Used by sbx-agent (agent/handlers_watch.c), which wants paths, and by
 * the local provider (providers/local/plocal_watch.c), which wants the
 * identity (st_dev, st_ino) of the directory an event happened in, the raw
 * inotify mask (to recognise events its own system calls caused) and a
 * point after each batch of events where it may emit changes it deferred
 * (SBX_FSWATCH_F_BATCH).  Each event carries all three; a consumer uses
 * what it needs.
 *
 * Symlinks are never followed (IN_DONT_FOLLOW, lstat), so the watch stays
 * beneath the root.
 *
 * Threads: the callback runs on the watcher thread, one event at a time, in
 * order; it must not call sbx_fswatch_sync() or sbx_fswatch_free().  The
 * other functions may be called from any thread.
 *
 * Errors: 0 or a negative errno with detail in sbx_error_last().
 */
#ifndef SBX_FSWATCH_H
#define SBX_FSWATCH_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "sbx/error.h"

struct sbx_fswatch;

enum sbx_fswatch_kind {
	SBX_FSWATCH_ENTRY = 1, /* a name appeared in or left a directory */
	SBX_FSWATCH_DATA,      /* a file's content changed */
	SBX_FSWATCH_ATTR,      /* attributes changed (mode, owner, times) */
	SBX_FSWATCH_OVERFLOW,  /* events were lost: invalidate everything */
	/*
	 * Only with SBX_FSWATCH_F_BATCH: the thread has handled every event
	 * it read in one go and is about to answer the barriers waiting on
	 * them.  Delivered after each batch, also an empty one (after
	 * sbx_fswatch_wake()).  No path or identity.
	 */
	SBX_FSWATCH_BATCH,
};

/* sbx_fswatch_new_flags() flags. */
#define SBX_FSWATCH_F_BATCH 0x1 /* deliver SBX_FSWATCH_BATCH events */

struct sbx_fswatch_event {
	int kind; /* enum sbx_fswatch_kind */
	/*
	 * Relative to the root, "/"-separated, "" for the root itself; for
	 * ENTRY the path of the name ("dir/name"); NULL for OVERFLOW and
	 * BATCH.  Borrowed for the duration of the callback.
	 */
	const char *path;
	/*
	 * The last component of `path` when the event is about a name in a
	 * watched directory; NULL when it is about a watched directory
	 * itself (its ATTR), and for OVERFLOW and BATCH.  Borrowed.
	 */
	const char *name;
	/*
	 * Identity of the watched directory the event was reported in (the
	 * parent of `name`, or the directory itself when `name` is NULL), as
	 * lstat() saw it when its watch was added; 0 for OVERFLOW and BATCH.
	 */
	dev_t dir_dev;
	ino_t dir_ino;
	/*
	 * The inotify mask (IN_CREATE, IN_DELETE, IN_MOVED_FROM, IN_MOVED_TO,
	 * IN_MODIFY, IN_ATTRIB, with IN_ISDIR) of the event; 0 for an ENTRY
	 * found by scanning a directory that just got its watch, and for
	 * OVERFLOW and BATCH.
	 */
	uint32_t mask;
	/*
	 * ENTRY with IN_MOVED_TO: the path (as `path`) of the name the
	 * object was moved from, when that name was inside the tree and its
	 * IN_MOVED_FROM was paired with this event (same cookie; events of
	 * other objects may come between the two); NULL otherwise.  The
	 * ENTRY of the old name has been reported already.  Borrowed.
	 */
	const char *from;
};

typedef void (*sbx_fswatch_cb)(const struct sbx_fswatch_event *ev,
			       void *payload);

/*
 * Watch `root` (a directory) recursively and start the watcher thread.
 * Errors: -ENOENT/-ENOTDIR for a bad root; -errno from
 * inotify_init1/eventfd/pthread_create; -ENOSPC when the
 * inotify watch limit (fs.inotify.max_user_watches) is too low for the
 * tree.  *out is released with sbx_fswatch_free().
 */
SBX_WUR int sbx_fswatch_new(struct sbx_fswatch **out, const char *root,
			    sbx_fswatch_cb cb, void *payload);

/* sbx_fswatch_new() with SBX_FSWATCH_F_* `flags`. */
SBX_WUR int sbx_fswatch_new_flags(struct sbx_fswatch **out, const char *root,
				  unsigned flags, sbx_fswatch_cb cb,
				  void *payload);

/*
 * Barrier: return once the watcher thread has read and reported every event
 * queued before this call.  -ETIMEDOUT after `timeout_ms`, -EIO when the
 * watcher has stopped.  Safe from many threads at once.
 */
SBX_WUR int sbx_fswatch_sync(struct sbx_fswatch *w, int timeout_ms);

/*
 * Have the watcher thread run a batch soon (and, with SBX_FSWATCH_F_BATCH,
 * deliver SBX_FSWATCH_BATCH) without waiting for it: for a consumer that
 * queued work for that point.  Never blocks; any thread, also from inside
 * a FUSE request.
 */
void sbx_fswatch_wake(struct sbx_fswatch *w);

/* Stop the thread and release everything.  Accepts NULL. */
void sbx_fswatch_free(struct sbx_fswatch *w);

struct stat;
/*
 * What the name of ENTRY event `ev` holds now: lstat() of root/ev->path,
 * for a consumer that refreshes the link count of a file a link was made
 * to (inotify tells only a watch on the file itself of that), or keeps
 * what it holds of a renamed object under its new name only if the name
 * holds that very one (`from`: the halves of a RENAME_EXCHANGE look like
 * two renames).  False, and *st zeroed, when the event removed or moved
 * the name away, is about a directory that was not renamed (no hard
 * links), has no path, or the name is gone again (a later event says
 * so).
 */
bool sbx_fswatch_entry_stat(const struct sbx_fswatch_event *ev,
			    const char *root, struct stat *st);

#endif
