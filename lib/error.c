/* Thread-local typed errors; see sbx/error.h. */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "sbx/error.h"

static __thread struct sbx_error last;

static void vset(int klass, int code, long detail, const char *fmt,
		 va_list ap) __attribute__((format(printf, 4, 0)));

static void vset(int klass, int code, long detail, const char *fmt,
		 va_list ap)
{
	last.klass = klass;
	last.code = code;
	last.detail = detail;
	vsnprintf(last.msg, sizeof(last.msg), fmt, ap);
}

int sbx_error_set(int klass, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vset(klass, code, 0, fmt, ap);
	va_end(ap);
	return code;
}

int sbx_error_setd(int klass, int code, long detail, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vset(klass, code, detail, fmt, ap);
	va_end(ap);
	return code;
}

int sbx_error_restore(const struct sbx_error *e)
{
	if (e != &last)
		last = *e;
	return e->code;
}

int sbx_error_os(const char *fmt, ...)
{
	int err = errno ? errno : EIO;
	char what[384];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return sbx_error_setd(SBX_ERR_OS, -err, err, "%s: %s", what,
			      strerror(err));
}

int sbx_error_prefix(int rc, const char *fmt, ...)
{
	char ctx[256], old[sizeof(last.msg)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(ctx, sizeof(ctx), fmt, ap);
	va_end(ap);
	if (last.klass == SBX_ERR_NONE) {
		last.klass = SBX_ERR_OS;
		last.code = rc < 0 ? rc : -EIO;
		snprintf(last.msg, sizeof(last.msg), "%s: %s", ctx,
			 strerror(-last.code));
	} else {
		memcpy(old, last.msg, sizeof(old));
		/* A long chain of context may be cut; the start matters most. */
		if (snprintf(last.msg, sizeof(last.msg), "%s: %s", ctx, old) >=
		    (int)sizeof(last.msg))
			last.msg[sizeof(last.msg) - 1] = '\0';
	}
	return rc < 0 ? rc : last.code;
}

const struct sbx_error *sbx_error_last(void)
{
	return &last;
}

void sbx_error_clear(void)
{
	memset(&last, 0, sizeof(last));
}

/* Symbolic names travel on the wire because numbers differ by arch. */
#define E(x) { x, #x }
static const struct {
	int err;
	const char *name;
} names[] = {
	E(EPERM), E(ENOENT), E(ESRCH), E(EINTR), E(EIO), E(ENXIO), E(E2BIG),
	E(ENOEXEC), E(EBADF), E(ECHILD), E(EAGAIN), E(ENOMEM), E(EACCES),
	E(EFAULT), E(EBUSY), E(EEXIST), E(EXDEV), E(ENODEV), E(ENOTDIR),
	E(EISDIR), E(EINVAL), E(ENFILE), E(EMFILE), E(ENOTTY), E(ETXTBSY),
	E(EFBIG), E(ENOSPC), E(ESPIPE), E(EROFS), E(EMLINK), E(EPIPE),
	E(EDOM), E(ERANGE), E(EDEADLK), E(ENAMETOOLONG), E(ENOLCK),
	E(ENOSYS), E(ENOTEMPTY), E(ELOOP), E(ENODATA), E(ETIME),
	E(EOVERFLOW), E(EILSEQ), E(ENOTSOCK), E(EMSGSIZE), E(EPROTO),
	E(EOPNOTSUPP), E(EADDRINUSE), E(EADDRNOTAVAIL), E(ENETDOWN),
	E(ENETUNREACH), E(ECONNABORTED), E(ECONNRESET), E(ENOBUFS),
	E(EISCONN), E(ENOTCONN), E(ETIMEDOUT), E(ECONNREFUSED),
	E(EHOSTUNREACH), E(EALREADY), E(EINPROGRESS), E(ESTALE), E(EDQUOT),
	E(ECANCELED), E(EBADMSG), E(ENOTSUP), E(EUCLEAN),
};
#undef E

const char *sbx_errno_name(int err)
{
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (names[i].err == err)
			return names[i].name;
	return NULL;
}

int sbx_errno_from_name(const char *name)
{
	if (!name)
		return 0;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(names[i].name, name) == 0)
			return names[i].err;
	return 0;
}
