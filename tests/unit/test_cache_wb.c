/*
 * Write-back of the caching layer (fs/cache_wb.c) with scattered writes, as
 * a linker writes its output: several extents per open file, pushed
 * together at close, and reads and getattr of the file being written
 * answered from its local image (its content known: created here, empty)
 * without a round trip.  Over the in-memory sandbox (providers/mem), whose
 * call counters show what reached the wrapped sandbox; driven through the
 * ops table as the FUSE daemon drives it (test_cache_i.h).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "sbx/provider.h"
#include "../../fs/cache.h"
#include "../../providers/mem/pmem.h"
#include "test_cache_i.h"

/* The largest file the differential test makes. */
#define MODEL_MAX (64u << 10)

/* A fixed-seed generator, so a failure replays. */
static uint32_t rnd(uint32_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

/* The calls that would be round trips of a remote sandbox. */
static unsigned long trips(struct tc_env *e)
{
	return pmem_calls(e->mem, "read") + pmem_calls(e->mem, "getattr") +
	       pmem_calls(e->mem, "lookup") + pmem_calls(e->mem, "write") +
	       pmem_calls(e->mem, "bulk") + pmem_calls(e->mem, "setattr");
}

/*
 * Random writes, reads and getattrs of one open file, after the output was
 * unlinked and created again with O_CREAT|O_TRUNC (what a linker does),
 * checked against a local buffer driven by the same operations: offsets
 * below `span`, writes up to `maxw` bytes.  Returns the file's size.
 */
static size_t random_ops(struct tc_env *e, struct sbx_node *n,
			 struct sbx_file *fh, char *model, size_t span,
			 size_t maxw, int ops, uint32_t seed)
{
	static char buf[1 << 20], data[1 << 20];
	size_t size = 0;
	struct stat st;

	assert_true(maxw <= sizeof(data) && maxw < span);
	for (int i = 0; i < ops; i++) {
		uint32_t op = rnd(&seed) % 8;
		size_t off = rnd(&seed) % (span - maxw);
		size_t len = 1 + rnd(&seed) % maxw;

		if (i == 1) {
			/* The create's own event arrives after the first
			 * write: expected, it is no news. */
			assert_int_equal(e->ops->watch_sync(e->cache), 0);
			pmem_calls_reset(e->mem);
		}
		if (op < 4 || i == 0) {
			/* Writes land mostly in the first half: extents
			 * touch and merge, and leave holes past them. */
			if (op % 2)
				off /= 2;
			for (size_t j = 0; j < len; j++)
				data[j] = (char)rnd(&seed);
			assert_int_equal(e->ops->write(e->cache, fh, data, len,
						       (off_t)off),
					 (ssize_t)len);
			memcpy(model + off, data, len);
			if (off + len > size)
				size = off + len;
		} else if (op < 7) {
			size_t want = off >= size ? 0
				      : len < size - off ? len
							 : size - off;

			memset(buf, 0x55, len);
			assert_int_equal(e->ops->read(e->cache, fh, buf, len,
						      (off_t)off),
					 (ssize_t)want);
			assert_memory_equal(buf, model + off, want);
		} else {
			assert_int_equal(e->ops->getattr(e->cache, n, fh, &st),
					 0);
			assert_int_equal(st.st_size, (off_t)size);
			assert_true(S_ISREG(st.st_mode));
		}
	}
	return size;
}

/*
 * The linker's pattern: small writes at scattered offsets, read back in
 * between.  None of the reads and getattrs reaches the sandbox, and close
 * pushes the extents as one write.
 */
static void test_scattered_writes_local(void **state)
{
	struct tc_env *e = *state;
	static char model[MODEL_MAX];
	struct sbx_node *n;
	struct sbx_file *fh;
	size_t size;

	assert_int_equal(pmem_ext_write(e->mem, "out", "old", 3), 0);
	tc_settle(e);
	assert_int_equal(tc_unlink(e, "out"), 0);
	assert_int_equal(tc_create(e, "out", O_RDWR | O_TRUNC, &n, &fh), 0);
	memset(model, 0, sizeof(model));
	size = random_ops(e, n, fh, model, MODEL_MAX, 4096, 400, 12345);
	/* Nothing reached the sandbox while the file was being written. */
	assert_int_equal(trips(e), 0);
	assert_int_equal(tc_close(e, fh), 0);
	/* One push at close, one write: the gaps between the extents (none
	 * wider than CACHE_WB_GAP) filled from the image. */
	assert_int_equal(pmem_calls(e->mem, "write"), 1);
	assert_int_equal(pmem_calls(e->mem, "read"), 0);
	assert_true(tc_holds(e, "out", model, size));
	e->ops->forget(e->cache, n);
}

/*
 * The same with large writes over 12 MiB: the 4 MiB buffer fills and is
 * pushed while the file is written (the image goes with it, reads then
 * ask the sandbox), gaps too wide to fill stay separate writes.  Every
 * read still answers what the writes made.
 */
static void test_scattered_writes_large(void **state)
{
	struct tc_env *e = *state;
	static char model[12u << 20];
	struct sbx_node *n;
	struct sbx_file *fh;
	size_t size;

	tc_settle(e);
	assert_int_equal(tc_create(e, "big", O_RDWR | O_EXCL, &n, &fh), 0);
	memset(model, 0, sizeof(model));
	size = random_ops(e, n, fh, model, sizeof(model), 512u << 10, 300,
			  777);
	assert_true(pmem_calls(e->mem, "write") > 1);
	assert_int_equal(tc_close(e, fh), 0);
	assert_true(tc_holds(e, "big", model, size));
	e->ops->forget(e->cache, n);
}

/*
 * An existing file whose content is cached (the bulk walk brought it):
 * writes into it are read back from the content overlaid with them, and
 * getattr tells the size they made, without a round trip.
 */
static void test_cached_content_overlaid(void **state)
{
	struct tc_env *e = *state;
	const char *was = "0123456789abcdef";
	struct sbx_node *n;
	struct sbx_file *fh;
	struct stat st;
	char buf[32];

	assert_int_equal(pmem_ext_write(e->mem, "c", was, 16), 0);
	tc_settle(e);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "c", &n, &st), 0);
	assert_int_equal(tc_open(e, n, O_RDWR, &fh), 0);
	pmem_calls_reset(e->mem);
	assert_int_equal(e->ops->write(e->cache, fh, "XY", 2, 4), 2);
	assert_int_equal(e->ops->write(e->cache, fh, "end", 3, 18), 3);
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 2), 19);
	assert_memory_equal(buf, "23XY6789abcdef\0\0end", 19);
	assert_int_equal(e->ops->getattr(e->cache, n, fh, &st), 0);
	assert_int_equal(st.st_size, 21);
	assert_int_equal(trips(e), 0);
	assert_int_equal(tc_close(e, fh), 0);
	assert_int_equal(pmem_calls(e->mem, "write"), 1);
	assert_true(tc_holds(e, "c", "0123XY6789abcdef\0\0end", 21));
	e->ops->forget(e->cache, n);
}

