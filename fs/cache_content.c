/*
 * Cached file contents; see cache_i.h.
 *
 * Contents live in memory up to CACHE_MEM_BUDGET, least recently used
 * first out, except that content read to its end goes before anything
 * else and is dropped rather than spilled: the kernel's page cache has it.
 * Other large ones spill to a file of their own under the disk directory,
 * named by a serial number unique in this cache, so a newer content can
 * never be confused with an older spill.  The decision to spill or remove
 * is taken under c->lock; the disk work itself is queued (struct
 * disk_job) and done by cache_unlock() once the lock is dropped, so no
 * request waits on the disk for another one.  A spilled content becomes
 * readable from disk only when its file is complete.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/xmalloc.h"
#include "cache_i.h"

static void lru_unlink(struct cache *c, struct content *ct)
{
	if (ct->lru_prev)
		ct->lru_prev->lru_next = ct->lru_next;
	else if (c->lru_head == ct)
		c->lru_head = ct->lru_next;
	if (ct->lru_next)
		ct->lru_next->lru_prev = ct->lru_prev;
	else if (c->lru_tail == ct)
		c->lru_tail = ct->lru_prev;
	ct->lru_prev = ct->lru_next = NULL;
}

static void lru_push(struct cache *c, struct content *ct)
{
	ct->lru_prev = NULL;
	ct->lru_next = c->lru_head;
	if (c->lru_head)
		c->lru_head->lru_prev = ct;
	c->lru_head = ct;
	if (!c->lru_tail)
		c->lru_tail = ct;
}

/* Least recently used end: the first to go. */
static void lru_append(struct cache *c, struct content *ct)
{
	ct->lru_next = NULL;
	ct->lru_prev = c->lru_tail;
	if (c->lru_tail)
		c->lru_tail->lru_next = ct;
	c->lru_tail = ct;
	if (!c->lru_head)
		c->lru_head = ct;
}

static char *disk_name(const struct cache *c, const struct content *ct)
{
	return sbx_xasprintf("%s/%lu", c->disk_dir, ct->serial);
}

static void queue_job(struct cache *c, char *path, void *data, size_t len,
		      unsigned long serial)
{
	struct disk_job *j = sbx_xcalloc(1, sizeof(*j));

	j->path = path;
	j->data = data;
	j->len = len;
	j->serial = serial;
	j->next = c->jobs;
	c->jobs = j;
}

/* A spill job finished writing: is its content still wanted? */
static bool spill_done(struct cache *c, unsigned long serial, bool written)
{
	for (struct content **pp = &c->spilling; *pp;
	     pp = &(*pp)->spill_next)
		if ((*pp)->serial == serial) {
			struct content *ct = *pp;

			*pp = ct->spill_next;
			ct->spill_next = NULL;
			ct->spilling = false;
			ct->on_disk = written; /* else fetched again */
			return true;
		}
	return false;
}

static void spill_forget(struct cache *c, struct content *ct)
{
	for (struct content **pp = &c->spilling; *pp;
	     pp = &(*pp)->spill_next)
		if (*pp == ct) {
			*pp = ct->spill_next;
			break;
		}
}

void content_drop_file(struct cache *c, struct cnode *n)
{
	content_drop(c, n);
	if (n->in_ring)
		for (struct cnode *a = n->ring_next; a != n; a = a->ring_next)
			content_drop(c, a);
}

void content_drop(struct cache *c, struct cnode *n)
{
	struct content *ct = n->content;

	if (!ct)
		return;
	ahead_consumed(c, ct, false);
	if (ct->data) {
		lru_unlink(c, ct);
		c->mem_bytes -= ct->len;
		free(ct->data);
	} else if (ct->spilling) {
		/* Its job removes the file when it finds it unwanted. */
		spill_forget(c, ct);
	} else if (ct->on_disk) {
		queue_job(c, disk_name(c, ct), NULL, 0, 0);
	}
	free(ct);
	n->content = NULL;
}

/*
 * Spill or drop least recently used contents until under budget.  A spill
 * is a job writing the data; until it is done the content is on
 * c->spilling and not readable (a read fetches it again).
 */
