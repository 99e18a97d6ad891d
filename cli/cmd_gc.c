/*
 * sbx gc: delete sandboxes a provider still has but no session owns any
 * more (a pod left behind by a lost $SBX_HOME record, a crash between
 * create and record, `rm -r` of the state).  Only sandboxes that the
 * provider attributes to this state directory are considered (the
 * kubernetes provider labels its pods with it; it also looks in every
 * namespace a session was pinned to).
 *
 * What an orphan leaves on this machine goes with it: a mount of the
 * session still served by its daemon (found in the mount table by its
 * source "sbx:NAME" and owned by this $SBX_HOME: its control socket is
 * under $SBX_HOME/run, or it is a dead mount at the default mountpoint),
 * the daemon (it exits when its mount is gone), the mountpoint directory
 * (when empty), the log and the lock file.  Lock files of sessions
 * without a record are removed too.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/config.h"
#include "sbx/json.h"
#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/state.h"
#include "sbx/status.h"
#include "sbx/xmalloc.h"
#include "cli_i.h"

struct gc_ctx {
	char **sessions; /* orphans found by list() */
	size_t n;
	size_t live;
};

static int gc_found(const struct sbx_sandbox_info *info, void *payload)
{
	struct gc_ctx *g = payload;

	if (sbx_name_validate(info->session) == 0 &&
	    sbx_state_exists(info->session)) {
		g->live++;
		return 0;
	}
	sbx_error_clear();
	g->sessions = sbx_xrealloc(g->sessions,
				   (g->n + 1) * sizeof(*g->sessions));
	g->sessions[g->n++] = sbx_xstrdup(info->session);
	printf("%s\t%s\n", info->session,
	       info->sandbox_id ? info->sandbox_id : "?");
	return 0;
}

/* The mountpoints of fuse.sbx mounts with source "sbx:NAME". */
static size_t session_mounts(char ***out, const char *name)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *line = NULL, *want = sbx_xasprintf("sbx:%s", name);
	size_t cap = 0, n = 0;

	*out = NULL;
	while (f && getline(&line, &cap, f) > 0) {
		const char *p = line, *sep = strstr(line, " - ");
		size_t len;
		char *mp, *fs, *src;

		for (int i = 0; i < 4 && p; i++) {
			p = strchr(p, ' ');
			if (p)
				p++;
		}
		if (!p || !sep)
			continue;
		len = strcspn(p, " ");
		fs = sbx_xstrndup(sep + 3, strcspn(sep + 3, " "));
		src = sep[3] ? strchr(sep + 3, ' ') : NULL;
		src = src ? sbx_mountinfo_unescape(src + 1, strcspn(src + 1, " \n"))
			  : sbx_xstrdup("");
		if (!strcmp(fs, "fuse.sbx") && !strcmp(src, want)) {
			mp = sbx_mountinfo_unescape(p, len);
			*out = sbx_xrealloc(*out, (n + 1) * sizeof(**out));
			(*out)[n++] = mp;
		}
		free(fs);
		free(src);
	}
	if (f)
		fclose(f);
	free(line);
	free(want);
	return n;
}

/* Is the mount at `mp` one of this $SBX_HOME's? */
static bool ours(const char *mp, const char *name, const char *run_dir,
		 const char *default_mp)
{
	char ctl[4096];
	ssize_t n = getxattr(mp, "user.sbx.control", ctl, sizeof(ctl) - 1);

	if (n > 0) {
		size_t l = strlen(run_dir);

		ctl[n] = '\0';
		return !strncmp(ctl, run_dir, l) && ctl[l] == '/';
	}
	/* A dead daemon cannot say: only the default place is surely ours. */
	return default_mp && !strcmp(mp, default_mp);
}

