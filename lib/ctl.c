/* Control protocol framing, sockets and the exec client; see sbx/ctl.h. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "sbx/ctl.h"
#include "sbx/xmalloc.h"

/* ---- little-endian helpers -------------------------------------------- */

void sbx_ctl_put_u32(uint8_t *p, uint32_t v)
{
	p[0] = v & 0xff;
	p[1] = (v >> 8) & 0xff;
	p[2] = (v >> 16) & 0xff;
	p[3] = (v >> 24) & 0xff;
}

uint32_t sbx_ctl_get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static void put_u16(uint8_t *p, uint16_t v)
{
	p[0] = v & 0xff;
	p[1] = v >> 8;
}

static uint16_t get_u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static void put_header(uint8_t *p, uint8_t type, uint32_t len)
{
	p[0] = type;
	p[1] = 0;
	p[2] = 0;
	p[3] = 0;
	sbx_ctl_put_u32(p + 4, len);
}

/* ---- receive buffer ----------------------------------------------------- */

void sbx_ctl_rbuf_init(struct sbx_ctl_rbuf *rb, size_t max_payload)
{
	memset(rb, 0, sizeof(*rb));
	rb->max_payload = max_payload;
	rb->cap = SBX_CTL_HEADER_SIZE + SBX_CTL_DATA_MAX;
	if (rb->cap > SBX_CTL_HEADER_SIZE + max_payload)
		rb->cap = SBX_CTL_HEADER_SIZE + max_payload;
	if (rb->cap < 4096)
		rb->cap = 4096;
	rb->buf = sbx_xmalloc(rb->cap);
}

void sbx_ctl_rbuf_fini(struct sbx_ctl_rbuf *rb)
{
	free(rb->buf);
	memset(rb, 0, sizeof(*rb));
}

bool sbx_ctl_rbuf_partial(const struct sbx_ctl_rbuf *rb)
{
	return rb->end > rb->start;
}

/* Room for a whole frame of `need` bytes from rb->start. */
static void rbuf_reserve(struct sbx_ctl_rbuf *rb, size_t need)
{
	if (rb->start > 0 && (rb->cap - rb->start < need ||
			      rb->start == rb->end)) {
		memmove(rb->buf, rb->buf + rb->start, rb->end - rb->start);
		rb->end -= rb->start;
		rb->start = 0;
	}
	if (rb->cap < need) {
		rb->cap = need;
		rb->buf = sbx_xrealloc(rb->buf, rb->cap);
	}
}

ssize_t sbx_ctl_rbuf_fill(struct sbx_ctl_rbuf *rb, int fd)
{
	size_t have = rb->end - rb->start, need = SBX_CTL_HEADER_SIZE;
	ssize_t n;

	if (have >= SBX_CTL_HEADER_SIZE) {
		uint32_t len = sbx_ctl_get_u32(rb->buf + rb->start + 4);

		if (len <= rb->max_payload)
			need += len;
	}
	/* Ask for at least a full data frame so large streams move in few
	 * reads, but never grow past one maximal frame. */
	if (need < SBX_CTL_HEADER_SIZE + SBX_CTL_DATA_MAX)
		need = SBX_CTL_HEADER_SIZE + SBX_CTL_DATA_MAX;
	if (need > SBX_CTL_HEADER_SIZE + rb->max_payload &&
	    have < SBX_CTL_HEADER_SIZE + rb->max_payload)
		need = SBX_CTL_HEADER_SIZE + rb->max_payload;
	if (need < have + 1)
		need = have + 1;
	rbuf_reserve(rb, need);
	do {
		n = read(fd, rb->buf + rb->end, rb->cap - rb->end);
	} while (n < 0 && errno == EINTR);
	if (n < 0) {
		if (errno == EAGAIN)
			return -EAGAIN;
		return sbx_error_os("read from control socket");
	}
	rb->end += (size_t)n;
	return n;
}

ssize_t sbx_ctl_rbuf_fill_fds(struct sbx_ctl_rbuf *rb, int fd, int fds[3],
			      int *nfds)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * 8)];
	} cm;
	struct iovec iov;
	struct msghdr mh = { 0 };
	struct cmsghdr *c;
	ssize_t n;

	rbuf_reserve(rb, rb->end - rb->start + SBX_CTL_HEADER_SIZE +
				 SBX_CTL_DATA_MAX);
	iov.iov_base = rb->buf + rb->end;
	iov.iov_len = rb->cap - rb->end;
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = cm.buf;
	mh.msg_controllen = sizeof(cm.buf);
	do {
		n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
	} while (n < 0 && errno == EINTR);
	if (n < 0) {
		if (errno == EAGAIN)
			return -EAGAIN;
		return sbx_error_os("read from control socket");
	}
	for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		size_t k, cnt;
		int *p;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		cnt = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		p = (int *)CMSG_DATA(c);
		for (k = 0; k < cnt; k++) {
			int v;

			memcpy(&v, p + k, sizeof(v));
			if (*nfds < 3)
				fds[(*nfds)++] = v;
			else
				close(v);
		}
	}
	rb->end += (size_t)n;
	return n;
}