/*
 * Someone else writes the file in the sandbox between our write and our
 * read: the image is not the file any more, so the read pushes and asks.
 */
static void test_event_between_write_and_read(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;
	struct stat st;
	char buf[32];

	tc_settle(e);
	assert_int_equal(tc_create(e, "f", O_RDWR | O_EXCL, &n, &fh), 0);
	assert_int_equal(e->ops->write(e->cache, fh, "hello", 5, 0), 5);
	assert_int_equal(e->ops->write(e->cache, fh, "!", 1, 20), 1);
	pmem_calls_reset(e->mem);
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 0), 21);
	assert_memory_equal(buf, "hello\0\0\0\0\0", 10);
	assert_int_equal(trips(e), 0);

	assert_int_equal(pmem_ext_pwrite(e->mem, "f", "XY", 2, 8), 0);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	pmem_calls_reset(e->mem);
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 0), 21);
	assert_memory_equal(buf, "hello\0\0\0XY", 10);
	assert_int_equal(buf[20], '!');
	assert_true(pmem_calls(e->mem, "write") >= 1);
	/* Read from the sandbox: alone, or by a look-ahead request
	 * (cache_ahead.c), whichever answers first. */
	assert_true(pmem_calls(e->mem, "read") + pmem_calls(e->mem, "bulk") >=
		    1);
	/* The next write: its size is right whether getattr answers from a
	 * new image (the read above stored the content again) or pushes. */
	assert_int_equal(e->ops->write(e->cache, fh, "Z", 1, 30), 1);
	assert_int_equal(e->ops->getattr(e->cache, n, fh, &st), 0);
	assert_int_equal(st.st_size, 31);
	assert_int_equal(tc_close(e, fh), 0);
	e->ops->forget(e->cache, n);
}

