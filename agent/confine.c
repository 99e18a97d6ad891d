/*
 * Path confinement: every client path is resolved beneath the root.
 *
 * The kernel does it when it can: openat2() with RESOLVE_BENEATH refuses
 * ".." above the starting directory and absolute symlinks, and any symlink
 * whose target leaves the root, with EXDEV; RESOLVE_NO_MAGICLINKS refuses
 * /proc/<pid>/fd-style links.  Where openat2 is missing (kernels before
 * 5.6, some sandboxes such as older gVisor) a userspace resolver walks the
 * path one component at a time with O_PATH | O_NOFOLLOW, expanding
 * symlinks itself under the same rules.  It is race-free in the same way:
 * every step is relative to a directory fd already known to be inside.
 *
 * Operations that act on the last component itself (lstat, unlink,
 * rename, readlink, ...) resolve the parent and use the *at() calls with
 * the bare name, which never follow a symlink in that position.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sbx/log.h"
#include "sbx/xmalloc.h"

#include "agent_i.h"

#define MAX_LINKS 40

static int sys_openat2(int dirfd, const char *path, int flags, mode_t mode)
{
	struct open_how how = {
		.flags = (unsigned long long)(flags | O_CLOEXEC),
		.mode = (flags & (O_CREAT | O_TMPFILE)) ? mode : 0,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
	};
	int fd;

	/* EAGAIN: a concurrent rename or mount made the kernel unsure the
	 * walk stayed inside; trying again is what the man page says. */
	for (int tries = 0; tries < 16; tries++) {
		fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
		if (fd >= 0 || errno != EAGAIN)
			break;
	}
	return fd;
}

void agent_confine_init(struct agent *a)
{
	const char *env = getenv("SBX_AGENT_NO_OPENAT2");
	int fd;

	a->use_openat2 = false;
	if (env && *env && strcmp(env, "0") != 0) {
		sbx_info("openat2 disabled by SBX_AGENT_NO_OPENAT2");
		return;
	}
	fd = sys_openat2(a->root_fd, ".", O_PATH | O_DIRECTORY, 0);
	if (fd >= 0) {
		close(fd);
		a->use_openat2 = true;
		return;
	}
	sbx_info("openat2 unavailable (%s): resolving paths in userspace",
		 strerror(errno));
}

static int escape(const char *path)
{
	return sbx_error_set(SBX_ERR_OS, -EXDEV,
			     "%s: resolves outside the sandbox root", path);
}

/*
 * The userspace resolver.  `stack` holds the directory fds from the root
 * down; ".." pops (refused at the root), a symlink's target replaces the
 * component (absolute targets refused).  Returns an fd opened with `flags`.
 */