int sbx_ctl_rbuf_next(struct sbx_ctl_rbuf *rb, struct sbx_ctl_frame *f)
{
	size_t have = rb->end - rb->start;
	const uint8_t *p = rb->buf + rb->start;
	uint32_t len;

	if (have < SBX_CTL_HEADER_SIZE)
		return 0;
	len = sbx_ctl_get_u32(p + 4);
	if (len > rb->max_payload)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "control protocol: frame of type %u "
				     "has %u bytes (limit %zu)",
				     p[0], len, rb->max_payload);
	if (have < SBX_CTL_HEADER_SIZE + (size_t)len)
		return 0;
	f->type = p[0];
	f->len = len;
	f->data = p + SBX_CTL_HEADER_SIZE;
	rb->start += SBX_CTL_HEADER_SIZE + len;
	if (rb->start == rb->end)
		rb->start = rb->end = 0; /* data stays valid: not overwritten */
	return 1;
}

/* ---- send buffer -------------------------------------------------------- */

void sbx_ctl_wbuf_init(struct sbx_ctl_wbuf *wb)
{
	memset(wb, 0, sizeof(*wb));
}

void sbx_ctl_wbuf_fini(struct sbx_ctl_wbuf *wb)
{
	free(wb->buf);
	memset(wb, 0, sizeof(*wb));
}

size_t sbx_ctl_wbuf_pending(const struct sbx_ctl_wbuf *wb)
{
	return wb->end - wb->start;
}

static uint8_t *wbuf_room(struct sbx_ctl_wbuf *wb, size_t n)
{
	if (wb->start == wb->end)
		wb->start = wb->end = 0;
	if (wb->cap - wb->end < n && wb->start > 0) {
		memmove(wb->buf, wb->buf + wb->start, wb->end - wb->start);
		wb->end -= wb->start;
		wb->start = 0;
	}
	if (wb->cap - wb->end < n) {
		size_t cap = wb->cap ? wb->cap : 4096;

		while (cap - wb->end < n)
			cap *= 2;
		wb->buf = sbx_xrealloc(wb->buf, cap);
		wb->cap = cap;
	}
	return wb->buf + wb->end;
}

void sbx_ctl_wbuf_put(struct sbx_ctl_wbuf *wb, uint8_t type, const void *data,
		      size_t len)
{
	uint8_t *p = wbuf_room(wb, SBX_CTL_HEADER_SIZE + len);

	put_header(p, type, (uint32_t)len);
	if (len)
		memcpy(p + SBX_CTL_HEADER_SIZE, data, len);
	wb->end += SBX_CTL_HEADER_SIZE + len;
}

ssize_t sbx_ctl_wbuf_put_from_fd(struct sbx_ctl_wbuf *wb, uint8_t type,
				 int src, size_t max)
{
	uint8_t *p;
	ssize_t n;

	if (max > SBX_CTL_DATA_MAX)
		max = SBX_CTL_DATA_MAX;
	p = wbuf_room(wb, SBX_CTL_HEADER_SIZE + max);
	do {
		n = read(src, p + SBX_CTL_HEADER_SIZE, max);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	if (n == 0)
		return 0;
	put_header(p, type, (uint32_t)n);
	wb->end += SBX_CTL_HEADER_SIZE + (size_t)n;
	return n;
}

int sbx_ctl_wbuf_flush(struct sbx_ctl_wbuf *wb, int fd)
{
	while (wb->start < wb->end) {
		ssize_t n = send(fd, wb->buf + wb->start, wb->end - wb->start,
				 MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return 0;
			return sbx_error_os("write to control socket");
		}
		wb->start += (size_t)n;
	}
	wb->start = wb->end = 0;
	return 0;
}

void sbx_ctl_wbuf_put_error(struct sbx_ctl_wbuf *wb, int err, int kind,
			    const char *msg)
{
	size_t mlen = strlen(msg);
	uint8_t *p;

	if (mlen > SBX_CTL_SMALL_MAX - 8)
		mlen = SBX_CTL_SMALL_MAX - 8;
	p = sbx_xmalloc(8 + mlen);
	sbx_ctl_put_u32(p, (uint32_t)(err < 0 ? -err : err));
	sbx_ctl_put_u32(p + 4, (uint32_t)kind);
	memcpy(p + 8, msg, mlen);
	sbx_ctl_wbuf_put(wb, SBX_CTL_ERROR, p, 8 + mlen);
	free(p);
}

/* ---- REQUEST encoding --------------------------------------------------- */

#define REQ_FIXED 20 /* version, flags, rows, cols, argc, envc */

static size_t vec_len(char *const *v)
{
	size_t n = 0;

	while (v && v[n])
		n++;
	return n;
}

int sbx_ctl_request_encode(uint8_t **out, size_t *len_out,
			   const struct sbx_ctl_request *req)
{
	size_t argc = vec_len(req->argv), envc = vec_len(req->envp);
	size_t len = REQ_FIXED, i;
	const char *cwd = req->cwd ? req->cwd : "";
	uint8_t *buf, *p;

	*out = NULL;
	if (argc == 0 || !req->argv[0][0])
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "no command to run");
	len += strlen(cwd) + 1;
	for (i = 0; i < argc; i++)
		len += strlen(req->argv[i]) + 1;
	for (i = 0; i < envc; i++)
		len += strlen(req->envp[i]) + 1;
	if (req->flags & SBX_CTL_REQ_UMASK)
		len += 4;
	if (len > SBX_CTL_REQUEST_MAX)
		return sbx_error_set(SBX_ERR_CONFIG, -E2BIG,
				     "command line and environment are too "
				     "long (%zu bytes, limit %u)",
				     len, SBX_CTL_REQUEST_MAX);
	p = buf = sbx_xmalloc(len);
	sbx_ctl_put_u32(p, SBX_CTL_VERSION);
	sbx_ctl_put_u32(p + 4, req->flags);
	put_u16(p + 8, req->rows);
	put_u16(p + 10, req->cols);
	sbx_ctl_put_u32(p + 12, (uint32_t)argc);
	sbx_ctl_put_u32(p + 16, (uint32_t)envc);
	p += REQ_FIXED;
#define PUTS(s)                                                                \
	do {                                                                   \
		size_t l_ = strlen(s) + 1;                                     \
		memcpy(p, (s), l_);                                            \
		p += l_;                                                       \
	} while (0)
	PUTS(cwd);
	for (i = 0; i < argc; i++)
		PUTS(req->argv[i]);
	for (i = 0; i < envc; i++)
		PUTS(req->envp[i]);
#undef PUTS
	if (req->flags & SBX_CTL_REQ_UMASK)
		sbx_ctl_put_u32(p, req->umask & 0777);
	*out = buf;
	*len_out = len;
	return 0;
}