/* Fail the second write call from now on (the hook runs before faults). */
static int write_calls;

static void fail_second_write(const char *op, const char *path, void *p)
{
	struct tc_env *e = p;

	(void)path;
	if (strcmp(op, "write") == 0 && ++write_calls == 2)
		assert_int_equal(pmem_fail(e->mem, "write", -ENOSPC, 1), 0);
}

/*
 * A push that fails, at its first extent or after some got through, keeps
 * every byte not delivered; fsync and close report the error, and the
 * next push delivers them.
 */
static void test_push_failure_keeps_extents(void **state)
{
	struct tc_env *e = *state;
	/* Gaps wider than CACHE_WB_GAP: three extents, three writes. */
	static char want[200004];
	struct sbx_node *n;
	struct sbx_file *fh;

	tc_settle(e);
	memset(want, 0, sizeof(want));
	memcpy(want, "AAAA", 4);
	memcpy(want + 100000, "BBBB", 4);
	memcpy(want + 200000, "CCCC", 4);
	assert_int_equal(tc_create(e, "g", O_RDWR | O_EXCL, &n, &fh), 0);
	assert_int_equal(e->ops->write(e->cache, fh, "CCCC", 4, 200000), 4);
	assert_int_equal(e->ops->write(e->cache, fh, "AAAA", 4, 0), 4);
	assert_int_equal(e->ops->write(e->cache, fh, "BBBB", 4, 100000), 4);

	/* The first extent fails: nothing lost. */
	assert_int_equal(pmem_fail(e->mem, "write", -ENOSPC, 1), 0);
	assert_int_equal(e->ops->fsync(e->cache, fh, false), -ENOSPC);
	/* The second fails: the first is in, the other two kept. */
	write_calls = 0;
	pmem_set_hook(e->mem, fail_second_write, e);
	assert_int_equal(e->ops->flush(e->cache, fh), -ENOSPC);
	pmem_set_hook(e->mem, NULL, NULL);
	assert_int_equal(e->ops->fsync(e->cache, fh, false), 0);
	assert_true(tc_holds(e, "g", want, sizeof(want)));
	assert_int_equal(e->ops->release(e->cache, fh), 0);
	e->ops->forget(e->cache, n);
}

/*
 * Extents merge when they touch or overlap, the later bytes winning; the
 * pushed file is what the writes made.
 */
static void test_extents_merge(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;

	tc_settle(e);
	assert_int_equal(tc_create(e, "m", O_RDWR | O_EXCL, &n, &fh), 0);
	assert_int_equal(e->ops->write(e->cache, fh, "cc", 2, 4), 2);
	assert_int_equal(e->ops->write(e->cache, fh, "aa", 2, 0), 2);
	assert_int_equal(e->ops->write(e->cache, fh, "ee", 2, 8), 2);
	/* Touches the first, overlaps the second, bridges to the third. */
	assert_int_equal(e->ops->write(e->cache, fh, "bbbCdd", 6, 2), 6);
	assert_int_equal(tc_close(e, fh), 0);
	assert_int_equal(pmem_calls(e->mem, "write"), 1);
	assert_true(tc_holds(e, "m", "aabbbCddee", 10));
	e->ops->forget(e->cache, n);
}

/*
 * The name of a file with buffered bytes stopped naming it behind us (a
 * rename the sandbox did although its answer was lost in an outage), and
 * a new file was made under that name through the mount.  The buffered
 * bytes belong to the old file: they must not be pushed into the new one
 * (which would then hold data where its writer wrote nothing).  When the
 * agent said where the file went (a paired rename), they follow it there;
 * when it could not, the owner's close() says they were not delivered.
 */
