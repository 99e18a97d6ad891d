/* Helpers shared by the subcommands: locked loads, providers, mountpoints. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/state.h"
#include "sbx/status.h"
#include "sbx/xmalloc.h"
#include "cli_i.h"

int cli_session_lock_load(struct sbx_session *s, int *lock_out,
			  const char *name)
{
	int fd = -1, rc;

	*lock_out = -1;
	sbx_session_init(s);
	/* Do not leave a lock file behind for a name that was never used. */
	if (sbx_name_validate(name) == 0 && !sbx_state_exists(name))
		return sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT,
				     "no session %s (see `sbx ls`)", name);
	rc = sbx_state_lock(&fd, name, true, CLI_LOCK_TIMEOUT_MS);
	if (rc < 0)
		return rc;
	rc = sbx_state_load(s, name);
	if (rc < 0) {
		sbx_state_unlock(fd);
		return rc;
	}
	*lock_out = fd;
	return 0;
}

int cli_session_provider(struct sbx_provider **out,
			 const struct sbx_session *s)
{
	int rc = sbx_provider_new(out, s->provider, s->provider_config);

	if (rc < 0)
		return sbx_error_prefix(rc, "session %s", s->session);
	return 0;
}

/* Run argv (PATH lookup), stdout/stderr inherited; returns exit status. */
static int run(char *const argv[])
{
	pid_t pid;
	int st;

	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0)
		return sbx_error_os("fork");
	if (pid == 0) {
		execvp(argv[0], argv);
		_exit(127);
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return sbx_error_os("wait for %s", argv[0]);
	if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
		return sbx_error_set(SBX_ERR_OS, -ENOENT,
				     "cannot run %s: install fuse3", argv[0]);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int cli_unmount(const char *mp, bool lazy)
{
	char *argv[6];
	int n = 0, rc;

	if (geteuid() == 0) {
		if (umount2(mp, lazy ? MNT_DETACH : 0) == 0)
			return 0;
		if (errno == EINVAL) /* not mounted any more */
			return 0;
		if (errno == EBUSY)
			goto busy;
		return sbx_error_os("unmount %s", mp);
	}
	/* Unprivileged: only the setuid helper may unmount. */
	argv[n++] = "fusermount3";
	argv[n++] = "-u";
	if (lazy)
		argv[n++] = "-z";
	argv[n++] = (char *)mp;
	argv[n] = NULL;
	rc = run(argv);
	if (rc <= 0)
		return rc;
	/* fusermount3 printed why; busy is the usual cause. */
busy:
	return sbx_error_set(SBX_ERR_STATE, -EBUSY,
			     "cannot unmount %s: it is in use; close the "
			     "programs whose files or working directory are "
			     "inside it (see `fuser -vm %s`), or pass --force "
			     "for a lazy unmount", mp, mp);
}

/* Absolute path of `p` with the parent's symlinks resolved. */
static int resolve(char **out, const char *p)
{
	char *abs = NULL, *parent = NULL, *real = NULL, *base;
	struct stat st;
	int rc;

	*out = NULL;
	rc = sbx_path_expand_user(&abs, p);
	if (rc < 0)
		return rc;
	if (strcmp(abs, "/") == 0) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "cannot mount on /");
		goto out;
	}
	/*
	 * A symlink as the mountpoint itself is followed (mount(2) does);
	 * otherwise do not stat it: a stale FUSE mount fails with ENOTCONN.
	 */
	if (lstat(abs, &st) == 0 && S_ISLNK(st.st_mode)) {
		real = realpath(abs, NULL);
		if (!real) {
			rc = sbx_error_os("mountpoint %s", abs);
			goto out;
		}
		*out = real;
		real = NULL;
		goto out;
	}
	base = strrchr(abs, '/');
	parent = sbx_xstrndup(abs, (size_t)(base - abs));
	rc = sbx_paths_mkdir_p(*parent ? parent : "/", 0755);
	if (rc < 0)
		goto out;
	real = realpath(*parent ? parent : "/", NULL);
	if (!real) {
		rc = sbx_error_os("mountpoint parent %s", parent);
		goto out;
	}
	*out = sbx_xasprintf("%s%s", strcmp(real, "/") ? real : "", base);
out:
	free(real);
	free(parent);
	free(abs);
	return rc;
}

static int is_empty_dir(const char *path)
{
	struct dirent *de;
	DIR *d = opendir(path);
	int n = 0;

	if (!d)
		return sbx_error_os("open mountpoint %s", path);
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			n++;
	closedir(d);
	return n == 0;
}

int cli_mountpoint_prepare(char **abs_out, bool *created_out,
			   const char *mountpoint, const char *name)
{
	struct sbx_mount_entry me;
	char *mp = NULL;
	struct stat st;
	int rc;

	*abs_out = NULL;
	*created_out = false;
	rc = resolve(&mp, mountpoint);
	if (rc < 0)
		return rc;

	rc = sbx_mountinfo_find(&me, NULL, mp);
	if (rc == 0) {
		bool ours = strcmp(me.fstype, "fuse.sbx") == 0 &&
			    strncmp(me.source, "sbx:", 4) == 0 &&
			    strcmp(me.source + 4, name) == 0;
		bool stale = stat(mp, &st) < 0 && errno == ENOTCONN;

		sbx_mount_entry_fini(&me);
		if (!ours || !stale) {
			rc = sbx_error_set(SBX_ERR_STATE, -EBUSY,
					   "%s is already a mount point (in "
					   "use); unmount it or choose another "
					   "directory with --mount", mp);
			goto out;
		}
		/* Our own dead daemon left it behind: detach, then reuse. */
		rc = cli_unmount(mp, true);
		if (rc < 0)
			goto out;
	} else if (rc != -ENOENT) {
		goto out;
	}
	sbx_error_clear();

	if (lstat(mp, &st) < 0) {
		if (errno == ENOTCONN) {
			rc = sbx_error_set(SBX_ERR_STATE, -EBUSY,
					   "%s is a dead FUSE mount of another "
					   "program; run `fusermount3 -u -z "
					   "%s`", mp, mp);
			goto out;
		}
		if (errno != ENOENT) {
			rc = sbx_error_os("mountpoint %s", mp);
			goto out;
		}
		if (mkdir(mp, 0755) < 0) {
			rc = sbx_error_os("create mountpoint %s", mp);
			goto out;
		}
		*created_out = true;
	} else if (!S_ISDIR(st.st_mode)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -ENOTDIR,
				   "mountpoint %s exists and is not a "
				   "directory; choose another with --mount",
				   mp);
		goto out;
	} else {
		rc = is_empty_dir(mp);
		if (rc < 0)
			goto out;
		if (rc == 0) {
			rc = sbx_error_set(SBX_ERR_STATE, -ENOTEMPTY,
					   "mountpoint %s is not empty; "
					   "mounting there would hide its "
					   "files: choose an empty or new "
					   "directory with --mount", mp);
			goto out;
		}
	}
	*abs_out = mp;
	mp = NULL;
	rc = 0;
out:
	free(mp);
	return rc;
}