/* Remove what orphan session `name` left on this machine. */
static void gc_leftovers(const char *name, const cJSON *cfg)
{
	char **mps = NULL, *run = NULL, *root = NULL, *dflt = NULL;
	char *log = NULL;
	size_t n = session_mounts(&mps, name);
	int lock = -1;

	if (sbx_paths_subdir(&run, "run") < 0 ||
	    sbx_config_mount_root(&root, cfg) < 0)
		sbx_error_clear();
	if (root)
		dflt = sbx_xasprintf("%s/%s", root, name);
	for (size_t i = 0; i < n; i++) {
		if (run && ours(mps[i], name, run, dflt)) {
			struct timespec nap = {0, 100 * 1000000L};

			/* Lazy: the daemon sees its mount go and exits. */
			if (cli_unmount(mps[i], true) < 0) {
				fprintf(stderr, "sbx: gc: %s: %s\n", name,
					sbx_error_last()->msg);
				sbx_error_clear();
			} else {
				for (int t = 0; t < 50; t++) {
					char **left = NULL;
					size_t still = session_mounts(&left,
								      name);
					bool there = false;

					for (size_t k = 0; k < still; k++) {
						there |= !strcmp(left[k],
								 mps[i]);
						free(left[k]);
					}
					free(left);
					if (!there)
						break;
					nanosleep(&nap, NULL);
				}
				if (rmdir(mps[i]) == 0)
					fprintf(stderr, "sbx: gc: %s: unmounted "
						"and removed %s\n", name,
						mps[i]);
				else
					fprintf(stderr, "sbx: gc: %s: unmounted "
						"%s\n", name, mps[i]);
			}
		}
		free(mps[i]);
	}
	free(mps);
	/* The default mountpoint, if it is an empty directory. */
	if (dflt)
		(void)rmdir(dflt);
	if (sbx_paths_session_file(&log, "logs", name, ".log") == 0)
		(void)unlink(log);
	if (sbx_state_lock(&lock, name, true, 0) == 0)
		sbx_state_unlock_forget(lock, name);
	sbx_error_clear();
	free(log);
	free(dflt);
	free(root);
	free(run);
}

/* Lock files of sessions that have no record (left by older versions). */
static void gc_locks(void)
{
	char *dir = NULL;
	DIR *d;
	struct dirent *e;

	if (sbx_paths_subdir(&dir, "sessions") < 0) {
		sbx_error_clear();
		return;
	}
	d = opendir(dir);
	while (d && (e = readdir(d))) {
		size_t l = strlen(e->d_name);
		char *name;
		int lock = -1;

		if (l <= 5 || strcmp(e->d_name + l - 5, ".lock"))
			continue;
		name = sbx_xstrndup(e->d_name, l - 5);
		if (sbx_name_validate(name) == 0 && !sbx_state_exists(name) &&
		    sbx_state_lock(&lock, name, true, 0) == 0)
			sbx_state_unlock_forget(lock, name);
		sbx_error_clear();
		free(name);
	}
	if (d)
		closedir(d);
	free(dir);
}

int cli_cmd_gc(int argc, char **argv)
{
	static const struct option opts[] = {
		{"provider", required_argument, NULL, 'p'},
		{"dry-run", no_argument, NULL, 'n'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	struct sbx_config_opts copts = {0};
	struct sbx_provider *p = NULL;
	struct gc_ctx g = {0};
	const char *pname = NULL;
	cJSON *cfg = NULL, *flags = NULL;
	bool dry = false;
	int opt, rc, ret = CLI_EXIT_FAIL, failed = 0;

	while ((opt = getopt_long(argc, argv, "nh", opts, NULL)) != -1) {
		switch (opt) {
		case 'p': pname = optarg; break;
		case 'n': dry = true; break;
		default: return cli_common_opt("gc", opt);
		}
	}
	if (optind < argc)
		return cli_usage("gc", "no arguments expected");
	flags = cJSON_CreateObject();
	if (!flags)
		abort();
	if (pname)
		sbx_json_set_str(flags, "provider", pname);
	copts.config_file = cli_g.config_file;
	copts.flags = flags;
	rc = sbx_config_load(&cfg, &copts);
	if (rc < 0) {
		ret = cli_report(CLI_EXIT_CONFIG);
		goto out;
	}
	pname = sbx_config_provider(cfg);
	rc = sbx_provider_new(&p, pname, sbx_config_section(cfg, pname));
	if (rc == 0)
		rc = p->ops->list(p, gc_found, &g);
	if (rc < 0) {
		ret = cli_report(CLI_EXIT_FAIL);
		goto out;
	}
	for (size_t i = 0; i < g.n && !dry; i++) {
		rc = p->ops->terminate(p, g.sessions[i], SBX_TERMINATE_FORCE);
		if (rc < 0) {
			fprintf(stderr, "sbx: gc: %s: %s\n", g.sessions[i],
				sbx_error_last()->msg);
			sbx_error_clear();
			failed++;
			continue;
		}
		gc_leftovers(g.sessions[i], cfg);
	}
	if (!dry)
		gc_locks();
	fprintf(stderr, "sbx: gc: %zu orphaned sandbox%s %s, %zu in use%s\n",
		g.n, g.n == 1 ? "" : "es",
		dry ? "found (dry run: nothing deleted)" : "deleted", g.live,
		failed ? " (some deletions failed)" : "");
	ret = failed ? CLI_EXIT_FAIL : CLI_EXIT_OK;
out:
	for (size_t i = 0; i < g.n; i++)
		free(g.sessions[i]);
	free(g.sessions);
	sbx_provider_free(p);
	cJSON_Delete(cfg);
	cJSON_Delete(flags);
	return ret;
}
