/*
 * mgrpc: a minimal gRPC client over libcurl (HTTP/2 over TLS), enough for
 * Modal's control API: unary and server-streaming calls, metadata, gRPC
 * status mapping, retries.  No client streaming, no compression.
 *
 * Wire.  Each call is one POST of "<url><method>" with
 * "content-type: application/grpc" and "te: trailers"; the body is one
 * length-prefixed message (1 byte flag 0, 4 bytes big-endian length).  The
 * answer is a sequence of such frames followed by the trailers grpc-status
 * and grpc-message (percent-encoded), which libcurl hands to the header
 * callback; a "trailers-only" answer carries them in the headers.  Messages
 * are at most MGRPC_MAX_MESSAGE bytes each way.  A compressed frame (flag 1)
 * is an error: no grpc-accept-encoding is offered, so servers do not send
 * any.
 *
 * Errors.  Every call returns 0 or a negative errno and records the detail
 * with sbx_error_set() (sbx/error.h).  gRPC status codes map to:
 *   NOT_FOUND                          -ENOENT     SBX_ERR_NOTFOUND
 *   ALREADY_EXISTS                     -EEXIST     SBX_ERR_REMOTE
 *   UNAUTHENTICATED, PERMISSION_DENIED -EACCES     SBX_ERR_CONFIG
 *   INVALID_ARGUMENT, FAILED_PRECONDITION -EINVAL  SBX_ERR_REMOTE
 *   RESOURCE_EXHAUSTED, UNAVAILABLE    -EAGAIN     SBX_ERR_REMOTE
 *   DEADLINE_EXCEEDED                  -ETIMEDOUT  SBX_ERR_REMOTE
 *   any other code                     -EIO        SBX_ERR_REMOTE
 * with the gRPC code in the error's `detail` and a message naming the
 * method, the code's name and grpc-message.  Transport failures (connection
 * refused, TLS, HTTP/2) are SBX_ERR_HTTP with the CURLcode in `detail`:
 * -ECONNREFUSED, -EHOSTUNREACH, -ECONNRESET, -ETIMEDOUT (the client's
 * deadline passed; mgrpc_last_status() says DEADLINE_EXCEEDED) or -EIO.
 * A peer that breaks the protocol (no grpc-status, a truncated frame, an
 * undecodable message) gives -EPROTO / SBX_ERR_PROTO; a message over
 * MGRPC_MAX_MESSAGE gives -EMSGSIZE.
 *
 * Threads.  A channel is thread-safe: easy handles come from a pool
 * (sbx/http.h) sharing DNS and TLS sessions, each with its own kept-alive
 * connection.  Transport errors map through sbx_errno_from_curl().
 * Callbacks run on the calling thread.
 */
#ifndef SBX_MODAL_MGRPC_H
#define SBX_MODAL_MGRPC_H

#include <stdbool.h>
#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

#include "sbx/error.h"

/* Largest message accepted or sent (either direction). */
#define MGRPC_MAX_MESSAGE (64u * 1024 * 1024)

/* Defaults for struct mgrpc_opts / struct mgrpc_call. */
#define MGRPC_DEFAULT_CONNECT_TIMEOUT_MS 10000L
#define MGRPC_DEFAULT_DEADLINE_MS 60000L

/* Retry policy (Modal's SDKs): 3 retries, 100 ms doubling, at most 1 s. */
#define MGRPC_MAX_RETRIES 3
#define MGRPC_RETRY_BASE_MS 100L
#define MGRPC_RETRY_MAX_MS 1000L

/* gRPC status codes (grpc/status.h). */
enum mgrpc_code {
	MGRPC_OK = 0,
	MGRPC_CANCELLED = 1,
	MGRPC_UNKNOWN = 2,
	MGRPC_INVALID_ARGUMENT = 3,
	MGRPC_DEADLINE_EXCEEDED = 4,
	MGRPC_NOT_FOUND = 5,
	MGRPC_ALREADY_EXISTS = 6,
	MGRPC_PERMISSION_DENIED = 7,
	MGRPC_RESOURCE_EXHAUSTED = 8,
	MGRPC_FAILED_PRECONDITION = 9,
	MGRPC_ABORTED = 10,
	MGRPC_OUT_OF_RANGE = 11,
	MGRPC_UNIMPLEMENTED = 12,
	MGRPC_INTERNAL = 13,
	MGRPC_UNAVAILABLE = 14,
	MGRPC_DATA_LOSS = 15,
	MGRPC_UNAUTHENTICATED = 16,
};

/* A channel to one server.  Opaque; thread-safe. */
struct mgrpc;

