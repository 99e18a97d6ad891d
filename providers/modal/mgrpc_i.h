/*
 * The pure parts of mgrpc.c (framing, status mapping, deadlines), exposed
 * for tests/unit/test_mgrpc.c.  mgrpc.h is the interface; nothing here
 * touches the network, and every function is reentrant.
 */
#ifndef SBX_MODAL_MGRPC_I_H
#define SBX_MODAL_MGRPC_I_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "mgrpc.h"

/* ---- status mapping (mgrpc.h, "Errors") ---------------------------------- */

/* The negative errno of a gRPC code (0 for OK). */
int mgrpc_errno_from_code(int code);
/* The sbx error class of a gRPC code (SBX_ERR_NOTFOUND, _CONFIG, _REMOTE). */
int mgrpc_class_from_code(int code);
/* Codes a call with `retry` is attempted again after. */
bool mgrpc_code_is_retryable(int code);
/* The gRPC code a proxy's HTTP status stands for, when the answer has no
 * grpc-status (gRPC's http-grpc-status-mapping.md). */
int mgrpc_code_from_http(long status);
/* grpc-message is percent-encoded UTF-8; invalid escapes are kept.
 * malloc'd, NUL-terminated. */
char *mgrpc_percent_decode(const char *s, size_t n);

/* ---- framing -------------------------------------------------------------- */

/*
 * `msg` as one length-prefixed message (flag 0, 4-byte big-endian length,
 * the packed message); *len_out its size.  malloc'd.
 */
uint8_t *mgrpc_frame(const ProtobufCMessage *msg, size_t *len_out);

/*
 * The first frame of buf[len]: 1 when complete (the message is at buf + 5,
 * *msg_len bytes), 0 when more bytes are needed, -EPROTO for a compressed
 * message or unknown flags, -EMSGSIZE for a message over
 * MGRPC_MAX_MESSAGE (*msg_len says its size).
 */
int mgrpc_frame_next(const uint8_t *buf, size_t len, size_t *msg_len);

/* ---- deadlines and retries ------------------------------------------------ */

/* The per-attempt deadline of `call` (NULL or 0: the default). */
long mgrpc_deadline_ms(const struct mgrpc_call *call);
/* The grpc-timeout header line for a deadline, "grpc-timeout: <n>m"
 * (at most 8 digits, as gRPC allows). */
void mgrpc_timeout_header(char *out, size_t size, long deadline_ms);
/* The pause before retry number attempt + 1: 100 ms doubling, at most
 * MGRPC_RETRY_MAX_MS. */
long mgrpc_retry_delay_ms(int attempt);

#endif