int sbx_ctl_request_decode(struct sbx_ctl_request **out, const uint8_t *data,
			   size_t len)
{
	uint32_t argc, envc, version, flags, umask_v = 0;
	size_t nstr, i, slen;
	struct sbx_ctl_request *r;
	char *strs, *s, *end;

	*out = NULL;
	if (len < REQ_FIXED)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "control protocol: short REQUEST");
	version = sbx_ctl_get_u32(data);
	if (version != SBX_CTL_VERSION)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTONOSUPPORT,
				     "control protocol version %u is not "
				     "supported (this daemon speaks %u); "
				     "use the sbx-exec of the same release",
				     version, SBX_CTL_VERSION);
	argc = sbx_ctl_get_u32(data + 12);
	envc = sbx_ctl_get_u32(data + 16);
	flags = sbx_ctl_get_u32(data + 4);
	if (flags & SBX_CTL_REQ_UMASK) {
		/* A trailing u32 after the strings. */
		if (len < REQ_FIXED + 4)
			return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					     "control protocol: short REQUEST");
		len -= 4;
		umask_v = sbx_ctl_get_u32(data + len);
		if (umask_v > 0777)
			return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					     "control protocol: bad umask %o",
					     umask_v);
	}
	slen = len - REQ_FIXED;
	/* Every string takes at least its NUL. */
	if (argc == 0 || argc > slen || envc > slen ||
	    (size_t)argc + envc + 1 > slen)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "control protocol: bad REQUEST counts");
	if (data[len - 1] != '\0')
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "control protocol: unterminated REQUEST");
	nstr = 1 + (size_t)argc + envc;
	r = sbx_xcalloc(1, sizeof(*r) + (argc + 1 + envc + 1) * sizeof(char *) +
				   slen);
	r->argv = (char **)(r + 1);
	r->envp = r->argv + argc + 1;
	strs = (char *)(r->envp + envc + 1);
	memcpy(strs, data + REQ_FIXED, slen);
	r->version = version;
	r->flags = flags;
	r->umask = umask_v;
	r->rows = get_u16(data + 8);
	r->cols = get_u16(data + 10);
	s = strs;
	end = strs + slen;
	for (i = 0; i < nstr; i++) {
		char *z;

		if (s >= end)
			goto bad;
		z = memchr(s, '\0', (size_t)(end - s));
		if (!z)
			goto bad;
		if (i == 0)
			r->cwd = s;
		else if (i <= argc)
			r->argv[i - 1] = s;
		else
			r->envp[i - 1 - argc] = s;
		s = z + 1;
	}
	if (s != end || !r->argv[0][0])
		goto bad;
	*out = r;
	return 0;
bad:
	free(r);
	return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
			     "control protocol: malformed REQUEST");
}

void sbx_ctl_request_free(struct sbx_ctl_request *req)
{
	free(req);
}

/* ---- sockets ------------------------------------------------------------ */

/*
 * Fill `sa` for `path`.  When the path does not fit sun_path, open its
 * directory (O_PATH) and address it as /proc/self/fd/N/<base>; *dirfd is
 * then that descriptor, for the caller to close after bind/connect.
 */
