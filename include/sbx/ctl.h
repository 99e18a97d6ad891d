/*
 * The control protocol between the exec client (the sbx-exec shim, `sbx
 * exec`, `sbx shell`) and a session daemon (fs/ctl_server.c), over the
 * daemon's unix stream socket ($SBX_HOME/run/<name>.sock, mode 0600).
 * Both ends use this file, so the wire format is defined once.  The format
 * and its semantics are specified in docs/exec.md; in short:
 *
 *   frame   = header (8 bytes) + payload (`len` bytes)
 *   header  = u8 type, u8 flags (0), u16 reserved (0), u32 len (little end.)
 *
 *   client -> daemon: REQUEST, then any of STDIN, STDIN_EOF, SIGNAL, RESIZE
 *   daemon -> client: STARTED, then STDOUT / STDERR ..., then EXIT;
 *                     or ERROR at any point (the daemon then closes).
 *
 * One connection runs one command.  Frames are bounded (SBX_CTL_*_MAX); a
 * peer that sends a bigger or unknown frame is a protocol error (-EPROTO).
 *
 * Threads: everything here is reentrant except sbx_ctl_run(), which installs
 * process-wide signal handlers and may change the terminal mode, so only one
 * sbx_ctl_run() may be active per process (the shim and the CLI run one).
 */
#ifndef SBX_CTL_H
#define SBX_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "sbx/error.h"

#define SBX_CTL_VERSION 1

/* Frame types. */
enum sbx_ctl_type {
	/* client -> daemon */
	SBX_CTL_REQUEST = 1,   /* the command; first frame, exactly once */
	SBX_CTL_STDIN = 2,     /* bytes for the command's stdin */
	SBX_CTL_STDIN_EOF = 3, /* close the command's stdin; empty payload */
	SBX_CTL_SIGNAL = 4,    /* u32 Linux signal number */
	SBX_CTL_RESIZE = 5,    /* u16 rows, u16 cols (tty mode) */
	SBX_CTL_PING = 6,      /* instead of REQUEST: "do you answer?" */
	/* daemon -> client */
	SBX_CTL_STARTED = 16,  /* u32 pid: barrier passed, command running */
	SBX_CTL_STDOUT = 17,   /* bytes the command wrote to stdout (or pty) */
	SBX_CTL_STDERR = 18,   /* bytes the command wrote to stderr */
	SBX_CTL_EXIT = 19,     /* u32 wait(2) status; the last frame */
	SBX_CTL_ERROR = 20,    /* u32 errno, u32 kind, message; the last */
	SBX_CTL_PONG = 21,     /* the answer to PING (u32 pid); the last */
};

/* ERROR kinds: who failed (decides the client's exit code). */
enum sbx_ctl_error_kind {
	SBX_CTL_ERR_SBX = 0,  /* sbx itself (bad cwd, barrier, protocol): 125 */
	SBX_CTL_ERR_EXEC = 1, /* the command could not be executed: 126/127 */
};

#define SBX_CTL_HEADER_SIZE 8
/* Largest STDIN/STDOUT/STDERR payload. */
#define SBX_CTL_DATA_MAX (256u * 1024)
/* Largest REQUEST payload (argv + environment, like ARG_MAX). */
#define SBX_CTL_REQUEST_MAX (4u * 1024 * 1024)
/* Largest payload of the other frames. */
#define SBX_CTL_SMALL_MAX 4096u

/* REQUEST flags. */
#define SBX_CTL_REQ_TTY 0x1
/* The REQUEST frame's first bytes carry 3 descriptors (SCM_RIGHTS): the
 * client's stdin, stdout, stderr, for the command to use directly. */
#define SBX_CTL_REQ_FDS 0x2
/* The payload ends with a u32 after the strings: the client's umask(2),
 * which the command gets (docs/exec.md).  Without it the daemon uses
 * 022. */
#define SBX_CTL_REQ_UMASK 0x4

