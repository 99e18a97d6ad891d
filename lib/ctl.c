/*
 * Control protocol framing, the REQUEST codec and the socket calls; see
 * sbx/ctl.h.  The environment policy is in ctl_env.c, the exec client
 * (sbx_ctl_run) in ctl_client.c.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "sbx/clock.h"
#include "sbx/ctl.h"
#include "sbx/xmalloc.h"

#include "ctl_i.h"

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

	ctl_put_header(p, type, (uint32_t)len);
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
	ctl_put_header(p, type, (uint32_t)n);
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
	ctl_put_u16(p + 8, req->rows);
	ctl_put_u16(p + 10, req->cols);
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
	r->rows = ctl_get_u16(data + 8);
	r->cols = ctl_get_u16(data + 10);
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

/*
 * A control socket being set up: the socket, its address and the directory
 * descriptor make_addr() may have opened.  sock_open() fills it,
 * sock_finish() hands the socket out on success and closes the rest.
 */
struct ctl_sock {
	struct sockaddr_un sa;
	int fd;
	int dirfd;
};

static int sock_open(struct ctl_sock *s, const char *path)
{
	int rc;

	s->fd = -1;
	rc = make_addr(&s->sa, path, &s->dirfd);
	if (rc < 0)
		return rc;
	s->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (s->fd < 0)
		return sbx_error_os("socket");
	return 0;
}

static int sock_finish(struct ctl_sock *s, int rc, int *fd_out)
{
	if (rc == 0) {
		*fd_out = s->fd;
		s->fd = -1;
	}
	if (s->fd >= 0)
		close(s->fd);
	if (s->dirfd >= 0)
		close(s->dirfd);
	return rc;
}

static int sock_connect(struct ctl_sock *s, const char *path, int timeout_ms)
{
	struct pollfd p = { .fd = s->fd, .events = POLLOUT };
	int err = 0, rc;
	socklen_t el = sizeof(err);

	if (connect(s->fd, (struct sockaddr *)&s->sa, sizeof(s->sa)) == 0)
		return 0;
	if (errno != EAGAIN && errno != EINPROGRESS)
		return sbx_error_os("connect %s", path);
	/* Backlog full: wait for the daemon to accept. */
	rc = poll(&p, 1, timeout_ms);
	if (rc == 0)
		return sbx_error_set(SBX_ERR_OS, -ETIMEDOUT,
				     "connect %s: timed out", path);
	getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &el);
	if (err) {
		errno = err;
		return sbx_error_os("connect %s", path);
	}
	return 0;
}

static int try_connect(const char *path, int timeout_ms, int *fd_out)
{
	struct ctl_sock s;
	int rc;

	*fd_out = -1;
	rc = sock_open(&s, path);
	if (rc == 0)
		rc = sock_connect(&s, path, timeout_ms);
	return sock_finish(&s, rc, fd_out);
}

int sbx_ctl_connect(const char *path, int timeout_ms, int *fd_out)
{
	return try_connect(path, timeout_ms > 0 ? timeout_ms : 3000, fd_out);
}

int sbx_ctl_ping(const char *path, int timeout_ms)
{
	long long end = sbx_clock_mono_ms() + timeout_ms;
	struct sbx_ctl_rbuf rb;
	struct sbx_ctl_frame f;
	uint8_t hdr[SBX_CTL_HEADER_SIZE];
	int fd, rc;

	rc = try_connect(path, timeout_ms, &fd);
	if (rc < 0)
		return rc;
	sbx_ctl_rbuf_init(&rb, SBX_CTL_SMALL_MAX);
	ctl_put_header(hdr, SBX_CTL_PING, 0);
	/* 8 bytes always fit a fresh socket's buffer. */
	if (write(fd, hdr, sizeof(hdr)) != (ssize_t)sizeof(hdr)) {
		rc = sbx_error_os("control socket %s", path);
		goto out;
	}
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		long long left = end - sbx_clock_mono_ms();
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

/* bind + chmod + listen on the opened socket. */
static int sock_listen(struct ctl_sock *s, const char *path)
{
	mode_t old;
	int rc;

	/* umask, not chmod afterwards: no window with a wider mode.  The
	 * daemon is multithreaded, but umask is only touched here. */
	old = umask(0177);
	rc = bind(s->fd, (struct sockaddr *)&s->sa, sizeof(s->sa));
	umask(old);
	if (rc < 0)
		return sbx_error_os("bind control socket %s", path);
	if (chmod(path, 0600) < 0)
		return sbx_error_os("chmod %s", path);
	if (listen(s->fd, 128) < 0)
		return sbx_error_os("listen on %s", path);
	return 0;
}

int sbx_ctl_listen(const char *path, int *fd_out)
{
	struct ctl_sock s;
	int probe = -1, rc;

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
	rc = sock_open(&s, path);
	if (rc == 0)
		rc = sock_listen(&s, path);
	return sock_finish(&s, rc, fd_out);
}