static int make_addr(struct sockaddr_un *sa, const char *path, int *dirfd)
{
	const char *base;
	char *dir;

	*dirfd = -1;
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	if (strlen(path) < sizeof(sa->sun_path)) {
		memcpy(sa->sun_path, path, strlen(path) + 1);
		return 0;
	}
	base = strrchr(path, '/');
	if (!base || strlen(base) + 32 >= sizeof(sa->sun_path))
		return sbx_error_set(SBX_ERR_CONFIG, -ENAMETOOLONG,
				     "control socket path is too long: %s",
				     path);
	dir = sbx_xstrndup(path, (size_t)(base - path) + 1);
	*dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	free(dir);
	if (*dirfd < 0)
		return sbx_error_os("open directory of %s", path);
	snprintf(sa->sun_path, sizeof(sa->sun_path), "/proc/self/fd/%d%s",
		 *dirfd, base);
	return 0;
}

static int try_connect(const char *path, int timeout_ms, int *fd_out)
{
	struct sockaddr_un sa;
	int fd = -1, dirfd = -1, rc;

	*fd_out = -1;
	rc = make_addr(&sa, path, &dirfd);
	if (rc < 0)
		return rc;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		rc = sbx_error_os("socket");
		goto out;
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (errno == EAGAIN || errno == EINPROGRESS) {
			/* Backlog full: wait for the daemon to accept. */
			struct pollfd p = { .fd = fd, .events = POLLOUT };
			int err = 0;
			socklen_t el = sizeof(err);

			rc = poll(&p, 1, timeout_ms);
			if (rc == 0) {
				rc = sbx_error_set(SBX_ERR_OS, -ETIMEDOUT,
						   "connect %s: timed out",
						   path);
				goto out;
			}
			getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
			if (err) {
				errno = err;
				rc = sbx_error_os("connect %s", path);
				goto out;
			}
		} else {
			rc = sbx_error_os("connect %s", path);
			goto out;
		}
	}
	*fd_out = fd;
	fd = -1;
	rc = 0;
out:
	if (fd >= 0)
		close(fd);
	if (dirfd >= 0)
		close(dirfd);
	return rc;
}

int sbx_ctl_connect(const char *path, int timeout_ms, int *fd_out)
{
	return try_connect(path, timeout_ms > 0 ? timeout_ms : 3000, fd_out);
}

static long long mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int sbx_ctl_ping(const char *path, int timeout_ms)
{
	long long end = mono_ms() + timeout_ms;
	struct sbx_ctl_rbuf rb;
	struct sbx_ctl_frame f;
	uint8_t hdr[SBX_CTL_HEADER_SIZE];
	int fd, rc;

	rc = try_connect(path, timeout_ms, &fd);
	if (rc < 0)
		return rc;
	sbx_ctl_rbuf_init(&rb, SBX_CTL_SMALL_MAX);
	put_header(hdr, SBX_CTL_PING, 0);
	/* 8 bytes always fit a fresh socket's buffer. */
	if (write(fd, hdr, sizeof(hdr)) != (ssize_t)sizeof(hdr)) {
		rc = sbx_error_os("control socket %s", path);
		goto out;
	}
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		long long left = end - mono_ms();
		ssize_t n;

		rc = sbx_ctl_rbuf_next(&rb, &f);
		if (rc != 0) {
			/* A frame, or garbage: someone answered. */
			sbx_error_clear();
			rc = 0;
			break;
		}
		if (left <= 0 || poll(&p, 1, (int)left) == 0) {
			rc = sbx_error_set(SBX_ERR_STATE, -ETIMEDOUT,
					   "no answer on the control socket "
					   "%s within %d ms", path,
					   timeout_ms);
			break;
		}
		n = sbx_ctl_rbuf_fill(&rb, fd);
		if (n == 0 || (n < 0 && n != -EAGAIN && n != -EINTR)) {
			sbx_error_clear(); /* closed: it answered that way */
			rc = 0;
			break;
		}
	}
out:
	sbx_ctl_rbuf_fini(&rb);
	close(fd);
	return rc;
}

int sbx_ctl_listen(const char *path, int *fd_out)
{
	struct sockaddr_un sa;
	int fd = -1, dirfd = -1, probe = -1, rc;
	mode_t old;

	*fd_out = -1;
	rc = try_connect(path, 1000, &probe);
	if (rc == 0) {
		close(probe);
		return sbx_error_set(SBX_ERR_STATE, -EADDRINUSE,
				     "control socket %s is in use by a "
				     "running daemon", path);
	}
	sbx_error_clear();
	if (unlink(path) < 0 && errno != ENOENT)
		return sbx_error_os("remove stale control socket %s", path);
	rc = make_addr(&sa, path, &dirfd);
	if (rc < 0)
		return rc;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		rc = sbx_error_os("socket");
		goto out;
	}
	/* umask, not chmod afterwards: no window with a wider mode.  The
	 * daemon is multithreaded, but umask is only touched here. */
	old = umask(0177);
	rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (rc < 0) {
		rc = sbx_error_os("bind control socket %s", path);
		goto out;
	}
	if (chmod(path, 0600) < 0) {
		rc = sbx_error_os("chmod %s", path);
		goto out;
	}
	if (listen(fd, 128) < 0) {
		rc = sbx_error_os("listen on %s", path);
		goto out;
	}
	*fd_out = fd;
	fd = -1;
	rc = 0;