static void test_name_taken_by_new_file(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n, *n2;
	struct sbx_file *fh, *fh2;
	struct stat st;

	for (int paired = 1; paired >= 0; paired--) {
		pmem_pair_renames(e->mem, paired);
		tc_settle(e);
		assert_int_equal(tc_create(e, "a", O_RDWR | O_EXCL, &n, &fh),
				 0);
		assert_int_equal(e->ops->write(e->cache, fh, "OLD!", 4, 0), 4);
		assert_int_equal(pmem_ext_rename(e->mem, "a", "b", 0), 0);
		tc_settle(e);
		/* The kernel looks "a" up, finds it missing, creates it. */
		assert_int_equal(tc_create(e, "a", O_RDWR, &n2, &fh2), 0);
		assert_int_equal(e->ops->getattr(e->cache, n2, fh2, &st), 0);
		assert_int_equal(st.st_size, 0);
		if (paired) {
			assert_int_equal(tc_close(e, fh), 0);
			assert_true(tc_holds(e, "b", "OLD!", 4));
		} else {
			assert_true(tc_close(e, fh) < 0);
			sbx_error_clear();
		}
		assert_int_equal(tc_close(e, fh2), 0);
		assert_true(tc_holds(e, "a", "", 0));
		e->ops->forget(e->cache, n);
		e->ops->forget(e->cache, n2);
		assert_int_equal(pmem_ext_unlink(e->mem, "a"), 0);
		assert_int_equal(pmem_ext_unlink(e->mem, "b"), 0);
	}
}

/*
 * Another file was moved onto the name of a file with buffered bytes,
 * behind the mount, and its event has not arrived (the stream is held):
 * the tree still takes the name for the open file.  The push names the
 * open file's inode, so the bytes do not land in the moved file; the
 * owner's close() says they were not delivered (ESTALE).  Without the
 * inode in the push, the moved file would read "OLD!".
 */
static void test_file_moved_onto_buffered_name(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;
	struct stat st;

	assert_int_equal(pmem_ext_write(e->mem, "t", "tttt", 4), 0);
	tc_settle(e);
	n = tc_walk_path(e->cache, "t", false, &st);
	assert_int_equal(tc_open(e, n, O_WRONLY, &fh), 0);
	assert_int_equal(e->ops->write(e->cache, fh, "OLD!", 4, 0), 4);
	assert_int_equal(pmem_calls(e->mem, "write") +
				 pmem_calls(e->mem, "write_then"),
			 0);
	pmem_watch_hold(e->mem, true);
	assert_int_equal(pmem_ext_write(e->mem, "s", "SSSS", 4), 0);
	assert_int_equal(pmem_ext_rename(e->mem, "s", "t", 0), 0);
	assert_int_equal(tc_close(e, fh), -ESTALE);
	assert_true(tc_holds(e, "t", "SSSS", 4));
	pmem_watch_hold(e->mem, false);
	e->ops->forget(e->cache, n);
}

/*
 * The same for a file made through the mount (its inode number comes from
 * the create's answer), and the other side of the check: the file renamed
 * through the mount while its bytes are buffered is still the same file,
 * and they land in it under its new name.
 */
static void test_buffered_bytes_follow_the_file(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n, *n2;
	struct sbx_file *fh, *fh2;

	tc_settle(e);
	assert_int_equal(tc_create(e, "a", O_EXCL, &n, &fh), 0);
	assert_int_equal(e->ops->write(e->cache, fh, "AAAA", 4, 0), 4);
	assert_int_equal(e->ops->rename(e->cache, e->root, "a", e->root, "b",
					0),
			 0);
	assert_int_equal(tc_close(e, fh), 0);
	assert_true(tc_holds(e, "b", "AAAA", 4));

	assert_int_equal(tc_create(e, "c", O_EXCL, &n2, &fh2), 0);
	assert_int_equal(e->ops->write(e->cache, fh2, "CCCC", 4, 0), 4);
	pmem_watch_hold(e->mem, true);
	assert_int_equal(pmem_ext_rename(e->mem, "b", "c", 0), 0);
	assert_int_equal(tc_close(e, fh2), -ESTALE);
	assert_true(tc_holds(e, "c", "AAAA", 4));
	pmem_watch_hold(e->mem, false);
	e->ops->forget(e->cache, n);
	e->ops->forget(e->cache, n2);
}

