/* $SBX_HOME layout, session names, atomic files; see sbx/paths.h. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sbx/buf.h"
#include "sbx/paths.h"
#include "sbx/xmalloc.h"

#define NAME_MAX_LEN 64

int sbx_name_validate(const char *name)
{
	size_t n;

	if (!name || !*name)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "empty session name: use 1-%d characters "
				     "of A-Z a-z 0-9 . _ -", NAME_MAX_LEN);
	n = strlen(name);
	if (n > NAME_MAX_LEN)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "session name too long (%zu characters, "
				     "at most %d)", n, NAME_MAX_LEN);
	if (name[0] == '.' || name[0] == '-')
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "bad session name '%s': must not start "
				     "with '.' or '-'", name);
	for (size_t i = 0; i < n; i++) {
		char c = name[i];

		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		    (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')
			continue;
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "bad session name '%.80s': only A-Z a-z "
				     "0-9 . _ - are allowed", name);
	}
	return 0;
}

int sbx_paths_user_home(char **out)
{
	const char *h = getenv("HOME");
	struct passwd pw, *res = NULL;
	char buf[4096];

	*out = NULL;
	if (h && h[0] == '/') {
		*out = sbx_xstrdup(h);
		return 0;
	}
	if (getpwuid_r(getuid(), &pw, buf, sizeof(buf), &res) != 0 || !res ||
	    !res->pw_dir || res->pw_dir[0] != '/')
		return sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
				     "cannot find the home directory: set "
				     "HOME or SBX_HOME");
	*out = sbx_xstrdup(res->pw_dir);
	return 0;
}

int sbx_path_absolute(const char *path, char **out)
{
	struct sbx_buf b;
	char *cwd = NULL, *joined = NULL, *p, *seg, *next;
	size_t len;
	int rc;

	*out = NULL;
	if (!path || !*path)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL, "empty path");
	if (path[0] != '/') {
		cwd = getcwd(NULL, 0);
		if (!cwd)
			return sbx_error_os("getcwd");
		joined = sbx_xasprintf("%s/%s", cwd, path);
	} else {
		joined = sbx_xstrdup(path);
	}

	/* Lexical normalisation: drop "." and empty segments, fold "..". */
	sbx_buf_init(&b, PATH_MAX * 4);
	for (p = joined; p; p = next) {
		while (*p == '/')
			p++;
		next = strchr(p, '/');
		if (next)
			*next++ = '\0';
		seg = p;
		if (!*seg || strcmp(seg, ".") == 0)
			continue;
		if (strcmp(seg, "..") == 0) {
			char *slash;

			len = sbx_buf_len(&b);
			slash = len ? strrchr(b.data, '/') : NULL;
			if (slash) {
				b.len = (size_t)(slash - b.data);
				b.data[b.len] = '\0';
			}
			continue;
		}
		rc = sbx_buf_addf(&b, "/%s", seg);
		if (rc < 0) {
			rc = sbx_error_set(SBX_ERR_CONFIG, -ENAMETOOLONG,
					   "path too long: %.100s...", path);
			goto out;
		}
	}
	if (sbx_buf_len(&b) == 0)
		*out = sbx_xstrdup("/");
	else
		*out = sbx_buf_take(&b, NULL);
	rc = 0;
out:
	sbx_buf_fini(&b);
	free(joined);
	free(cwd);
	return rc;
}

int sbx_path_expand_user(char **out, const char *path)
{
	char *home = NULL, *tmp = NULL;
	int rc;

	*out = NULL;
	if (!path || !*path)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL, "empty path");
	if (path[0] != '~')
		return sbx_path_absolute(path, out);
	if (path[1] != '\0' && path[1] != '/')
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "path %s: ~user is not supported, write "
				     "the full path", path);
	rc = sbx_paths_user_home(&home);
	if (rc < 0)
		return rc;
	tmp = sbx_xasprintf("%s%s", home, path + 1);
	rc = sbx_path_absolute(tmp, out);
	free(tmp);
	free(home);
	return rc;
}