out:
	if (fd >= 0)
		close(fd);
	if (dirfd >= 0)
		close(dirfd);
	return rc;
}

/* ---- environment policy ------------------------------------------------- */

static const char *const default_env[] = {
	"TERM", "COLORTERM", "NO_COLOR", "FORCE_COLOR", "CLICOLOR",
	"CLICOLOR_FORCE", "LANG", "LANGUAGE", "TZ", "CI", NULL,
};

bool sbx_ctl_env_default_allowed(const char *name)
{
	size_t i;

	if (!strncmp(name, "LC_", 3))
		return true;
	for (i = 0; default_env[i]; i++)
		if (!strcmp(name, default_env[i]))
			return true;
	return false;
}

static bool name_in_list(const char *name, size_t nlen, const char *list)
{
	const char *p = list;

	while (p && *p) {
		size_t l = strcspn(p, ", :\t");

		if (l == nlen && !strncmp(p, name, nlen))
			return true;
		p += l;
		p += strspn(p, ", :\t");
	}
	return false;
}

struct strvec {
	char **v;
	size_t n, cap;
};

static void vec_push(struct strvec *sv, char *s)
{
	if (sv->n + 2 > sv->cap) {
		sv->cap = sv->cap ? sv->cap * 2 : 16;
		sv->v = sbx_xrealloc(sv->v, sv->cap * sizeof(char *));
	}
	sv->v[sv->n++] = s;
	sv->v[sv->n] = NULL;
}

/* Replace or add KEY=VALUE. */
static void vec_setenv(struct strvec *sv, const char *kv)
{
	size_t klen = strcspn(kv, "="), i;

	for (i = 0; i < sv->n; i++) {
		if (!strncmp(sv->v[i], kv, klen) && sv->v[i][klen] == '=') {
			free(sv->v[i]);
			sv->v[i] = sbx_xstrdup(kv);
			return;
		}
	}
	vec_push(sv, sbx_xstrdup(kv));
}

static char *filter_path(const char *path, const char *const *drop)
{
	char *out = sbx_xmalloc(strlen(path) + 1), *o = out;
	const char *p = path;

	*o = '\0';
	while (1) {
		size_t l = strcspn(p, ":");
		bool skip = false;
		size_t i;

		for (i = 0; drop && drop[i]; i++)
			if (strlen(drop[i]) == l && !strncmp(drop[i], p, l))
				skip = true;
		if (!skip) {
			if (o != out)
				*o++ = ':';
			memcpy(o, p, l);
			o += l;
			*o = '\0';
		}
		if (!p[l])
			break;
		p += l + 1;
	}
	return out;
}

void sbx_ctl_env_build(char ***out, char *const *environ_in,
		       const char *const *drop_path_dirs,
		       const char *const *extra)
{
	const char *list = NULL;
	struct strvec sv = { 0 };
	size_t i;

	for (i = 0; environ_in && environ_in[i]; i++)
		if (!strncmp(environ_in[i], "SBX_EXEC_ENV=", 13))
			list = environ_in[i] + 13;
	for (i = 0; environ_in && environ_in[i]; i++) {
		const char *kv = environ_in[i];
		size_t nlen = strcspn(kv, "=");
		char *name;

		if (!kv[nlen] || nlen == 0)
			continue;
		if (nlen == 4 && !strncmp(kv, "PATH", 4)) {
			char *f = filter_path(kv + 5, drop_path_dirs);

			vec_push(&sv, sbx_xasprintf("PATH=%s", f));
			free(f);
			continue;
		}
		name = sbx_xstrndup(kv, nlen);
		if (sbx_ctl_env_default_allowed(name) ||
		    name_in_list(name, nlen, list))
			vec_push(&sv, sbx_xstrdup(kv));
		free(name);
	}
	for (i = 0; extra && extra[i]; i++)
		vec_setenv(&sv, extra[i]);
	if (!sv.v)
		vec_push(&sv, NULL), sv.n = 0;
	*out = sv.v;
}

void sbx_ctl_env_free(char **env)
{
	size_t i;

	for (i = 0; env && env[i]; i++)
		free(env[i]);
	free(env);
}

/* ---- exit codes --------------------------------------------------------- */

int sbx_ctl_exit_code(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return SBX_CTL_EXIT_SBX;
}

int sbx_ctl_error_exit_code(int rc)
{
	const struct sbx_error *e = sbx_error_last();

	if (e->klass == SBX_ERR_REMOTE && e->detail == SBX_CTL_ERR_EXEC)
		return rc == -ENOENT ? SBX_CTL_EXIT_NOTFOUND
				     : SBX_CTL_EXIT_NOEXEC;
	return SBX_CTL_EXIT_SBX;
}

/* ---- the client --------------------------------------------------------- */

/* Signal plumbing: handlers write the signal number to a self-pipe. */
static int sig_pipe[2] = { -1, -1 };
static const int fwd_signals[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT,
				   SIGWINCH };
#define NFWD (sizeof(fwd_signals) / sizeof(fwd_signals[0]))

/* Terminal restore: also from atexit() as a last resort. */
static struct termios saved_tio;
static int saved_tio_fd = -1;

