/*
 * sbx error model: one return currency, typed detail beside it.
 *
 * Every function that can fail returns int: 0 on success or a negative errno
 * (-ENOENT, -EIO, ...).  Where the failure happens, the code records a typed
 * error with a human message in a thread-local slot with sbx_error_set();
 * callers propagate rc unchanged and may prefix context with
 * sbx_error_prefix().  Only the replying layer (FUSE op, CLI, daemon control
 * handler) reads sbx_error_last() and reports it.
 *
 * Thread context: the slot is thread-local, so it is valid for the thread
 * that made the failing call (libfuse's multithreaded loop serves each request
 * on one worker thread).
 */
#ifndef SBX_ERROR_H
#define SBX_ERROR_H

#include <stdarg.h>

#define SBX_WUR __attribute__((warn_unused_result))
#define SBX_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* Where an error came from.  `detail` keeps the foreign code. */
enum sbx_error_class {
	SBX_ERR_NONE = 0,
	SBX_ERR_OS,       /* a system call; detail = errno */
	SBX_ERR_GIT,      /* libgit2; detail = libgit2 error code */
	SBX_ERR_HTTP,     /* HTTP transport; detail = CURLcode or status */
	SBX_ERR_JSON,     /* malformed JSON document */
	SBX_ERR_PROTO,    /* protocol violation by a peer */
	SBX_ERR_REMOTE,   /* the remote side reported an error */
	SBX_ERR_CONFIG,   /* bad configuration or bad user input */
	SBX_ERR_NOTFOUND, /* unknown session / sandbox / snapshot */
	SBX_ERR_STATE,    /* refused: would lose data or wrong state */
	SBX_ERR_INTERNAL, /* a bug */
};

struct sbx_error {
	int klass;    /* enum sbx_error_class */
	int code;     /* negative errno, as returned */
	long detail;  /* foreign code, 0 when none */
	char msg[512];
};

/*
 * Record an error for this thread and return `code` (a negative errno), so
 * that callers can write `return sbx_error_set(SBX_ERR_OS, -errno, ...)`.
 * The message should say what failed and, where it helps, what to do.
 */
int sbx_error_set(int klass, int code, const char *fmt, ...) SBX_PRINTF(3, 4);

/* As sbx_error_set() and also records a foreign detail code. */
int sbx_error_setd(int klass, int code, long detail, const char *fmt, ...)
	SBX_PRINTF(4, 5);

/*
 * Record an OS error from errno: "<what>: <strerror>".  Returns -errno (or
 * -EIO if errno was 0).  Reads errno before doing anything else.
 */
int sbx_error_os(const char *fmt, ...) SBX_PRINTF(1, 2);

/*
 * Prepend "<context>: " to the current message.  Returns the current code (or
 * -EIO if none is set), so `return sbx_error_prefix(rc, "...")` propagates.
 * `rc` is returned unchanged when it is negative.
 */
int sbx_error_prefix(int rc, const char *fmt, ...) SBX_PRINTF(2, 3);

/* The last error of this thread; never NULL (klass NONE when clear). */
const struct sbx_error *sbx_error_last(void);

/* Forget the current error (call when an error has been handled). */
void sbx_error_clear(void);

/*
 * Make `e` (a copy of an earlier sbx_error_last(), taken before cleanup
 * that may fail on its own) this thread's error again, exactly; returns
 * e->code, so `return sbx_error_restore(&saved)` propagates it.
 */
int sbx_error_restore(const struct sbx_error *e);

/* Symbolic errno name ("ENOENT"), or NULL when unknown.  Positive errno. */
const char *sbx_errno_name(int err);

/* Positive errno from a symbolic name, or 0 when unknown. */
int sbx_errno_from_name(const char *name);

/*
 * Programming errors: assert in debug builds, return -EINVAL in release.
 */
#ifdef NDEBUG
#define SBX_ASSERT_ARG(x)                                                      \
	do {                                                                   \
		if (!(x))                                                      \
			return sbx_error_set(SBX_ERR_INTERNAL, -EINVAL,        \
					     "invalid argument: %s", #x);      \
	} while (0)
#else
#include <assert.h>
#define SBX_ASSERT_ARG(x) assert(x)
#endif

#endif