static int resolve_user(struct agent *a, const char *path, int flags,
			mode_t mode)
{
	int stack[PATH_MAX / 2];
	size_t depth = 0;
	char *rest = sbx_xstrdup(path);
	int links = 0, fd = -1, rc;

	stack[depth++] = dup(a->root_fd);
	if (stack[0] < 0) {
		free(rest);
		return -1;
	}
	for (;;) {
		char *p = rest, *comp, *next;
		bool last;

		while (*p == '/')
			p++;
		if (!*p) {
			/* The path named a directory on the stack itself. */
			fd = openat(stack[depth - 1], ".", flags | O_CLOEXEC,
				    mode);
			break;
		}
		comp = p;
		next = strchr(p, '/');
		if (next)
			*next++ = '\0';
		while (next && *next == '/')
			next++;
		last = !next || !*next;

		if (!strcmp(comp, ".")) {
			memmove(rest, next ? next : "", strlen(next ? next : "") + 1);
			continue;
		}
		if (!strcmp(comp, "..")) {
			if (depth == 1) {
				errno = EXDEV;
				goto fail;
			}
			close(stack[--depth]);
			memmove(rest, next ? next : "", strlen(next ? next : "") + 1);
			continue;
		}
		if (last) {
			int e;

			fd = openat(stack[depth - 1], comp,
				    flags | O_NOFOLLOW | O_CLOEXEC, mode);
			if (fd >= 0 && (flags & O_PATH) &&
			    !(flags & O_NOFOLLOW)) {
				struct stat lst;

				/* O_PATH|O_NOFOLLOW opens a symlink itself. */
				if (fstat(fd, &lst) == 0 &&
				    S_ISLNK(lst.st_mode)) {
					close(fd);
					fd = -1;
					errno = ELOOP;
				}
			}
			if (fd >= 0 || (flags & O_NOFOLLOW) ||
			    (errno != ELOOP && errno != ENOTDIR))
				break;
			/* Maybe a symlink in the last position: expand it.
			 * (O_DIRECTORY on a symlink says ENOTDIR.) */
			e = errno;
			{
				struct stat lst;

				if (fstatat(stack[depth - 1], comp, &lst,
					    AT_SYMLINK_NOFOLLOW) < 0 ||
				    !S_ISLNK(lst.st_mode)) {
					errno = e;
					break;
				}
			}
		}
		{
			struct stat st;
			int cfd = openat(stack[depth - 1], comp,
					 O_PATH | O_NOFOLLOW | O_CLOEXEC);
			char target[PATH_MAX];
			ssize_t tl;
			char *nr;

			if (cfd < 0)
				goto fail;
			if (fstat(cfd, &st) < 0) {
				close(cfd);
				goto fail;
			}
			if (!S_ISLNK(st.st_mode)) {
				if (!S_ISDIR(st.st_mode)) {
					close(cfd);
					errno = ENOTDIR;
					goto fail;
				}
				if (depth >= sizeof(stack) / sizeof(stack[0])) {
					close(cfd);
					errno = ENAMETOOLONG;
					goto fail;
				}
				stack[depth++] = cfd;
				memmove(rest, next ? next : "",
					strlen(next ? next : "") + 1);
				continue;
			}
			tl = readlinkat(cfd, "", target, sizeof(target) - 1);
			close(cfd);
			if (tl < 0)
				goto fail;
			target[tl] = '\0';
			if (++links > MAX_LINKS) {
				errno = ELOOP;
				goto fail;
			}
			if (target[0] == '/' || tl == 0) {
				errno = EXDEV;
				goto fail;
			}
			nr = sbx_xasprintf("%s/%s", target, next ? next : "");
			free(rest);
			rest = nr;
		}
	}
	rc = errno;
	for (size_t i = 0; i < depth; i++)
		close(stack[i]);
	free(rest);
	errno = rc;
	return fd;
fail:
	rc = errno;
	for (size_t i = 0; i < depth; i++)
		close(stack[i]);
	free(rest);
	errno = rc;
	return -1;
}

int agent_open(struct agent *a, const char *path, int flags, mode_t mode,
	       int *fd_out)
{
	int fd;

	*fd_out = -1;
	if (a->use_openat2)
		fd = sys_openat2(a->root_fd, *path ? path : ".", flags, mode);
	else
		fd = resolve_user(a, path, flags, mode);
	if (fd < 0) {
		if (errno == EXDEV)
			return escape(path);
		return sbx_error_os("%s", *path ? path : "/");
	}
	*fd_out = fd;
	return 0;
}

int agent_parent(struct agent *a, const char *path, int *dirfd_out,
		 const char **name_out, char **buf_out)
{
	char *buf, *slash, *name;
	int rc;

	*dirfd_out = -1;
	*name_out = NULL;
	*buf_out = NULL;
	buf = sbx_xstrdup(path);
	slash = strrchr(buf, '/');
	name = slash ? slash + 1 : buf;
	if (!*path || !strcmp(name, "..")) {
		/* The root, or a path ending in "..": a directory that
		 * must itself be resolved beneath the root. */
		rc = agent_open(a, path, O_PATH | O_DIRECTORY, 0, dirfd_out);
		if (rc < 0) {
			free(buf);
			return rc;
		}
		buf[0] = '\0';
		*name_out = buf;
		*buf_out = buf;
		return 0;
	}
	if (slash) {
		*slash = '\0';
		rc = agent_open(a, buf, O_PATH | O_DIRECTORY, 0, dirfd_out);
	} else {
		rc = agent_open(a, "", O_PATH | O_DIRECTORY, 0, dirfd_out);
	}
	if (rc < 0) {
		free(buf);
		return rc;
	}
	*name_out = name;
	*buf_out = buf;
	return 0;
}