int sbx_paths_mkdir_p(const char *path, mode_t mode)
{
	char *abs = NULL;
	struct stat st;
	int rc;

	rc = sbx_path_absolute(path, &abs);
	if (rc < 0)
		return rc;
	/* Walk down from the root creating each missing component. */
	for (char *p = abs + 1;; p++) {
		char saved = *p;

		if (saved != '/' && saved != '\0')
			continue;
		*p = '\0';
		if (mkdir(abs, mode) < 0 && errno != EEXIST) {
			rc = sbx_error_os("create directory %s", abs);
			goto out;
		}
		*p = saved;
		if (!saved)
			break;
	}
	if (stat(abs, &st) < 0) {
		rc = sbx_error_os("stat %s", abs);
		goto out;
	}
	if (!S_ISDIR(st.st_mode)) {
		rc = sbx_error_set(SBX_ERR_OS, -ENOTDIR,
				   "%s exists and is not a directory", abs);
		goto out;
	}
	rc = 0;
out:
	free(abs);
	return rc;
}

int sbx_paths_home(char **out)
{
	const char *env = getenv("SBX_HOME");
	const char *xdg = getenv("XDG_STATE_HOME");
	char *home = NULL, *dir = NULL;
	int rc;

	*out = NULL;
	if (env && *env) {
		rc = sbx_path_expand_user(&dir, env);
	} else if (xdg && xdg[0] == '/') {
		/* XDG: a relative value is invalid and must be ignored. */
		rc = sbx_path_absolute(xdg, &home);
		if (rc == 0)
			dir = sbx_xasprintf("%s/sbx", home);
	} else {
		rc = sbx_paths_user_home(&home);
		if (rc == 0)
			dir = sbx_xasprintf("%s/.local/state/sbx", home);
	}
	if (rc < 0)
		goto out;
	rc = sbx_paths_mkdir_p(dir, 0700);
	if (rc < 0) {
		rc = sbx_error_prefix(rc, "state directory (SBX_HOME)");
		goto out;
	}
	*out = dir;
	dir = NULL;
out:
	free(dir);
	free(home);
	return rc;
}

int sbx_paths_subdir(char **out, const char *sub)
{
	char *home = NULL, *dir = NULL;
	int rc;

	*out = NULL;
	rc = sbx_paths_home(&home);
	if (rc < 0)
		return rc;
	dir = sbx_xasprintf("%s/%s", home, sub);
	free(home);
	rc = sbx_paths_mkdir_p(dir, 0700);
	if (rc < 0) {
		free(dir);
		return rc;
	}
	*out = dir;
	return 0;
}

int sbx_paths_session_file(char **out, const char *sub, const char *name,
			   const char *suffix)
{
	char *dir = NULL;
	int rc;

	*out = NULL;
	/* Names become file names: never let one escape the directory. */
	rc = sbx_name_validate(name);
	if (rc < 0)
		return rc;
	rc = sbx_paths_subdir(&dir, sub);
	if (rc < 0)
		return rc;
	*out = sbx_xasprintf("%s/%s%s", dir, name, suffix ? suffix : "");
	free(dir);
	return 0;
}

int sbx_paths_user_config(char **out)
{
	const char *xdg = getenv("XDG_CONFIG_HOME");
	char *home = NULL;
	int rc;

	*out = NULL;
	if (xdg && xdg[0] == '/') {
		*out = sbx_xasprintf("%s/sbx/config.json", xdg);
		return 0;
	}
	rc = sbx_paths_user_home(&home);
	if (rc < 0)
		return rc;
	*out = sbx_xasprintf("%s/.config/sbx/config.json", home);
	free(home);
	return 0;
}