/* STARTED flags (second u32 of its payload). */
#define SBX_CTL_STARTED_FDS 0x1 /* the command got the client's descriptors:
				 * no STDIN/STDOUT/STDERR frames follow */

/* Exit codes of the client for failures that are not the command's. */
#define SBX_CTL_EXIT_SBX 125      /* sbx failed (daemon down, bad -C, ...) */
#define SBX_CTL_EXIT_NOEXEC 126   /* command found but not executable */
#define SBX_CTL_EXIT_NOTFOUND 127 /* command not found */

/* A decoded frame; `data` points into the receive buffer (borrowed until
 * the next sbx_ctl_rbuf_* call). */
struct sbx_ctl_frame {
	uint8_t type;
	uint32_t len;
	const uint8_t *data;
};

/*
 * Receive buffer: bytes read from a socket, decoded into frames in place.
 * Embedded; sbx_ctl_rbuf_init()/sbx_ctl_rbuf_fini().
 */
struct sbx_ctl_rbuf {
	uint8_t *buf;
	size_t cap;
	size_t start; /* first unconsumed byte */
	size_t end;   /* one past the last byte read */
	size_t max_payload; /* largest accepted payload */
};

void sbx_ctl_rbuf_init(struct sbx_ctl_rbuf *rb, size_t max_payload);
void sbx_ctl_rbuf_fini(struct sbx_ctl_rbuf *rb);

/*
 * Read what is available from (non-blocking) `fd` into the buffer, at most
 * enough for one more maximal frame.  Returns the byte count (> 0), 0 at
 * end of stream, -EAGAIN when nothing was available, or -errno.
 */
SBX_WUR ssize_t sbx_ctl_rbuf_fill(struct sbx_ctl_rbuf *rb, int fd);

/*
 * As sbx_ctl_rbuf_fill(), also receiving descriptors (SCM_RIGHTS, made
 * O_CLOEXEC): up to 3 - *nfds of them are appended to fds[]; any more are
 * closed.  The caller owns the descriptors it gets.
 */
SBX_WUR ssize_t sbx_ctl_rbuf_fill_fds(struct sbx_ctl_rbuf *rb, int fd,
				      int fds[3], int *nfds);

/*
 * Take the next complete frame: 1 and *f filled, 0 when more bytes are
 * needed, -EPROTO (SBX_ERR_PROTO) for an oversized payload.  The frame's
 * data stays valid until the next call on `rb`.
 */
SBX_WUR int sbx_ctl_rbuf_next(struct sbx_ctl_rbuf *rb, struct sbx_ctl_frame *f);

/* True when bytes of an incomplete frame are buffered. */
bool sbx_ctl_rbuf_partial(const struct sbx_ctl_rbuf *rb);

/*
 * Send buffer: frames queued for a non-blocking socket.  Embedded.
 */
struct sbx_ctl_wbuf {
	uint8_t *buf;
	size_t cap;
	size_t start;
	size_t end;
};

void sbx_ctl_wbuf_init(struct sbx_ctl_wbuf *wb);
void sbx_ctl_wbuf_fini(struct sbx_ctl_wbuf *wb);
/* Bytes queued and not yet written. */
size_t sbx_ctl_wbuf_pending(const struct sbx_ctl_wbuf *wb);
/* Queue one frame (payload copied).  Cannot fail (sbx_xmalloc). */
void sbx_ctl_wbuf_put(struct sbx_ctl_wbuf *wb, uint8_t type, const void *data,
		      size_t len);
/*
 * Queue a data frame whose payload is read straight from `src` (one read
 * of at most `max` bytes, no extra copy).  Returns the payload length
 * (> 0; the frame is queued), 0 at end of file, or -errno (-EAGAIN when
 * nothing was available; EIO is returned as is: a pty master reports the
 * end of output that way).
 */
SBX_WUR ssize_t sbx_ctl_wbuf_put_from_fd(struct sbx_ctl_wbuf *wb, uint8_t type,
					 int src, size_t max);
