/* The exec environment policy and exit-code mapping; see sbx/ctl.h. */
#include "config.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "sbx/ctl.h"
#include "sbx/xmalloc.h"

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

bool sbx_ctl_env_listed(const char *list, const char *name, size_t n)
{
	for (const char *p = list; p && *p;) {
		size_t l = strcspn(p, ", :\t");

		if (l == n && !strncmp(p, name, n))
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
		    sbx_ctl_env_listed(list, name, nlen))
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