/*
 * The kernel writes a mapping's dirty pages back through whichever
 * writable open file it picks, an O_APPEND one too: write_at puts them at
 * their offset, while a write() through that file still appends.
 */
static void test_write_at_through_an_append_file(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;
	struct stat st;

	assert_int_equal(pmem_ext_write(e->mem, "f", "0123456789", 10), 0);
	tc_settle(e);
	n = tc_walk_path(e->cache, "f", false, &st);
	assert_int_equal(tc_open(e, n, O_RDWR | O_APPEND, &fh), 0);
	assert_int_equal(e->ops->write_at(e->cache, fh, "AB", 2, 3), 2);
	assert_true(tc_holds(e, "f", "012AB56789", 10));
	assert_int_equal(e->ops->write(e->cache, fh, "Z", 1, 0), 1);
	assert_true(tc_holds(e, "f", "012AB56789Z", 11));
	assert_int_equal(tc_close(e, fh), 0);
	e->ops->forget(e->cache, n);
}

/* ---- hard links and reused inode numbers --------------------------------- */

/* mkdir root/name through the cache. */
static struct sbx_node *mkdir_root(struct tc_env *e, const char *name)
{
	struct sbx_node *d;
	struct stat st;

	assert_int_equal(e->ops->mkdir(e->cache, e->root, name, 0755, &d, &st),
			 0);
	return d;
}

/* opendir + releasedir of dir: what `ls` costs in pushes. */
static int list_dir(struct tc_env *e, struct sbx_node *dir)
{
	struct sbx_file *dh;
	int rc = e->ops->opendir(e->cache, dir, &dh);

	if (rc == 0)
		assert_int_equal(e->ops->releasedir(e->cache, dh), 0);
	return rc;
}

/*
 * A hard-linked file whose names are all removed frees its inode number,
 * and the in-memory sandbox gives it to the next file at once (ext4 does,
 * soon).  When that file gets a second name, it is another file: listing
 * the directory of the dead names must not push its bytes (random tester,
 * seed 388538268: opendir said ENOENT when such a push failed).
 */
static void test_reused_inode_number_is_another_file(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *d1, *a, *b, *x, *y;
	struct sbx_open_result res;
	struct sbx_file *fx;
	struct stat st, sa;

	tc_settle(e);
	d1 = mkdir_root(e, "d1");
	assert_int_equal(e->ops->create(e->cache, d1, "a", 0644,
					O_CREAT | O_EXCL | O_WRONLY, &a, &sa,
					&res),
			 0);
	assert_int_equal(tc_close(e, res.fh), 0);
	assert_int_equal(e->ops->link(e->cache, a, d1, "b", &b, &st), 0);
	assert_int_equal(st.st_nlink, 2);
	assert_int_equal(e->ops->unlink(e->cache, d1, "a"), 0);
	assert_int_equal(e->ops->unlink(e->cache, d1, "b"), 0);
	/* The number comes back for x, which then gets a second name. */
	assert_int_equal(tc_create(e, "x", O_EXCL, &x, &fx), 0);
	assert_int_equal(e->ops->getattr(e->cache, x, fx, &st), 0);
	assert_int_equal(st.st_ino, sa.st_ino);
	assert_int_equal(e->ops->link(e->cache, x, e->root, "y", &y, &st), 0);
	assert_int_equal(e->ops->write(e->cache, fx, "x", 1, 0), 1);
	pmem_calls_reset(e->mem);
	assert_int_equal(list_dir(e, d1), 0);
	assert_int_equal(pmem_calls(e->mem, "write") +
				 pmem_calls(e->mem, "write_then"),
			 0);
	assert_int_equal(tc_close(e, fx), 0);
	assert_true(tc_holds(e, "y", "x", 1));
	e->ops->forget(e->cache, a);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, x);
	e->ops->forget(e->cache, y);
	e->ops->forget(e->cache, d1);
}

/*
 * The same with one dead name removed behind the mount (so the cache only
 * knows it may be gone) and the other, removed through the mount, coming
 * back as the name of a new file with the reused number: the new file is
 * not tied to the old name.
 */