struct mgrpc_opts {
	/* Base URL, "https://api.modal.com:443" (a trailing '/' is dropped).
	 * https:// uses HTTP/2 over TLS (ALPN h2).  http:// uses cleartext
	 * HTTP/2 with prior knowledge and no connection reuse (libcurl 7.88
	 * fails to reuse h2c connections); meant for local experiments. */
	const char *url;
	/* Extra metadata sent on every call, "name: value" strings,
	 * NULL-terminated (x-modal-token-id, ..., or "authorization: Bearer
	 * <jwt>").  Copied.  NULL: none.  Never logged nor put in errors. */
	const char *const *headers;
	/* PEM file of the CA to trust (tests); NULL: the system's CAs. */
	const char *ca_file;
	/* Connection timeout; 0: MGRPC_DEFAULT_CONNECT_TIMEOUT_MS. */
	long connect_timeout_ms;
};

/*
 * Create a channel.  No connection is made until the first call.
 * Returns 0 and *out (free with mgrpc_free()), or -EINVAL (SBX_ERR_CONFIG:
 * bad URL or header) or -EIO (libcurl could not be initialised).
 */
SBX_WUR int mgrpc_new(struct mgrpc **out, const struct mgrpc_opts *o);

/* Free a channel (NULL is fine).  No call may be in progress on it.
 * Header values (tokens) are wiped from memory. */
void mgrpc_free(struct mgrpc *c);

/* Per-call options and results.  Zero-initialise, then set what matters. */
struct mgrpc_call {
	/* Per-attempt deadline; 0: MGRPC_DEFAULT_DEADLINE_MS.  Enforced as
	 * CURLOPT_TIMEOUT_MS and sent as grpc-timeout. */
	long deadline_ms;
	/* Retry on DEADLINE_EXCEEDED, UNAVAILABLE, CANCELLED, INTERNAL,
	 * UNKNOWN and on transport failures (connection refused/reset, a
	 * deadline), at most MGRPC_MAX_RETRIES times, waiting 100 ms, 200 ms,
	 * 400 ms (doubling, at most 1 s).  Every attempt carries
	 * x-idempotency-key (one random UUID per logical call) and
	 * x-retry-attempt (0, 1, 2, ...).  A stream is not retried once a
	 * message was delivered to the callback.  Only for idempotent calls
	 * or calls the server de-duplicates by the idempotency key. */
	bool retry;
	/* Out: how many attempts were made (1 + retries). */
	int attempts;
};

/*
 * Unary call.  `method` is the full path, "/modal.client.ModalClient/
 * AppGetOrCreate".  `req` is packed and sent; the single answer is unpacked
 * with `resp_desc` into *out (free with
 * protobuf_c_message_free_unpacked(*out, NULL)).  `call` may be NULL
 * (defaults, no retry).  Returns 0, or a negative errno as described at the
 * top (*out is then NULL).  Blocks up to the deadline (times the attempts).
 */
SBX_WUR int mgrpc_unary(struct mgrpc *c, const char *method,
			const ProtobufCMessage *req,
			const ProtobufCMessageDescriptor *resp_desc,
			ProtobufCMessage **out, struct mgrpc_call *call);

/* Callback for each streamed message; non-zero stops the call. */
typedef int (*mgrpc_msg_cb)(const ProtobufCMessage *msg, void *payload);

/*
 * Server-streaming call.  `cb` is called for each message as it arrives,
 * unpacked with `resp_desc`; the message is freed when `cb` returns.  A
 * non-zero return from `cb` stops the call, and mgrpc_stream() returns that
 * value unchanged (the callback records its own error).  Otherwise returns
 * 0 once the server ended the stream with OK, or a negative errno as
 * described at the top (messages delivered before the error stay
 * delivered).  The deadline bounds the whole stream.
 */
SBX_WUR int mgrpc_stream(struct mgrpc *c, const char *method,
			 const ProtobufCMessage *req,
			 const ProtobufCMessageDescriptor *resp_desc,
			 mgrpc_msg_cb cb, void *payload,
			 struct mgrpc_call *call);

/*
 * The gRPC status code of the last call made on this thread when it failed
 * with a gRPC status (enum mgrpc_code); 0 when it succeeded or failed
 * without one (transport or protocol error, callback stop).  The client's
 * own deadline counts as DEADLINE_EXCEEDED, as in gRPC libraries.  For
 * callers that branch on NOT_FOUND and the like.
 */
int mgrpc_last_status(void);

/* The canonical name of a gRPC code ("NOT_FOUND"), or "UNKNOWN_CODE" when
 * out of range.  Static storage. */
const char *mgrpc_code_name(int code);

#endif