static void content_trim(struct cache *c)
{
	while (c->mem_bytes > CACHE_MEM_BUDGET && c->lru_tail) {
		struct content *ct = c->lru_tail;

		lru_unlink(c, ct);
		ahead_consumed(c, ct, false);
		c->mem_bytes -= ct->len;
		if (c->disk_dir && ct->len >= CACHE_DISK_MIN &&
		    !ct->delivered) {
			queue_job(c, disk_name(c, ct), ct->data, ct->len,
				  ct->serial);
			ct->spilling = true;
			ct->spill_next = c->spilling;
			c->spilling = ct;
		} else {
			free(ct->data);
		}
		ct->data = NULL;
		ct->on_disk = false;
	}
}

/* Does n's content hold the bytes of n's last known attributes? */
static bool content_matches(const struct cnode *n)
{
	const struct content *ct = n->content;

	return ct && (ct->data || ct->on_disk) &&
	       ct->ino == n->st.st_ino && ct->size == n->st.st_size &&
	       (off_t)ct->len == n->st.st_size &&
	       ct->mtime.tv_sec == n->st.st_mtim.tv_sec &&
	       ct->mtime.tv_nsec == n->st.st_mtim.tv_nsec;
}

bool content_valid(const struct cnode *n)
{
	return n->st_valid && content_matches(n);
}

void content_store(struct cache *c, struct cnode *n, const void *data,
		   size_t len, const struct stat *st)
{
	struct content *ct;

	content_drop(c, n);
	ct = sbx_xcalloc(1, sizeof(*ct));
	ct->data = sbx_xmalloc(len ? len : 1);
	memcpy(ct->data, data, len);
	ct->len = len;
	ct->serial = ++c->content_serial;
	ct->ino = st->st_ino;
	ct->size = st->st_size;
	ct->mtime = st->st_mtim;
	n->content = ct;
	lru_push(c, ct);
	c->mem_bytes += len;
	content_trim(c);
}

/* content_read(), of content valid (`last`: matching n's last known
 * attributes, valid or not). */
static ssize_t read_held(struct cache *c, struct cnode *n, void *buf,
			 size_t size, off_t off, char **disk_out, bool last)
{
	struct content *ct = n->content;
	size_t avail;

	if (disk_out)
		*disk_out = NULL;
	if (last ? !content_matches(n) : !content_valid(n))
		return -1;
	if (off >= (off_t)ct->len)
		return 0;
	avail = ct->len - (size_t)off;
	if (size > avail)
		size = avail;
	if (ct->data) {
		memcpy(buf, (char *)ct->data + off, size);
		ahead_consumed(c, ct, true);
		lru_unlink(c, ct);
		/*
		 * Read to its end: the kernel's page cache holds it now, so it
		 * is the first to go, and not to disk (a cold walk then needs
		 * no more memory than its look-ahead, and writes nothing);
		 * else most recently used first.
		 */
		ct->delivered = (size_t)off + size >= ct->len;
		if (ct->delivered)
			lru_append(c, ct);
		else
			lru_push(c, ct);
		return (ssize_t)size;
	}
	if (disk_out)
		*disk_out = disk_name(c, ct);
	return -1;
}

ssize_t content_read(struct cache *c, struct cnode *n, void *buf, size_t size,
		     off_t off, char **disk_out)
{
	return read_held(c, n, buf, size, off, disk_out, false);
}

ssize_t content_read_last(struct cache *c, struct cnode *n, void *buf,
			  size_t size, off_t off, char **disk_out)
{
	return read_held(c, n, buf, size, off, disk_out, true);
}

ssize_t content_read_disk(const char *path, void *buf, size_t size, off_t off)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t got;

	if (fd < 0)
		return -1;
	got = pread(fd, buf, size, off);
	close(fd);
	return got;
}

void content_run_jobs(struct cache *c, struct disk_job *jobs)
{
	while (jobs) {
		struct disk_job *j = jobs;
		bool ok = false;

		jobs = j->next;
		if (!j->data) {
			unlink(j->path);
		} else {
			ok = sbx_file_write_atomic(j->path, j->data, j->len,
						   0600) == 0;
			if (!ok)
				sbx_error_clear();
			free(j->data);
			/* Readable from disk now, if still the same content. */
			cache_lock(c);
			bool kept = spill_done(c, j->serial, ok);

			/* Not cache_unlock(): this is its job runner. */
			pthread_mutex_unlock(&c->lock);
			if (!kept || !ok)
				unlink(j->path);
		}
		free(j->path);
		free(j);
	}
}

void content_clear_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d)))
		if (e->d_type == DT_REG)
			unlinkat(dirfd(d), e->d_name, 0);
	closedir(d);
}