/*
 * Write queued bytes to non-blocking `fd`.  Returns 0 when everything was
 * written or the socket is full (check sbx_ctl_wbuf_pending()), -EPIPE /
 * -ECONNRESET / -errno on failure.
 */
SBX_WUR int sbx_ctl_wbuf_flush(struct sbx_ctl_wbuf *wb, int fd);

/* Little-endian field helpers (payload encoding). */
void sbx_ctl_put_u32(uint8_t *p, uint32_t v);
uint32_t sbx_ctl_get_u32(const uint8_t *p);

/*
 * A decoded REQUEST.  One allocation: release with sbx_ctl_request_free()
 * (accepts NULL).  argv/envp are NULL-terminated.
 */
struct sbx_ctl_request {
	uint32_t version;
	uint32_t flags;     /* SBX_CTL_REQ_* */
	unsigned short rows;
	unsigned short cols;
	char *cwd;          /* "" = the sandbox workdir; relative = below it */
	char **argv;        /* argc >= 1 */
	char **envp;
	uint32_t umask;     /* with SBX_CTL_REQ_UMASK: the client's umask */
};

/*
 * Encode a REQUEST payload into *out (malloc'd), *len_out bytes.
 * -E2BIG (CONFIG) beyond SBX_CTL_REQUEST_MAX; -EINVAL for an empty argv.
 */
SBX_WUR int sbx_ctl_request_encode(uint8_t **out, size_t *len_out,
				   const struct sbx_ctl_request *req);
/*
 * Decode a REQUEST payload.  -EPROTO (PROTO) when malformed; -EPROTONOSUPPORT
 * for another protocol version.  *out owned by the caller.
 */
SBX_WUR int sbx_ctl_request_decode(struct sbx_ctl_request **out,
				   const uint8_t *data, size_t len);
void sbx_ctl_request_free(struct sbx_ctl_request *req);

/* Queue an ERROR frame: positive errno `err`, kind, message. */
void sbx_ctl_wbuf_put_error(struct sbx_ctl_wbuf *wb, int err, int kind,
			    const char *msg);

/*
 * Sockets.  sbx_ctl_listen() binds `path` (mode 0600, parent directory
 * must exist): a stale socket file (nobody listening) is replaced, a live
 * one refused with -EADDRINUSE (STATE).  sbx_ctl_connect() connects with a
 * timeout; -ECONNREFUSED/-ENOENT when nobody listens, -ETIMEDOUT.  Paths
 * longer than sun_path work (bound through /proc/self/fd).  Both return
 * an O_CLOEXEC, O_NONBLOCK descriptor in *fd_out.
 */
SBX_WUR int sbx_ctl_listen(const char *path, int *fd_out);
SBX_WUR int sbx_ctl_connect(const char *path, int timeout_ms, int *fd_out);

/*
 * Liveness probe: connect to the daemon at `path`, send PING and wait for
 * any answer (PONG; ERROR from a daemon that predates PING; or the end of
 * the connection), all within `timeout_ms` in total.  0 when it answered;
 * -ETIMEDOUT (STATE) when it did not: the daemon is stopped or stuck (a
 * connect succeeds through the listen backlog even then);
 * -ECONNREFUSED/-ENOENT when nobody listens.  The daemon answers after
 * taking its inode table lock, so a deadlocked daemon does not answer.
 */
SBX_WUR int sbx_ctl_ping(const char *path, int timeout_ms);

/* ------------------------------------------------------------------------ */
/* The client: one implementation for the shim, `sbx exec` and `sbx shell`. */
/* ------------------------------------------------------------------------ */