static void tty_restore(void)
{
	if (saved_tio_fd >= 0) {
		tcsetattr(saved_tio_fd, TCSAFLUSH, &saved_tio);
		saved_tio_fd = -1;
	}
}

static void on_signal(int sig)
{
	int e = errno;
	unsigned char c = (unsigned char)sig;

	if (sig_pipe[1] >= 0 && write(sig_pipe[1], &c, 1) < 0) {
		/* pipe full: the signal is coalesced with a pending one */
	}
	errno = e;
}

static int tty_raw(int fd)
{
	static bool atexit_done;
	struct termios tio;

	if (tcgetattr(fd, &saved_tio) < 0)
		return sbx_error_os("tcgetattr");
	tio = saved_tio;
	cfmakeraw(&tio);
	tio.c_cc[VMIN] = 1;
	tio.c_cc[VTIME] = 0;
	saved_tio_fd = fd;
	if (!atexit_done) {
		atexit(tty_restore);
		atexit_done = true;
	}
	if (tcsetattr(fd, TCSADRAIN, &tio) < 0) {
		saved_tio_fd = -1;
		return sbx_error_os("tcsetattr");
	}
	return 0;
}

/* Write everything to a (possibly non-blocking) local descriptor. */
static int write_all(int fd, const uint8_t *p, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				struct pollfd pf = { .fd = fd,
						     .events = POLLOUT };

				poll(&pf, 1, -1);
				continue;
			}
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void get_winsize(int fd, unsigned short *rows, unsigned short *cols)
{
	struct winsize ws;

	*rows = *cols = 0;
	if (fd >= 0 && ioctl(fd, TIOCGWINSZ, &ws) == 0) {
		*rows = ws.ws_row;
		*cols = ws.ws_col;
	}
}

static int daemon_down(int rc, const char *session, const char *path)
{
	const char *s = session ? session : "?";

	return sbx_error_set(SBX_ERR_STATE, rc,
			     "session %s's daemon is not running (%s: %s); "
			     "run `sbx mount %s`",
			     s, path, strerror(-rc), s);
}

struct client {
	const struct sbx_ctl_run_opts *o;
	int sock;
	struct sbx_ctl_rbuf rb;
	struct sbx_ctl_wbuf wb;
	bool stdin_open;
	bool out_broken;   /* local stdout gave EPIPE: discard */
	bool err_broken;
	bool started;
	bool fds_sent;     /* stdin is read only once STARTED says how */
	bool done;
	int status;
	int tty_fd;        /* the local terminal (for resize) or -1 */
};

static int client_frame(struct client *c, const struct sbx_ctl_frame *f)
{
	const struct sbx_ctl_run_opts *o = c->o;
	int rc;

	switch (f->type) {
	case SBX_CTL_STARTED:
		c->started = true;
		if (f->len >= 8 &&
		    (sbx_ctl_get_u32(f->data + 4) & SBX_CTL_STARTED_FDS)) {
			/* The command reads our stdin itself. */
			c->stdin_open = false;
		}
		return 0;
	case SBX_CTL_STDOUT:
	case SBX_CTL_STDERR: {
		bool is_out = f->type == SBX_CTL_STDOUT;
		bool *broken = is_out ? &c->out_broken : &c->err_broken;
		int fd = is_out ? o->out_fd : o->err_fd;

		if (*broken || fd < 0)
			return 0;
		rc = write_all(fd, f->data, f->len);
		if (rc == -EPIPE) {
			/* As if the command's own write failed: SIGPIPE. */
			uint8_t p[4];

			*broken = true;
			sbx_ctl_put_u32(p, SIGPIPE);
			sbx_ctl_wbuf_put(&c->wb, SBX_CTL_SIGNAL, p, 4);
			return 0;
		}
		if (rc < 0) {
			errno = -rc;
			return sbx_error_os("write %s", is_out ? "stdout"
							       : "stderr");
		}
		return 0;
	}
	case SBX_CTL_EXIT:
		if (f->len < 4)
			return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					     "control protocol: short EXIT");
		c->status = (int)sbx_ctl_get_u32(f->data);
		c->done = true;
		return 0;
	case SBX_CTL_ERROR: {
		int err, kind;

		if (f->len < 8)
			return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					     "control protocol: short ERROR");
		err = (int)sbx_ctl_get_u32(f->data);
		kind = (int)sbx_ctl_get_u32(f->data + 4);
		if (err <= 0 || err > 4095)
			err = EIO;
		return sbx_error_setd(SBX_ERR_REMOTE, -err, kind, "%.*s",
				      (int)(f->len - 8),
				      (const char *)f->data + 8);
	}
	default:
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "control protocol: unexpected frame "
				     "type %u from the daemon", f->type);
	}
}

static void client_signal(struct client *c, int sig)
{
	uint8_t p[4];

	if (sig == SIGWINCH) {
		unsigned short rows, cols;

		if (c->tty_fd < 0)
			return;
		get_winsize(c->tty_fd, &rows, &cols);
		put_u16(p, rows);
		put_u16(p + 2, cols);
		sbx_ctl_wbuf_put(&c->wb, SBX_CTL_RESIZE, p, 4);
		return;
	}
	sbx_ctl_put_u32(p, (uint32_t)sig);
	sbx_ctl_wbuf_put(&c->wb, SBX_CTL_SIGNAL, p, 4);
}

