/*
 * POSIX tar (pax interchange format), pure code: no I/O, no MHD.
 *
 * Writer: agent_tar_header() appends the header block(s) of one entry to
 * a buffer: a ustar header, preceded by a pax extended header ('x') when
 * the entry needs one (a name or link target that does not fit ustar, a
 * size of 8 GiB or more, uid/gid beyond 7 octal digits, a negative,
 * huge or sub-second mtime).  The caller then writes the entry's `size`
 * bytes of data followed by agent_tar_padding(size) zero bytes, and ends
 * the archive with agent_tar_end() (two zero blocks).
 *
 * Reader: struct agent_tar_reader is fed the archive in chunks of any
 * size (one byte at a time works) and calls back once per entry, with the
 * pax ('x', 'g'), GNU long name ('L') and long link ('K') records already
 * applied, then with the entry's data in pieces.  Accepted: POSIX ustar
 * and pax, GNU tar (old GNU magic, 'L'/'K', base-256 numbers) and v7
 * (no magic; a name ending in '/' is a directory).  Errors are -EINVAL
 * (SBX_ERR_PROTO) with a message giving the byte offset of the block
 * where the archive went wrong; a callback's error is returned as is.
 *
 * Not thread-safe per object; distinct objects are independent.
 */
#ifndef SBX_AGENT_TAR_H
#define SBX_AGENT_TAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbx/buf.h"
#include "sbx/error.h"

#define AGENT_TAR_BLOCK 512

/* Entry types (the ustar typeflag values). */
#define AGENT_TAR_REG '0'
#define AGENT_TAR_LNK '1' /* hard link to `linkname` */
#define AGENT_TAR_SYM '2'
#define AGENT_TAR_CHR '3'
#define AGENT_TAR_BLK '4'
#define AGENT_TAR_DIR '5'
#define AGENT_TAR_FIFO '6'

/*
 * One entry.  For the writer, strings are borrowed for the call; for the
 * reader's callback, they are valid during the callback only.
 */
struct agent_tar_entry {
	const char *name;     /* relative name; a directory's without '/'
			       * for the writer (added), as stored for the
			       * reader (may end in '/') */
	const char *linkname; /* symlink target or hard link target; "" */
	char type;            /* AGENT_TAR_*; the reader maps '\0' and '7'
			       * to '0' and may report others ('V', ...) */
	unsigned mode;        /* permission bits, 07777 */
	uint64_t uid, gid;
	uint64_t size;        /* data bytes that follow (0 for non-files) */
	int64_t mtime_s;
	long mtime_ns;        /* 0..999999999 */
	uint64_t offset;      /* reader: where the entry's first header
			       * block starts in the archive */
};

/*
 * Append the header block(s) of `e` to `out`.  -EINVAL for an empty
 * name or a name or link target with a NUL; the buffer's own error
 * (-EFBIG) when its cap is reached.  The size stored is e->size for
 * regular files, 0 for every other type.
 */
SBX_WUR int agent_tar_header(struct sbx_buf *out,
			     const struct agent_tar_entry *e);

/* Zero bytes that follow `size` data bytes to complete a block. */
size_t agent_tar_padding(uint64_t size);

/* Append the end of the archive: two zero blocks. */
SBX_WUR int agent_tar_end(struct sbx_buf *out);

/* ---- reader --------------------------------------------------------------- */

/*
 * Called once per entry (before its data); returns 0 or a negative errno,
 * which stops the reader and is returned by agent_tar_feed().
 */
typedef int (*agent_tar_entry_cb)(const struct agent_tar_entry *e,
				  void *payload);
/* Called with the entry's data in order, in pieces of any size > 0. */
typedef int (*agent_tar_data_cb)(const void *data, size_t len,
				 void *payload);

struct agent_tar_reader;

/* A new reader; never fails (allocation aborts).  payload: the callbacks'. */
struct agent_tar_reader *agent_tar_reader_new(agent_tar_entry_cb on_entry,
					      agent_tar_data_cb on_data,
					      void *payload);
void agent_tar_reader_free(struct agent_tar_reader *r);

/*
 * Feed the next `len` bytes.  Returns 0, -EINVAL (a bad archive: the
 * message says what and where), or a callback's error.  After an error
 * every further call returns it again.  Bytes after the end of the
 * archive (the zero blocks, record padding) are accepted and ignored.
 */
SBX_WUR int agent_tar_feed(struct agent_tar_reader *r, const void *data,
			   size_t len);

/*
 * The input ended.  0 when the archive was complete (its end marker was
 * seen, or at least one zero block, as some writers leave out the
 * second); -EINVAL "truncated at offset N" otherwise.
 */
SBX_WUR int agent_tar_finish(struct agent_tar_reader *r);

/* Bytes consumed so far. */
uint64_t agent_tar_offset(const struct agent_tar_reader *r);

/* True once the end-of-archive marker was read. */
bool agent_tar_ended(const struct agent_tar_reader *r);

#endif