struct sbx_ctl_run_opts {
	const char *socket_path;  /* the daemon's control socket */
	const char *session;      /* session name, for messages */
	const char *const *argv;  /* NULL-terminated, argv[0] non-empty */
	const char *const *envp;  /* environment to send (policy applied) */
	const char *cwd;          /* sandbox path; "" or relative: workdir */
	bool tty;                 /* ask for a pty; in_fd goes raw if a tty */
	int in_fd;                /* usually 0; -1: no stdin (EOF at once) */
	int out_fd;               /* usually 1 */
	int err_fd;               /* usually 2 */
	/*
	 * Install handlers for SIGINT, SIGTERM, SIGHUP, SIGQUIT (forwarded
	 * as SIGNAL frames) and SIGWINCH (RESIZE in tty mode) for the time
	 * of the call; previous handlers are restored afterwards.
	 */
	bool forward_signals;
	/*
	 * Offer in_fd/out_fd/err_fd to the daemon (SCM_RIGHTS), so the
	 * command writes to them directly: no copies, the fastest path for a
	 * local sandbox.  Ignored in tty mode, with in_fd < 0, and when
	 * $SBX_EXEC_FRAMED is set (non-empty); the daemon may decline.
	 */
	bool pass_fds;
	int connect_timeout_ms;   /* 0: 3000 */
};

/*
 * Run a command through the daemon and stream it to completion: returns 0
 * with *status_out the command's wait(2) status (EXIT frame), or a negative
 * errno with sbx_error_last() set.  For failures reported by the daemon the
 * error class is SBX_ERR_REMOTE and `detail` is the enum sbx_ctl_error_kind.
 * A daemon that is not running gives -ECONNREFUSED/-ENOENT with the message
 * "session NAME's daemon is not running; run `sbx mount NAME`".
 * The terminal mode of in_fd is restored on every return path (and at
 * exit(3) as a last resort).  The command gets this process's umask
 * (SBX_CTL_REQ_UMASK).
 */
SBX_WUR int sbx_ctl_run(const struct sbx_ctl_run_opts *o, int *status_out);

/*
 * Fill the options of a command run on this process's own terminal, as
 * `sbx exec` and the sbx-exec shim run one: stdin, stdout and stderr (0,
 * 1, 2) offered to the daemon (pass_fds), signals forwarded, and a pty
 * when `tty` is 1, or when it is -1 and both stdin and stdout are
 * terminals.  The other fields (socket, session, argv, envp, cwd, timeout)
 * are left as the caller set them.  Cannot fail.
 */
void sbx_ctl_run_opts_stdio(struct sbx_ctl_run_opts *o, int tty);

/* Exit code a shell would report for wait status `status` (128+N on
 * death by signal N). */
int sbx_ctl_exit_code(int status);

/* Exit code for a failed sbx_ctl_run() (125, 126 or 127; see above). */
int sbx_ctl_error_exit_code(int rc);

/*
 * Is `name` forwarded from the client's environment by default?  (TERM,
 * COLORTERM, NO_COLOR, FORCE_COLOR, CLICOLOR, CLICOLOR_FORCE, LANG,
 * LANGUAGE, LC_*, TZ, CI; see docs/exec.md.)
 */
bool sbx_ctl_env_default_allowed(const char *name);

/*
 * Is the variable name `name` (its first `n` bytes) in `list`, names
 * separated by commas, spaces, colons or tabs (the $SBX_EXEC_ENV syntax)?
 * A NULL list holds nothing.
 */
bool sbx_ctl_env_listed(const char *list, const char *name, size_t n);

/*
 * Build the environment a client sends: the default allowlist, the names in
 * $SBX_EXEC_ENV (separated by ',', ':' or spaces), PATH with the
 * directories in `drop_path_dirs` (NULL-terminated, may be NULL) removed,
 * then `extra` ("KEY=VALUE", overriding; may be NULL).  From `environ_in`.
 * *out is a NULL-terminated malloc'd array of malloc'd strings; free with
 * sbx_ctl_env_free().
 */
void sbx_ctl_env_build(char ***out, char *const *environ_in,
		       const char *const *drop_path_dirs,
		       const char *const *extra);
void sbx_ctl_env_free(char **env);

#endif