int sbx_paths_git_toplevel(char **out, const char *start)
{
	char *dir = NULL, *probe = NULL;
	struct stat st;
	int rc;

	*out = NULL;
	rc = sbx_path_absolute(start ? start : ".", &dir);
	if (rc < 0)
		return rc;
	if (stat(dir, &st) < 0) {
		int err = errno;

		/* Bad input, not a system failure: a configuration error. */
		rc = sbx_error_setd(SBX_ERR_CONFIG, -err, err,
				    "repository %s: %s; pass --repo with a git "
				    "checkout", dir, strerror(err));
		goto out;
	}
	if (!S_ISDIR(st.st_mode)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -ENOTDIR,
				   "repository %s is not a directory", dir);
		goto out;
	}
	for (;;) {
		char *slash;

		free(probe);
		probe = sbx_xasprintf("%s/.git", strcmp(dir, "/") ? dir : "");
		if (lstat(probe, &st) == 0) {
			*out = dir;
			dir = NULL;
			rc = 0;
			goto out;
		}
		if (strcmp(dir, "/") == 0)
			break;
		slash = strrchr(dir, '/');
		if (slash == dir)
			slash[1] = '\0';
		else
			*slash = '\0';
	}
	free(dir);
	rc = sbx_path_absolute(start ? start : ".", &dir);
	if (rc == 0)
		rc = sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
				   "%s is not inside a git repository: pass "
				   "--repo DIR or run sbx from a git checkout",
				   dir);
out:
	free(probe);
	free(dir);
	return rc;
}

static int write_all(int fd, const void *data, size_t len)
{
	const char *p = data;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int sbx_file_write_atomic(const char *path, const void *data, size_t len,
			  mode_t mode)
{
	char *tmp = NULL, *dir = NULL, *slash;
	int fd = -1, dfd = -1, rc;

	tmp = sbx_xasprintf("%s.tmp.XXXXXX", path);
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		rc = sbx_error_os("create temporary file for %s", path);
		free(tmp);
		return rc;
	}
	/* mkstemp creates 0600; set the requested mode before any data. */
	if (fchmod(fd, mode) < 0) {
		rc = sbx_error_os("chmod %s", tmp);
		goto fail;
	}
	rc = write_all(fd, data, len);
	if (rc < 0) {
		errno = -rc;
		rc = sbx_error_os("write %s", tmp);
		goto fail;
	}
	if (fsync(fd) < 0) {
		rc = sbx_error_os("fsync %s", tmp);
		goto fail;
	}
	if (close(fd) < 0) {
		fd = -1;
		rc = sbx_error_os("close %s", tmp);
		goto fail;
	}
	fd = -1;
	if (rename(tmp, path) < 0) {
		rc = sbx_error_os("rename %s to %s", tmp, path);
		goto fail;
	}
	/* Make the rename itself durable. */
	dir = sbx_xstrdup(path);
	slash = strrchr(dir, '/');
	if (slash == dir)
		slash[1] = '\0';
	else if (slash)
		*slash = '\0';
	else
		dir[0] = '.', dir[1] = '\0'; /* strdup gave >= 2 bytes */
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		/* Failure here cannot undo the rename; the data is in place. */
		(void)fsync(dfd);
		close(dfd);
	}
	free(dir);
	free(tmp);
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	free(tmp);
	return rc;
}

int sbx_file_read(const char *path, size_t cap, char **out, size_t *len_out)
{
	struct sbx_buf b;
	char chunk[8192];
	int fd, rc = 0;

	*out = NULL;
	if (len_out)
		*len_out = 0;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return sbx_error_os("open %s", path);
	sbx_buf_init(&b, cap);
	for (;;) {
		ssize_t n = read(fd, chunk, sizeof(chunk));

		if (n < 0) {
			if (errno == EINTR)
				continue;
			rc = sbx_error_os("read %s", path);
			break;
		}
		if (n == 0)
			break;
		rc = sbx_buf_add(&b, chunk, (size_t)n);
		if (rc < 0) {
			rc = sbx_error_set(SBX_ERR_OS, -EFBIG,
					   "%s is larger than %zu bytes", path,
					   cap);
			break;
		}
	}
	close(fd);
	if (rc == 0)
		*out = sbx_buf_take(&b, len_out);
	sbx_buf_fini(&b);
	return rc;
}
