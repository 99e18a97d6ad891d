/*
 * GET /v1/watch frames (docs/protocol.md, "Watch"), encoded by the agent
 * (agent/handlers_watch.c) and decoded by the remote provider
 * (providers/remote/premote_watch.c).
 *
 * Pure functions over cJSON; no I/O, no threads.  The decoder takes
 * untrusted input: -EPROTO (class SBX_ERR_PROTO) with a message for a
 * frame of a known kind that is malformed; frames of kinds it does not
 * know (later versions) decode as SBX_WATCH_OTHER, to be ignored.
 */
#ifndef SBX_PROTO_WATCH_H
#define SBX_PROTO_WATCH_H

#include <stdint.h>

#include "sbx/error.h"

struct cJSON;

enum sbx_watch_kind {
	SBX_WATCH_OTHER = 0, /* no or unknown "kind": ignore */
	SBX_WATCH_HELLO,     /* first frame: boot_id, watch_seq */
	SBX_WATCH_ENTRY,     /* a name (dis)appeared: path */
	SBX_WATCH_DATA,      /* content changed: path */
	SBX_WATCH_ATTR,      /* attributes changed: path */
	SBX_WATCH_OVERFLOW,  /* invalidate everything */
	SBX_WATCH_HEARTBEAT, /* caught up to watch_seq */
};

struct sbx_watch_frame {
	int kind;            /* enum sbx_watch_kind */
	uint64_t seq;        /* every kind but heartbeat */
	const char *path;    /* entry/data/attr; relative, no leading '/' */
	const char *name;    /* decoded entry: the last component of path */
	const char *boot_id; /* hello */
	uint64_t watch_seq;  /* hello, heartbeat */
	/*
	 * entry, optional: the inode number of what the name holds after the
	 * change (0: nothing, or not known).  A link made to a file changes
	 * the link count of its other names, and no event names them.
	 */
	uint64_t ino;
	/*
	 * entry, optional: the path the object was moved from, when the
	 * change is a rename inside the root (NULL: not a rename, or the
	 * agent could not pair it).  The old name's own entry event came
	 * before.  Decoding drops a malformed one rather than the frame.
	 */
	const char *from;
};

/* "entry" for SBX_WATCH_ENTRY, NULL for SBX_WATCH_OTHER. */
const char *sbx_watch_kind_name(int kind);

/*
 * The frame header for `f` (kind not OTHER).  Returns a new object;
 * encode it with sbx_frame_encode().
 */
struct cJSON *sbx_watch_frame_encode(const struct sbx_watch_frame *f);

/*
 * Decode a frame header into *out (zeroed first).  Strings are borrowed
 * from `hdr`.  Rules: hello needs "boot_id" and "watch_seq"; events need
 * "seq"; entry/data/attr need a relative "path" (an entry's must name an
 * entry, not be "" or end in '/'); a heartbeat without a valid
 * "watch_seq" is OTHER.  Numbers are integers in [0, 2^53]; an entry's
 * "ino" is optional (absent or not such a number: 0).  Returns 0 or
 * -EPROTO.
 */
SBX_WUR int sbx_watch_frame_decode(const struct cJSON *hdr,
				   struct sbx_watch_frame *out);

#endif