static int client_loop(struct client *c)
{
	const struct sbx_ctl_run_opts *o = c->o;
	int rc;

	while (!c->done) {
		struct pollfd p[3];
		int np = 0, isock, iin = -1, isig = -1;
		bool want_in;

		rc = sbx_ctl_wbuf_flush(&c->wb, c->sock);
		if (rc == -EPIPE || rc == -ECONNRESET) {
			/*
			 * The daemon stopped reading (the command is done with
			 * its input): drop what it will never want and keep
			 * reading, its EXIT frame is on the way or queued.
			 */
			sbx_error_clear();
			c->wb.start = c->wb.end = 0;
			c->stdin_open = false;
		} else if (rc < 0) {
			return sbx_error_prefix(rc, "session %s", o->session);
		}
		/* Read local stdin only when the socket has taken what we sent
		 * before: back-pressure instead of unbounded buffering, and
		 * the socket is always read, so no deadlock. */
		want_in = c->stdin_open && (c->started || !c->fds_sent) &&
			  sbx_ctl_wbuf_pending(&c->wb) < SBX_CTL_DATA_MAX;
		isock = np;
		p[np++] = (struct pollfd){
			.fd = c->sock,
			.events = POLLIN |
				  (sbx_ctl_wbuf_pending(&c->wb) ? POLLOUT : 0)
		};
		if (want_in) {
			iin = np;
			p[np++] = (struct pollfd){ .fd = o->in_fd,
						   .events = POLLIN };
		}
		if (sig_pipe[0] >= 0) {
			isig = np;
			p[np++] = (struct pollfd){ .fd = sig_pipe[0],
						   .events = POLLIN };
		}
		rc = poll(p, (nfds_t)np, -1);
		if (rc < 0) {
			if (errno == EINTR)
				continue;
			return sbx_error_os("poll");
		}
		if (isig >= 0 && p[isig].revents) {
			unsigned char sigs[64];
			ssize_t n = read(sig_pipe[0], sigs, sizeof(sigs));

			for (ssize_t i = 0; i < n; i++)
				client_signal(c, sigs[i]);
		}
		if (iin >= 0 && p[iin].revents) {
			ssize_t n = sbx_ctl_wbuf_put_from_fd(
				&c->wb, SBX_CTL_STDIN, o->in_fd,
				SBX_CTL_DATA_MAX);

			if (n == 0 || (n < 0 && n != -EAGAIN && n != -EINTR)) {
				/* EOF (or an unreadable stdin: same thing
				 * for the command). */
				c->stdin_open = false;
				sbx_ctl_wbuf_put(&c->wb, SBX_CTL_STDIN_EOF,
						 NULL, 0);
			}
		}
		if (p[isock].revents & (POLLIN | POLLHUP | POLLERR)) {
			struct sbx_ctl_frame f;
			ssize_t n = sbx_ctl_rbuf_fill(&c->rb, c->sock);

			if (n == 0 || (n < 0 && n != -EAGAIN)) {
				/* Drain complete frames first: EXIT may be
				 * followed directly by the close. */
				while ((rc = sbx_ctl_rbuf_next(&c->rb, &f)) > 0)
					if ((rc = client_frame(c, &f)) < 0 ||
					    c->done)
						return rc;
				if (n == 0 || n == -ECONNRESET) {
					return sbx_error_set(
						SBX_ERR_PROTO, -ECONNRESET,
						"session %s's daemon closed "
						"the connection before the "
						"command's exit status "
						"arrived (did the daemon "
						"stop?)", o->session);
				}
				return sbx_error_prefix((int)n, "session %s",
							o->session);
			}
			while ((rc = sbx_ctl_rbuf_next(&c->rb, &f)) > 0) {
				rc = client_frame(c, &f);
				if (rc < 0)
					return rc;
				if (c->done)
					return 0;
			}
			if (rc < 0)
				return rc;
		}
	}
	return 0;
}

/* Send the REQUEST frame with our three descriptors attached. */
static int send_with_fds(int sock, const uint8_t *payload, size_t plen,
			 const struct sbx_ctl_run_opts *o)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * 3)];
	} cm;
	uint8_t hdr[SBX_CTL_HEADER_SIZE];
	int fds[3] = { o->in_fd, o->out_fd, o->err_fd };
	size_t total = sizeof(hdr) + plen, off = 0;

	put_header(hdr, SBX_CTL_REQUEST, (uint32_t)plen);
	memset(&cm, 0, sizeof(cm));
	while (off < total) {
		struct iovec iov[2];
		struct msghdr mh = { 0 };
		int niov = 0;
		ssize_t n;

		if (off < sizeof(hdr)) {
			iov[niov].iov_base = hdr + off;
			iov[niov++].iov_len = sizeof(hdr) - off;
			iov[niov].iov_base = (void *)payload;
			iov[niov++].iov_len = plen;
		} else {
			iov[niov].iov_base = (void *)(payload + off -
						      sizeof(hdr));
			iov[niov++].iov_len = total - off;
		}
		mh.msg_iov = iov;
		mh.msg_iovlen = (size_t)niov;
		if (off == 0) {
			struct cmsghdr *c;

			mh.msg_control = cm.buf;
			mh.msg_controllen = sizeof(cm.buf);
			c = CMSG_FIRSTHDR(&mh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(fds));
			memcpy(CMSG_DATA(c), fds, sizeof(fds));
		}
		n = sendmsg(sock, &mh, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				struct pollfd p = { .fd = sock,
						    .events = POLLOUT };

				poll(&p, 1, 1000);
				continue;
			}
			return sbx_error_os("send to control socket");
		}
		off += (size_t)n;
	}
	return 0;
}

