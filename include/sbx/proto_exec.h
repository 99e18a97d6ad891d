/*
 * The exec messages of the agent protocol (docs/protocol.md, "Exec"),
 * encoded by the remote provider (providers/remote/premote_exec.c) and
 * decoded by the agent (agent/handlers_exec.c), and the output frames the
 * other way round.
 *
 * Pure functions over cJSON; no I/O, no threads.  Decoders take untrusted
 * input: they check types and bounds and fail with -EINVAL (requests,
 * checked by the agent: a 400) or -EPROTO (answers, checked by the client),
 * class SBX_ERR_PROTO, with a message naming the field.  Frames of kinds a
 * decoder does not know (later versions) decode as SBX_EXEC_FRAME_OTHER,
 * to be ignored.
 */
#ifndef SBX_PROTO_EXEC_H
#define SBX_PROTO_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "sbx/error.h"

struct cJSON;

/* Bounds of the start request. */
#define SBX_EXEC_MAX_ARGS 65536

/*
 * POST /v1/exec.  Strings and vectors are borrowed (encode) or borrowed
 * from the decoded document, with the vectors themselves malloc'd
 * (decode; release with sbx_exec_start_fini()).
 *
 *  argv   non-empty, argv[0] not "".
 *  envp   the complete environment ("K=V"), or NULL: the agent's own.
 *  cwd    relative to the agent's root (or absolute inside it); "" root.
 *  umask  0..0777, or -1: none sent (the agent's own applies).
 *  rows/cols  sent only with tty and both non-zero.
 *  alias  the client's mount path, or NULL.
 */
struct sbx_exec_start_msg {
	const char **argv;
	const char **envp;
	const char *cwd;
	bool tty;
	bool attach;
	unsigned short rows, cols;
	int umask;
	const char *alias;
};

/* The request body for `m`: a new object. */
struct cJSON *sbx_exec_start_encode(const struct sbx_exec_start_msg *m);

/*
 * Decode a request body into *out (zeroed first).  -EINVAL for a missing
 * or empty argv, a non-string element, an env entry that is not "K=V",
 * more than SBX_EXEC_MAX_ARGS entries, rows/cols outside 0..65535, umask
 * outside -1..0777, a field of the wrong type.  *out is released with
 * sbx_exec_start_fini() whatever the result.
 */
SBX_WUR int sbx_exec_start_decode(const struct cJSON *doc,
				  struct sbx_exec_start_msg *out);

/* Free the vectors of a decoded message (NULL is fine); *m is zeroed. */
void sbx_exec_start_fini(struct sbx_exec_start_msg *m);

/* Output stream frames (GET /v1/exec/ID/output, or attached start). */
enum sbx_exec_frame_kind {
	SBX_EXEC_FRAME_OTHER = 0, /* unknown: ignore */
	SBX_EXEC_FRAME_STARTED,   /* attach: {"id","pid"} names the process */
	SBX_EXEC_FRAME_OUTPUT,    /* {"seq","stream"} + data */
	SBX_EXEC_FRAME_LOST,      /* {"lost":{"from","to"}}: output freed */
	SBX_EXEC_FRAME_EXIT,      /* {"exit":{"code","signal"},"watch_seq"} */
	SBX_EXEC_FRAME_END,       /* {"end":true} */
};

struct sbx_exec_frame {
	int kind;           /* enum sbx_exec_frame_kind */
	const char *id;     /* started */
	long long pid;      /* started */
	uint64_t seq;       /* output */
	int stream;         /* output: 0 stdout, 1 stderr */
	uint64_t from, to;  /* lost */
	int status;         /* exit: a wait(2) status */
	bool has_watch_seq; /* exit */
	uint64_t watch_seq; /* exit */
};

/*
 * The frame header for `f` (kind not OTHER; exit takes f->status as a
 * wait(2) status).  Returns a new object; the caller frames it (and the
 * output's data).
 */
struct cJSON *sbx_exec_frame_encode(const struct sbx_exec_frame *f);

/*
 * Decode a frame header into *out (zeroed first); strings are borrowed
 * from `hdr`.  An output frame needs an integer "seq" and a "stream" of
 * "stdout" or "stderr"; an exit frame a valid "exit" object (see
 * sbx_exec_exit_decode).  Returns 0 or -EPROTO.
 */
SBX_WUR int sbx_exec_frame_decode(const struct cJSON *hdr,
				  struct sbx_exec_frame *out);

/*
 * The "exit" object of a wait(2) status: {"code":C,"signal":S}, code
 * 128+S when killed by signal S.  Returns a new object.
 */
struct cJSON *sbx_exec_exit_encode(int status);

/*
 * An "exit" object back into a wait(2) status: a signal in 1..127 wins,
 * else code 0..255.  -EPROTO when malformed or out of range.
 */
SBX_WUR int sbx_exec_exit_decode(const struct cJSON *exit_obj, int *status);

/* POST /v1/exec/ID/resize: {"rows":R,"cols":C}. */
struct cJSON *sbx_exec_resize_encode(unsigned short rows, unsigned short cols);
/* -EINVAL unless both are integers in 1..65535. */
SBX_WUR int sbx_exec_resize_decode(const struct cJSON *doc,
				   unsigned short *rows, unsigned short *cols);

/* POST /v1/exec/ID/signal: {"signal":"SIGINT"}.  NULL for a signal
 * without a portable name. */
struct cJSON *sbx_exec_signal_encode(int sig);
/* -EINVAL for a missing or unknown name; *sig a Linux signal number. */
SBX_WUR int sbx_exec_signal_decode(const struct cJSON *doc, int *sig);

#endif
