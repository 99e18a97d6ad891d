/*
 * The one "wait for a descriptor, or to be woken, or for a deadline" loop
 * of the tree: threads that sleep in poll(2) on their work descriptor (a
 * listening socket, /proc/self/mountinfo, a pipe) and on a wake pipe or
 * eventfd that another thread writes to stop them.
 *
 * Thread-safe (it only polls).  Signals: EINTR is retried with what is
 * left of the timeout, so a caller that wants a signal to end the wait
 * must say so through the wake descriptor (a handler may write to it).
 */
#ifndef SBX_WAITFD_H
#define SBX_WAITFD_H

#include "sbx/error.h"

/* What sbx_waitfd() saw. */
enum sbx_waitfd_result {
	SBX_WAITFD_TIMEOUT = 0, /* the timeout passed first */
	SBX_WAITFD_READY = 1,   /* `fd` has events (see *revents) */
	SBX_WAITFD_WOKEN = 2,   /* `wake_fd` is readable (or hung up) */
};

/*
 * Wait until `fd` reports one of the poll(2) `events` (or POLLERR, POLLHUP,
 * POLLNVAL, which poll always reports), until `wake_fd` becomes readable,
 * or until `timeout_ms` milliseconds have passed (-1: no limit; 0: look
 * without waiting).  Either descriptor may be -1 (ignored): fd -1 sleeps
 * until woken or the timeout.  When both are ready, WOKEN wins: a thread
 * told to stop stops.  The wake descriptor is not read (it stays readable,
 * so every later wait returns WOKEN at once).
 *
 * Returns an enum sbx_waitfd_result, with *revents (may be NULL) set to
 * fd's revents (0 unless READY); or a negative errno (SBX_ERR_OS) when
 * poll itself fails.
 */
SBX_WUR int sbx_waitfd(int fd, short events, int wake_fd, int timeout_ms,
		       short *revents);

#endif
