/*
 * sbx shim install / sbx env: put the sbx-exec multicall shim on PATH under
 * the names of common tools (docs/exec.md, "Shims").
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sbx/paths.h"
#include "sbx/state.h"
#include "sbx/xmalloc.h"

#include "cli_i.h"

/* The default set: shells, build drivers, language toolchains and the
 * tools agents run most.  Documented in docs/exec.md. */
static const char *const default_cmds[] = {
	"sh", "bash", "make", "cmake", "ninja", "meson", "git",
	"npm", "npx", "node", "yarn", "pnpm", "bun",
	"python", "python3", "pip", "pip3", "pytest", "uv",
	"cargo", "rustc", "go",
	"gcc", "cc", "g++", "c++", "clang", "clang++", "ld",
	"rg", "env", NULL,
};

static bool is_exec(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, X_OK) == 0;
}

/*
 * The installed sbx-exec: beside this sbx binary (also ../shim/ of it, the
 * build tree), else on PATH, else in the configured bindir.  *out malloc'd.
 */
static int find_shim(char **out)
{
	char self[PATH_MAX], *slash, *cand;
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	const char *path = getenv("PATH"), *p;

	*out = NULL;
	if (n > 0) {
		self[n] = '\0';
		slash = strrchr(self, '/');
		*slash = '\0';
		cand = sbx_xasprintf("%s/sbx-exec", self);
		if (is_exec(cand))
			goto found;
		free(cand);
		cand = sbx_xasprintf("%s/../shim/sbx-exec", self);
		if (is_exec(cand))
			goto found;
		free(cand);
	}
	for (p = path; p && *p;) {
		size_t l = strcspn(p, ":");

		cand = sbx_xasprintf("%.*s/sbx-exec", (int)l, p);
		if (l && cand[0] == '/' && is_exec(cand))
			goto found;
		free(cand);
		p += l;
		p += *p == ':';
	}
	cand = sbx_xasprintf("%s/sbx-exec", SBX_BINDIR);
	if (is_exec(cand))
		goto found;
	free(cand);
	return sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
			     "cannot find sbx-exec (looked beside %s, on PATH "
			     "and in %s); install sbx completely",
			     n > 0 ? self : "sbx", SBX_BINDIR);
found:
	*out = realpath(cand, NULL);
	free(cand);
	if (!*out)
		return sbx_error_os("resolve sbx-exec");
	return 0;
}

/* Make DIR/<cmd> -> shim for each cmd; replaces symlinks, refuses files. */
static int install(const char *dir, const char *const *cmds, bool verbose)
{
	char *shim = NULL;
	int rc;

	rc = find_shim(&shim);
	if (rc < 0)
		return rc;
	rc = sbx_paths_mkdir_p(dir, 0755);
	if (rc < 0)
		goto out;
	for (size_t i = 0; cmds[i]; i++) {
		char *link = sbx_xasprintf("%s/%s", dir, cmds[i]);
		char *tmp = sbx_xasprintf("%s/.%s.sbx-tmp", dir, cmds[i]);
		struct stat st;

		if (strchr(cmds[i], '/') || !cmds[i][0] ||
		    !strcmp(cmds[i], "sbx-exec") || !strcmp(cmds[i], "sbx")) {
			rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					   "'%s' is not a command name for a "
					   "shim", cmds[i]);
		} else if (lstat(link, &st) == 0 && !S_ISLNK(st.st_mode)) {
			rc = sbx_error_set(SBX_ERR_STATE, -EEXIST,
					   "%s exists and is not a symlink; "
					   "not replacing it", link);
		} else {
			unlink(tmp);
			if (symlink(shim, tmp) < 0 || rename(tmp, link) < 0) {
				rc = sbx_error_os("create symlink %s", link);
				unlink(tmp);
			} else if (verbose) {
				printf("%s -> %s\n", link, shim);
			}
		}
		free(link);
		free(tmp);
		if (rc < 0)
			goto out;
	}
out:
	free(shim);
	return rc;
}

int cli_cmd_shim(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "quiet", no_argument, NULL, 'q' },
		{ 0 },
	};
	bool quiet = false;
	int opt, rc;

	while ((opt = getopt_long(argc, argv, "+hq", lo, NULL)) != -1) {
		if (opt == 'q')
			quiet = true;
		else
			return cli_common_opt("shim", opt);
	}
	if (optind >= argc || strcmp(argv[optind], "install"))
		return cli_usage("shim", "expected `sbx shim install DIR "
					 "[CMD...]`");
	if (optind + 1 >= argc)
		return cli_usage("shim", "missing the directory DIR");
	rc = install(argv[optind + 1],
		     optind + 2 < argc ? (const char *const *)argv + optind + 2
				       : default_cmds,
		     !quiet);
	if (rc < 0)
		return cli_report(CLI_EXIT_FAIL);
	return CLI_EXIT_OK;
}

/* Print `s` as one single-quoted shell word. */
static void shell_quote(const char *s)
{
	putchar('\'');
	for (; *s; s++) {
		if (*s == '\'')
			fputs("'\\''", stdout);
		else
			putchar(*s);
	}
	putchar('\'');
}

int cli_cmd_env(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "dir", required_argument, NULL, 'd' },
		{ 0 },
	};
	const char *dir = NULL;
	char *shims = NULL, *probe = NULL;
	struct sbx_session s;
	int opt, rc;

	while ((opt = getopt_long(argc, argv, "hd:", lo, NULL)) != -1) {
		if (opt == 'd')
			dir = optarg;
		else
			return cli_common_opt("env", opt);
	}
	rc = cli_args_name("env", argc, argv, 1, 1,
			   "expected one session NAME");
	if (rc != CLI_EXIT_OK)
		return rc;
	rc = sbx_state_load(&s, argv[optind]);
	sbx_session_fini(&s);
	if (rc < 0)
		return cli_report(CLI_EXIT_FAIL);
	if (dir) {
		char *abs = NULL;

		rc = sbx_path_absolute(dir, &abs);
		if (rc < 0)
			return cli_report(CLI_EXIT_FAIL);
		shims = abs;
	} else {
		rc = sbx_paths_subdir(&shims, "shims");
		if (rc < 0)
			return cli_report(CLI_EXIT_FAIL);
	}
	/* Installed on demand, once. */
	probe = sbx_xasprintf("%s/sh", shims);
	if (access(probe, F_OK) < 0) {
		rc = install(shims, default_cmds, false);
		if (rc < 0) {
			free(probe);
			free(shims);
			return cli_report(CLI_EXIT_FAIL);
		}
	}
	fputs("export PATH=", stdout);
	shell_quote(shims);
	fputs(":\"$PATH\"\n", stdout);
	fputs("export SBX_SESSION=", stdout);
	shell_quote(argv[optind]);
	putchar('\n');
	free(probe);
	free(shims);
	return CLI_EXIT_OK;
}