static void test_removed_name_back_as_another_file(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *d2, *a, *a2, *b;
	struct sbx_file *fa;
	struct stat st, sa;

	tc_settle(e);
	d2 = mkdir_root(e, "d2");
	assert_int_equal(tc_create(e, "a", O_EXCL, &a, &fa), 0);
	assert_int_equal(tc_close(e, fa), 0);
	assert_int_equal(e->ops->getattr(e->cache, a, NULL, &sa), 0);
	assert_int_equal(e->ops->link(e->cache, a, d2, "b", &b, &st), 0);
	assert_int_equal(tc_unlink(e, "a"), 0);
	assert_int_equal(pmem_ext_unlink(e->mem, "d2/b"), 0);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	/* a again: a new file, with the number of the old one. */
	assert_int_equal(tc_create(e, "a", O_EXCL, &a2, &fa), 0);
	assert_int_equal(e->ops->getattr(e->cache, a2, fa, &st), 0);
	assert_int_equal(st.st_ino, sa.st_ino);
	assert_int_equal(st.st_nlink, 1);
	assert_int_equal(e->ops->write(e->cache, fa, "new", 3, 0), 3);
	pmem_calls_reset(e->mem);
	assert_int_equal(list_dir(e, d2), 0);
	assert_int_equal(pmem_calls(e->mem, "write") +
				 pmem_calls(e->mem, "write_then"),
			 0);
	assert_int_equal(tc_close(e, fa), 0);
	assert_true(tc_holds(e, "a", "new", 3));
	e->ops->forget(e->cache, a);
	e->ops->forget(e->cache, a2);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, d2);
}

/*
 * A push that fails before a listing (readdirplus wants every size) keeps
 * its bytes and its error for the file's owner; the listing goes on.
 */
static void test_listing_survives_a_failed_push(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;

	tc_settle(e);
	assert_int_equal(tc_create(e, "f", O_EXCL, &n, &fh), 0);
	assert_int_equal(e->ops->write(e->cache, fh, "data", 4, 0), 4);
	assert_int_equal(pmem_fail(e->mem, "write", -EIO, 1), 0);
	assert_int_equal(list_dir(e, e->root), 0);
	assert_int_equal(pmem_calls(e->mem, "write"), 1);
	/* The owner is told, and nothing is lost. */
	assert_int_equal(e->ops->fsync(e->cache, fh, false), 0);
	assert_true(tc_holds(e, "f", "data", 4));
	assert_int_equal(tc_close(e, fh), 0);
	e->ops->forget(e->cache, n);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_scattered_writes_local,
						tc_setup, tc_teardown),
		cmocka_unit_test_setup_teardown(test_scattered_writes_large,
						tc_setup, tc_teardown),
		cmocka_unit_test_setup_teardown(test_cached_content_overlaid,
						tc_setup, tc_teardown),
		cmocka_unit_test_setup_teardown(
			test_event_between_write_and_read, tc_setup,
			tc_teardown),
		cmocka_unit_test_setup_teardown(
			test_push_failure_keeps_extents, tc_setup, tc_teardown),
		cmocka_unit_test_setup_teardown(test_extents_merge, tc_setup,
						tc_teardown),
		cmocka_unit_test_setup_teardown(test_name_taken_by_new_file,
						tc_setup, tc_teardown),
		cmocka_unit_test_setup_teardown(
			test_file_moved_onto_buffered_name, tc_setup,
			tc_teardown),
		cmocka_unit_test_setup_teardown(
			test_buffered_bytes_follow_the_file, tc_setup,
			tc_teardown),
		cmocka_unit_test_setup_teardown(
			test_write_at_through_an_append_file, tc_setup,
			tc_teardown),
		cmocka_unit_test_setup_teardown(
			test_reused_inode_number_is_another_file, tc_setup,
			tc_teardown),
		cmocka_unit_test_setup_teardown(
			test_removed_name_back_as_another_file, tc_setup,
			tc_teardown),
		cmocka_unit_test_setup_teardown(
			test_listing_survives_a_failed_push, tc_setup,
			tc_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
