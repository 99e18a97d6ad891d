/*
 * Path identity for commands (docs/protocol.md, "Exec", field "alias";
 * docs/design.md, "Repository in and out"): the client mounts the sandbox
 * at, say, /home/u/sbx/NAME, and tools hand commands that path ("cd
 * /home/u/sbx/NAME && make"), so inside the sandbox that path must lead to
 * the agent's root.  In order of preference:
 *
 *  1. it already does: the path is the root, or a symlink to it (made by
 *     an earlier command), or a directory with the root's identity;
 *  2. it does not exist: create its parent directories and a symlink to
 *     the root there.  The agent usually owns its sandbox (root in a pod
 *     or Modal VM); it stays for later commands and for anything the
 *     commands start;
 *  3. something else is there -- typically the client's own FUSE mount,
 *     when agent and client share a machine (tests, an agent on the
 *     user's host): as root, the command runs in a private mount
 *     namespace with the root bind-mounted over the path, so it sees the
 *     sandbox's files there directly, not through the mount;
 *  4. otherwise the command runs without it (the shim's argument
 *     rewriting still maps whole arguments).
 *
 * Nothing is ever created inside the root, and nothing that exists is
 * removed or replaced.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sbx/log.h"
#include "sbx/xmalloc.h"

#include "agent_i.h"

/* "/a//b/./c/" -> "/a/b/c"; NULL for relative paths, "..", "/" alone. */
static char *alias_norm(const char *in)
{
	size_t n = strlen(in), o = 0;
	char *out;

	if (in[0] != '/' || n >= PATH_MAX)
		return NULL;
	out = sbx_xmalloc(n + 1);
	for (size_t i = 0; i < n;) {
		size_t j;

		while (i < n && in[i] == '/')
			i++;
		j = i;
		while (j < n && in[j] != '/')
			j++;
		if (j == i)
			break;
		if (j - i == 1 && in[i] == '.') {
			i = j;
			continue;
		}
		if (j - i == 2 && in[i] == '.' && in[i + 1] == '.') {
			free(out);
			return NULL;
		}
		out[o++] = '/';
		memcpy(out + o, in + i, j - i);
		o += j - i;
		i = j;
	}
	if (o == 0) {
		free(out);
		return NULL;
	}
	out[o] = '\0';
	return out;
}

/* Is `p` equal to, inside, or above `root`? */
static bool overlaps(const char *p, const char *root)
{
	size_t pl = strlen(p), rl = strlen(root);
	size_t m = pl < rl ? pl : rl;

	if (strncmp(p, root, m) != 0)
		return false;
	return pl == rl || (pl > rl ? p[rl] == '/' : root[pl] == '/');
}

/* mkdir -p of the parent of `path` (0755). */
static int mkparents(const char *path)
{
	char *p = sbx_xstrdup(path);
	int rc = 0;

	for (char *s = p + 1; (s = strchr(s, '/')); s++) {
		*s = '\0';
		if (mkdir(p, 0755) < 0 && errno != EEXIST) {
			rc = -errno;
			*s = '/';
			break;
		}
		*s = '/';
	}
	free(p);
	return rc;
}

static bool same_file(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* Does the symlink at `path` point at `root`? */
static bool links_to(const char *path, const char *root)
{
	char buf[PATH_MAX];
	ssize_t n = readlink(path, buf, sizeof(buf) - 1);

	if (n < 0)
		return false;
	buf[n] = '\0';
	return strcmp(buf, root) == 0;
}

void agent_alias_prepare(struct agent *a, const char *alias,
			 struct agent_alias *out)
{
	struct stat st, rst;
	char *p;

	memset(out, 0, sizeof(*out));
	out->root = a->root_path;
	if (!alias || !*alias)
		return;
	p = alias_norm(alias);
	if (!p) {
		sbx_debug("exec alias \"%s\": not an absolute path; ignored",
			  alias);
		return;
	}
	out->path = p;
	if (strcmp(p, a->root_path) == 0) {
		out->mode = AGENT_ALIAS_READY;
		return;
	}
	if (overlaps(p, a->root_path)) {
		/* Never create anything inside the tree we serve. */
		sbx_debug("exec alias %s: overlaps the root %s; ignored", p,
			  a->root_path);
		goto none;
	}
	if (stat(a->root_path, &rst) < 0)
		goto none;
	for (int attempt = 0; attempt < 2; attempt++) {
		if (lstat(p, &st) == 0) {
			if (S_ISLNK(st.st_mode) && links_to(p, a->root_path)) {
				out->mode = AGENT_ALIAS_READY;
				return;
			}
			if (S_ISDIR(st.st_mode) && same_file(&st, &rst)) {
				out->mode = AGENT_ALIAS_READY;
				return;
			}
			if (S_ISDIR(st.st_mode) && geteuid() == 0) {
				out->mode = AGENT_ALIAS_BIND;
				return;
			}
			sbx_debug("exec alias %s: something else is there; "
				  "ignored", p);
			goto none;
		}
		if (errno != ENOENT)
			break;
		if (mkparents(p) == 0 && symlink(a->root_path, p) == 0) {
			sbx_info("exec alias: %s -> %s", p, a->root_path);
			out->mode = AGENT_ALIAS_READY;
			return;
		}
		if (errno != EEXIST)
			break;
		/* Another command made it meanwhile: look again. */
	}
	sbx_debug("exec alias %s: cannot provide it: %s", p, strerror(errno));
none:
	out->mode = AGENT_ALIAS_NONE;
}

void agent_alias_fini(struct agent_alias *al)
{
	if (!al)
		return;
	free(al->path);
	memset(al, 0, sizeof(*al));
}

void agent_alias_enter(const struct agent_alias *al)
{
	if (al->mode != AGENT_ALIAS_BIND)
		return;
	/* Private: the bind mount must not show outside this command
	 * (MS_SLAVE keeps receiving the host's mounts). */
	if (unshare(CLONE_NEWNS) < 0 ||
	    mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0 ||
	    mount(al->root, al->path, NULL, MS_BIND | MS_REC, NULL) < 0)
		return;
}