/*
 * This process's umask, without changing it: /proc/self/status has it
 * (Linux 4.7); else the umask(2) round trip, which briefly changes it for
 * every thread (the clients are single-threaded).
 */
static mode_t process_umask(void)
{
	char line[128];
	unsigned v;
	mode_t m;
	FILE *f = fopen("/proc/self/status", "re");

	if (f) {
		while (fgets(line, sizeof(line), f)) {
			if (sscanf(line, "Umask: %o", &v) == 1) {
				fclose(f);
				return (mode_t)(v & 0777);
			}
		}
		fclose(f);
	}
	m = umask(022);
	umask(m);
	return m & 0777;
}

int sbx_ctl_run(const struct sbx_ctl_run_opts *o, int *status_out)
{
	struct sigaction old[NFWD];
	bool handlers = false;
	struct sbx_ctl_request req = { 0 };
	struct client c = { .o = o, .sock = -1, .tty_fd = -1 };
	uint8_t *payload = NULL;
	size_t plen = 0, i;
	int rc;

	*status_out = 0;
	sbx_ctl_rbuf_init(&c.rb, SBX_CTL_DATA_MAX);
	sbx_ctl_wbuf_init(&c.wb);

	req.flags = o->tty ? SBX_CTL_REQ_TTY : 0;
	/* The command creates files as the caller would (docs/exec.md). */
	req.flags |= SBX_CTL_REQ_UMASK;
	req.umask = process_umask();
	req.cwd = (char *)(o->cwd ? o->cwd : "");
	req.argv = (char **)o->argv;
	req.envp = (char **)o->envp;
	if (o->tty) {
		c.tty_fd = isatty(o->in_fd) ? o->in_fd
			   : isatty(o->out_fd) ? o->out_fd : -1;
		get_winsize(c.tty_fd, &req.rows, &req.cols);
	}
	if (o->pass_fds && !o->tty && o->in_fd >= 0 && o->out_fd >= 0 &&
	    o->err_fd >= 0) {
		const char *fr = getenv("SBX_EXEC_FRAMED");

		if (!fr || !*fr)
			req.flags |= SBX_CTL_REQ_FDS;
	}
	rc = sbx_ctl_request_encode(&payload, &plen, &req);
	if (rc < 0)
		goto out;

	rc = sbx_ctl_connect(o->socket_path, o->connect_timeout_ms, &c.sock);
	if (rc == -ECONNREFUSED || rc == -ENOENT) {
		rc = daemon_down(rc, o->session, o->socket_path);
		goto out;
	}
	if (rc < 0)
		goto out;
	if (req.flags & SBX_CTL_REQ_FDS) {
		rc = send_with_fds(c.sock, payload, plen, o);
		if (rc < 0)
			goto out;
		c.fds_sent = true;
	} else {
		sbx_ctl_wbuf_put(&c.wb, SBX_CTL_REQUEST, payload, plen);
	}

	if (o->forward_signals) {
		if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
			rc = sbx_error_os("pipe");
			goto out;
		}
		for (i = 0; i < NFWD; i++) {
			struct sigaction sa = { .sa_handler = on_signal };

			sigemptyset(&sa.sa_mask);
			sa.sa_flags = SA_RESTART;
			sigaction(fwd_signals[i], &sa, &old[i]);
		}
		handlers = true;
	}
	/* stdin stays blocking (it may be shared with the parent shell): it is
	 * read only after poll() reported it readable. */
	if (o->in_fd >= 0)
		c.stdin_open = true;
	else
		sbx_ctl_wbuf_put(&c.wb, SBX_CTL_STDIN_EOF, NULL, 0);
	if (o->tty && c.tty_fd >= 0 && isatty(o->in_fd)) {
		rc = tty_raw(o->in_fd);
		if (rc < 0)
			goto out;
	}

	rc = client_loop(&c);
	if (rc == 0)
		*status_out = c.status;
out:
	tty_restore();
	if (handlers) {
		for (i = 0; i < NFWD; i++)
			sigaction(fwd_signals[i], &old[i], NULL);
		close(sig_pipe[0]);
		close(sig_pipe[1]);
		sig_pipe[0] = sig_pipe[1] = -1;
	}
	if (c.sock >= 0)
		close(c.sock);
	free(payload);
	sbx_ctl_rbuf_fini(&c.rb);
	sbx_ctl_wbuf_fini(&c.wb);
	return rc;
}
