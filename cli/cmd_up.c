/* sbx up: get-or-create a session's sandbox and mount it. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/config.h"
#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/state.h"
#include "sbx/status.h"
#include "sbx/xmalloc.h"
#include "cli_i.h"
#include "repo_i.h"

/* What the command line gives; cli_up_opts is built from it. */
struct up_opts {
	const char *name;
	const char *provider;
	const char *repo;
	const char *ref;
	const char *mount;
	const char *config;
	const char *url;        /* remote: agent base URL */
	const char *token_file; /* remote: token file */
	const char *timeout;    /* remote: seconds per request */
	const char *image;      /* kubernetes: the sandbox image */
	const char *ns;         /* kubernetes: namespace */
	const char *context;    /* kubernetes: kubeconfig context */
	const char *kubeconfig; /* kubernetes: kubeconfig file */
	const char *depth;      /* --depth N */
	bool carry;
	bool isolate;
	bool allow_other;
	bool json;
	bool no_repo;
};

/* Session name from the repository directory name plus 4 random hex. */
static int gen_name(char **out, const char *repo)
{
	char *top = NULL, base[48];
	const char *b = "sbx";
	unsigned char rnd[2];
	size_t n = 0;
	int rc;

	*out = NULL;
	rc = sbx_paths_git_toplevel(&top, repo);
	if (rc == 0) {
		b = strrchr(top, '/') + 1;
		if (!*b)
			b = "sbx";
	} else {
		sbx_error_clear();
	}
	/* Map the directory name onto the allowed alphabet. */
	for (const char *p = b; *p && n < sizeof(base) - 1; p++) {
		char c = *p;

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '_' || c == '-' ||
		      c == '.'))
			c = '-';
		if (n == 0 && (c == '.' || c == '-'))
			continue;
		base[n++] = c;
	}
	base[n] = '\0';
	if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd)) {
		unsigned long t = (unsigned long)time(NULL) ^
				  (unsigned long)getpid();

		rnd[0] = (unsigned char)t;
		rnd[1] = (unsigned char)(t >> 8);
	}
	*out = sbx_xasprintf("%s-%02x%02x", n ? base : "sbx", rnd[0], rnd[1]);
	free(top);
	return 0;
}

/*
 * obj[key] = the file given to option `flag`, made absolute, because the
 * daemon and later commands run from other directories.  CLI_EXIT_OK, or
 * the usage exit code when the value is empty or cannot be expanded.
 */
static int file_flag(cJSON *obj, const char *key, const char *flag,
		     const char *value)
{
	char *abs = NULL;

	if (!*value || sbx_path_expand_user(&abs, value) < 0) {
		sbx_error_clear();
		return cli_usage("up", "%s needs a file", flag);
	}
	sbx_json_set_str(obj, key, abs);
	free(abs);
	return CLI_EXIT_OK;
}

/*
 * --url, --token-file, --timeout: the "remote" section of the command-line
 * layer.  The token file is made absolute here, because the daemon and
 * later commands run from other directories.
 */
static int remote_flags(cJSON *flags, const struct up_opts *o)
{
	cJSON *remote = cJSON_CreateObject();
	char *end = NULL;
	int rc;

	if (!remote)
		abort();
	if (o->url) {
		if (!*o->url) {
			cJSON_Delete(remote);
			return cli_usage("up", "--url needs a URL");
		}
		sbx_json_set_str(remote, "url", o->url);
	}
	if (o->token_file &&
	    (rc = file_flag(remote, "token_file", "--token-file",
			    o->token_file)) != CLI_EXIT_OK) {
		cJSON_Delete(remote);
		return rc;
	}
	if (o->timeout) {
		double t = strtod(o->timeout, &end);

		if (end == o->timeout || *end || !(t > 0) || t > 86400) {
			cJSON_Delete(remote);
			return cli_usage("up", "--timeout needs a number of "
					       "seconds (0 < SECONDS <= "
					       "86400)");
		}
		if (!cJSON_AddNumberToObject(remote, "timeout", t))
			abort();
	}
	sbx_json_set_take(flags, "remote", remote);
	return CLI_EXIT_OK;
}

/*
 * --image, --namespace, --context, --kubeconfig: the "kubernetes" section
 * of the command-line layer (the file made absolute, as --token-file).
 */
static int kube_flags(cJSON *flags, const struct up_opts *o)
{
	cJSON *k = cJSON_CreateObject();
	const struct {
		const char *flag, *key, *value;
	} v[] = {
		{"--image", "image", o->image},
		{"--namespace", "namespace", o->ns},
		{"--context", "context", o->context},
	};
	int rc;

	if (!k)
		abort();
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		if (!v[i].value)
			continue;
		if (!*v[i].value) {
			cJSON_Delete(k);
			return cli_usage("up", "%s needs a value", v[i].flag);
		}
		sbx_json_set_str(k, v[i].key, v[i].value);
	}
	if (o->kubeconfig &&
	    (rc = file_flag(k, "kubeconfig", "--kubeconfig",
			    o->kubeconfig)) != CLI_EXIT_OK) {
		cJSON_Delete(k);
		return rc;
	}
	/* --image means the same for the modal provider. */
	if (o->image) {
		cJSON *modal = cJSON_CreateObject();

		if (!modal)
			abort();
		sbx_json_set_str(modal, "image", o->image);
		sbx_json_set_take(flags, "modal", modal);
	}
	sbx_json_set_take(flags, "kubernetes", k);
	return CLI_EXIT_OK;
}

/* Fill the record from what the provider reported. */
static void take_info(struct sbx_session *s, const struct sbx_sandbox_info *i)
{
	free(s->sandbox_id);
	s->sandbox_id = i->sandbox_id ? sbx_xstrdup(i->sandbox_id) : NULL;
	free(s->workdir);
	s->workdir = i->workdir ? sbx_xstrdup(i->workdir) : NULL;
	free(s->isolation);
	s->isolation = i->isolation ? sbx_xstrdup(i->isolation) : NULL;
	s->state = i->state;
	s->remote = i->remote;
	if (i->created_at)
		s->created_at = i->created_at;
}

/*
 * Mount an existing session whose daemon is not serving.  `mount_dir`
 * overrides the recorded mountpoint.
 */
static int remount(struct sbx_session *s, const char *mount_dir,
		   const cJSON *cfg, int lock_fd)
{
	char *mp = NULL, *dflt = NULL, *root = NULL;
	bool created;
	int rc;

	if (!mount_dir && !s->mountpoint) {
		rc = sbx_config_mount_root(&root, cfg);
		if (rc < 0)
			return rc;
		dflt = sbx_xasprintf("%s/%s", root, s->session);
	}
	/* A daemon that is alive but not mounted is useless: end it. */
	rc = cli_daemon_stop(s, true);
	if (rc < 0)
		goto out;
	rc = cli_mountpoint_prepare(&mp, &created,
				    mount_dir ? mount_dir
					      : dflt ? dflt : s->mountpoint,
				    s->session);
	if (rc < 0)
		goto out;
	free(s->mountpoint);
	s->mountpoint = mp;
	rc = cli_daemon_start(s, lock_fd);
	if (rc < 0) {
		char msg[sizeof(sbx_error_last()->msg)];
		int klass = sbx_error_last()->klass;

		memcpy(msg, sbx_error_last()->msg, sizeof(msg));
		sbx_session_set_error(
			s, sbx_status_error_type(klass, SBX_STATUS_FILE_ERROR),
			msg);
		if (sbx_state_save(s) == 0)
			sbx_error_set(klass, rc, "%s", msg);
		if (created)
			rmdir(s->mountpoint);
		goto out;
	}
	sbx_session_set_error(s, NULL, NULL);
	/* `down --keep-sandbox` left it stopped; serving it again. */
	if (s->state == SBX_STATE_STOPPED || s->state == SBX_STATE_ERROR)
		s->state = SBX_STATE_READY;
	rc = sbx_state_save(s);
out:
	free(root);
	free(dflt);
	return rc;
}

/* Create a new session: provider create, record, mount. */
static int create(struct sbx_session *s, const struct cli_up_opts *o,
		  const cJSON *cfg, int lock_fd, int *exit_out)
{
	struct sbx_sandbox_info info;
	struct sbx_provider *p = NULL;
	struct sbx_create_opts co;
	const char *pname = sbx_config_provider(cfg);
	const cJSON *section = sbx_config_section(cfg, pname);
	char *repo = NULL, *root = NULL, *dflt = NULL, *mp = NULL;
	bool created_mp = false, recorded = false, adopted = false;
	bool made = false;
	struct cli_seed *seed = NULL;
	bool seed_implicit = false;
	int rc;

	memset(&info, 0, sizeof(info));
	*exit_out = CLI_EXIT_FAIL;

	/* Check every input before changing anything. */
	if (strcmp(pname, "local") == 0 || o->repo) {
		rc = sbx_paths_git_toplevel(&repo, o->repo);
		if (rc < 0)
			goto out;
	}
	/* A sandbox elsewhere gets the repository sent (repo_up.c). */
	rc = cli_up_seed_prepare(&seed, &seed_implicit, o, pname);
	if (rc < 0) {
		*exit_out = sbx_error_last()->klass == SBX_ERR_STATE
				    ? CLI_EXIT_REFUSED
				    : CLI_EXIT_CONFIG;
		goto out;
	}
	if (seed) {
		free(repo);
		repo = sbx_xstrdup(cli_seed_repo(seed));
	}
	if (!o->mount) {
		rc = sbx_config_mount_root(&root, cfg);
		if (rc < 0)
			goto out;
		dflt = sbx_xasprintf("%s/%s", root, s->session);
	}
	rc = sbx_provider_new(&p, pname, section);
	if (rc < 0)
		goto out;
	rc = cli_mountpoint_prepare(&mp, &created_mp,
				    o->mount ? o->mount : dflt, s->session);
	if (rc < 0)
		goto out;

	/* Record "creating" first so a crash leaves a trace to clean up. */
	s->provider = sbx_xstrdup(pname);
	s->provider_config = section ? cJSON_Duplicate(section, 1)
				     : cJSON_CreateObject();
	s->state = SBX_STATE_CREATING;
	s->mountpoint = mp;
	mp = NULL;
	s->repo = repo ? sbx_xstrdup(repo) : NULL;
	s->created_at = time(NULL);
	s->allow_other = sbx_config_allow_other(cfg);
	rc = sbx_state_save(s);
	if (rc < 0)
		goto out;
	recorded = true;

	memset(&co, 0, sizeof(co));
	co.session = s->session;
	co.repo = repo;
	co.ref = o->ref;
	co.carry_changes = o->carry;
	co.options = section;
	rc = p->ops->create(p, &co, &info);
	if (rc == -EEXIST) {
		/*
		 * The provider still has it although we have no record (lost
		 * state, or `down` failed half-way): adopt it.
		 */
		sbx_error_clear();
		fprintf(stderr, "sbx: reusing the existing sandbox of "
				"session %s\n", s->session);
		adopted = true;
		rc = p->ops->get(p, s->session, &info);
	}
	if (rc < 0) {
		*exit_out = CLI_EXIT_CREATE;
		rc = sbx_error_prefix(rc, "create sandbox for session %s",
				      s->session);
		goto out;
	}
	take_info(s, &info);
	/* Ours to delete again if the rest fails (remote: local worktrees
	 * keep their old "retry with sbx mount" behaviour). */
	made = info.remote && !adopted;
	if (s->state == SBX_STATE_CREATING)
		s->state = SBX_STATE_READY;
	if (seed && !adopted) {
		rc = cli_up_seed(seed, seed_implicit, p, s);
		if (rc < 0) {
			*exit_out = CLI_EXIT_CREATE;
			goto out;
		}
	}
	rc = sbx_state_save(s);
	if (rc < 0)
		goto out;
	recorded = false; /* from here on, the record stays */
	created_mp = false;

	rc = remount(s, NULL, cfg, lock_fd);
	if (rc < 0 && made) {
		/* Undone below, sandbox, record and mountpoint. */
		recorded = true;
		created_mp = true;
		rc = sbx_error_prefix(rc, "mounting the new sandbox failed");
	} else if (rc < 0) {
		rc = sbx_error_prefix(rc, "sandbox %s created, but mounting "
				      "it failed (retry with `sbx mount %s`)",
				      s->sandbox_id ? s->sandbox_id : "",
				      s->session);
	}
out:
	if (rc < 0 && made) {
		/*
		 * A failed `up` leaves no sandbox of its own behind: one we
		 * made and cannot use (the pod proxy is forbidden, the
		 * repository could not be sent, the mount failed) holds
		 * nothing yet and would only cost quota and a `down --force`.
		 */
		struct sbx_error e = *sbx_error_last();

		if (p->ops->terminate(p, s->session, SBX_TERMINATE_FORCE) < 0) {
			fprintf(stderr, "sbx: could not delete the new sandbox "
					"%s again: %s; run `sbx gc`\n",
				s->sandbox_id ? s->sandbox_id : "",
				sbx_error_last()->msg);
			sbx_error_restore(&e);
		} else {
			sbx_error_restore(&e);
			rc = sbx_error_prefix(rc, "the new sandbox %s was "
					      "deleted again",
					      s->sandbox_id ? s->sandbox_id
							    : "");
		}
	}
	if (recorded) {
		/* Undo our record, keeping the error being reported. */
		struct sbx_error saved = *sbx_error_last();

		if (sbx_state_remove(s->session) < 0)
			sbx_warn("could not remove the record of session %s",
				 s->session);
		sbx_error_set(saved.klass, saved.code, "%s", saved.msg);
	}
	if (created_mp && rc < 0 && s->mountpoint)
		rmdir(s->mountpoint);
	cli_seed_free(seed);
	sbx_sandbox_info_fini(&info);
	sbx_provider_free(p);
	free(mp);
	free(dflt);
	free(root);
	free(repo);
	return rc;
}

/*
 * A record left in "creating" by a crashed `sbx up`: adopt the sandbox if
 * the provider has it (returns 0), else drop the record (returns -ENOENT
 * with NOTFOUND, so the caller creates afresh).
 */
static int recover(struct sbx_session *s)
{
	struct sbx_sandbox_info info;
	struct sbx_provider *p = NULL;
	int rc;

	memset(&info, 0, sizeof(info));
	rc = cli_session_provider(&p, s);
	if (rc < 0)
		return rc;
	rc = p->ops->get(p, s->session, &info);
	if (rc == 0) {
		take_info(s, &info);
		if (s->state == SBX_STATE_CREATING)
			s->state = SBX_STATE_READY;
		rc = sbx_state_save(s);
	} else if (rc == -ENOENT) {
		rc = sbx_state_remove(s->session);
		if (rc == 0)
			rc = sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT,
					   "no session %s", s->session);
	}
	sbx_sandbox_info_fini(&info);
	sbx_provider_free(p);
	return rc;
}

int cli_session_up(cJSON **status_out, int *exit_out,
		   const struct cli_up_opts *o)
{
	struct sbx_session s;
	struct sbx_config_opts copts = {0};
	struct cli_up_opts eff;
	cJSON *cfg = NULL;
	int rc, lock = -1;

	*status_out = NULL;
	*exit_out = CLI_EXIT_FAIL;
	sbx_session_init(&s);
	copts.repo = o->repo;
	copts.config_file = o->config_file;
	copts.flags = o->flags;
	rc = sbx_config_load(&cfg, &copts);
	if (rc < 0) {
		*exit_out = CLI_EXIT_CONFIG;
		goto out;
	}
	if ((o->no_repo || o->depth) &&
	    strcmp(sbx_config_provider(cfg), "local") == 0) {
		*exit_out = CLI_EXIT_USAGE;
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "--depth and --no-repo apply to sandboxes "
				   "elsewhere (remote, kubernetes, modal); a "
				   "local sandbox is a worktree of the "
				   "repository");
		goto out;
	}
	/* "ref", "carry_changes", "depth", "no_repo" of the configuration
	 * (opencode.json's sandbox section) where the caller gave none. */
	cli_up_repo_opts(&eff, o, cfg);
	o = &eff;
	if (o->isolate && strcmp(sbx_config_provider(cfg), "local") != 0) {
		*exit_out = CLI_EXIT_USAGE;
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "--isolate applies to the local provider "
				   "only");
		goto out;
	}

	rc = sbx_state_lock(&lock, o->name, true, CLI_LOCK_TIMEOUT_MS);
	if (rc < 0)
		goto out;
	rc = sbx_state_load(&s, o->name);
	if (rc == 0 && s.state == SBX_STATE_CREATING) {
		rc = recover(&s);
		if (rc < 0)
			sbx_session_fini(&s);
	}
	if (rc == 0) {
		if (sbx_status_mounted(&s)) {
			if (o->mount)
				fprintf(stderr, "sbx: session %s is already "
						"mounted at %s; --mount "
						"ignored\n", o->name,
					s.mountpoint);
			if (!s.allow_other && sbx_config_allow_other(cfg))
				fprintf(stderr, "sbx: session %s is already "
						"mounted without allow_other; "
						"run `sbx umount %s` and `sbx "
						"mount %s --allow-other`\n",
					o->name, o->name, o->name);
		} else {
			/* Sticky: turned off only by `sbx mount
			 * --no-allow-other`. */
			s.allow_other = s.allow_other ||
					sbx_config_allow_other(cfg);
			rc = remount(&s, o->mount, cfg, lock);
		}
	} else if (rc == -ENOENT &&
		   sbx_error_last()->klass == SBX_ERR_NOTFOUND) {
		sbx_error_clear();
		sbx_session_init(&s);
		s.session = sbx_xstrdup(o->name);
		rc = create(&s, o, cfg, lock, exit_out);
	}
	if (rc == 0) {
		*status_out = sbx_status_new(&s);
		*exit_out = CLI_EXIT_OK;
	}
out:
	/* A failed first `up` leaves no lock file behind. */
	sbx_state_unlock_forget(lock, o->name);
	sbx_session_fini(&s);
	cJSON_Delete(cfg);
	return rc;
}

int cli_cmd_up(int argc, char **argv)
{
	static const struct option opts[] = {
		{"provider", required_argument, NULL, 'p'},
		{"repo", required_argument, NULL, 'r'},
		{"ref", required_argument, NULL, 'R'},
		{"carry-changes", no_argument, NULL, 'c'},
		{"mount", required_argument, NULL, 'm'},
		{"isolate", no_argument, NULL, 'i'},
		{"allow-other", no_argument, NULL, 'A'},
		{"config", required_argument, NULL, 'C'},
		{"json", no_argument, NULL, 'j'},
		{"url", required_argument, NULL, 'U'},
		{"token-file", required_argument, NULL, 'T'},
		{"timeout", required_argument, NULL, 'W'},
		{"image", required_argument, NULL, 'I'},
		{"namespace", required_argument, NULL, 'N'},
		{"context", required_argument, NULL, 'X'},
		{"kubeconfig", required_argument, NULL, 'K'},
		{"depth", required_argument, NULL, 'D'},
		{"no-repo", no_argument, NULL, 'n'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	struct up_opts o = {0};
	struct cli_up_opts uo = {0};
	cJSON *flags = NULL, *status = NULL;
	char *name = NULL;
	bool generated = false;
	int opt, rc, ret = CLI_EXIT_FAIL;

	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'p': o.provider = optarg; break;
		case 'r': o.repo = optarg; break;
		case 'R': o.ref = optarg; break;
		case 'c': o.carry = true; break;
		case 'm': o.mount = optarg; break;
		case 'i': o.isolate = true; break;
		case 'A': o.allow_other = true; break;
		case 'C': o.config = optarg; break;
		case 'j': o.json = true; break;
		case 'U': o.url = optarg; break;
		case 'T': o.token_file = optarg; break;
		case 'W': o.timeout = optarg; break;
		case 'I': o.image = optarg; break;
		case 'N': o.ns = optarg; break;
		case 'X': o.context = optarg; break;
		case 'K': o.kubeconfig = optarg; break;
		case 'D': o.depth = optarg; break;
		case 'n': o.no_repo = true; break;
		default: return cli_common_opt("up", opt);
		}
	}
	if (argc - optind > 1)
		return cli_usage("up", "too many arguments");
	if (optind < argc) {
		o.name = argv[optind];
		if (cli_check_name("up", o.name))
			return CLI_EXIT_USAGE;
	}
	if (o.mount && !*o.mount)
		return cli_usage("up", "--mount needs a directory");
	if (o.no_repo && (o.repo || o.ref || o.carry || o.depth))
		return cli_usage("up", "--no-repo cannot be combined with "
				       "--repo, --ref, --carry-changes or "
				       "--depth");
	if (o.depth) {
		char *end = NULL;
		long d = strtol(o.depth, &end, 10);

		if (end == o.depth || *end || d < 1 || d > 1000000000L)
			return cli_usage("up", "--depth needs a number of "
					       "commits (1 or more)");
		uo.depth = (int)d;
	}

	flags = cJSON_CreateObject();
	if (o.provider)
		sbx_json_set_str(flags, "provider", o.provider);
	if (o.url || o.token_file || o.timeout) {
		ret = remote_flags(flags, &o);
		if (ret != CLI_EXIT_OK)
			goto out;
		ret = CLI_EXIT_FAIL;
	}
	if (o.image || o.ns || o.context || o.kubeconfig) {
		ret = kube_flags(flags, &o);
		if (ret != CLI_EXIT_OK)
			goto out;
		ret = CLI_EXIT_FAIL;
	}
	if (o.allow_other) {
		cJSON *mount = cJSON_CreateObject();

		sbx_json_set_take(mount, "allow_other", cJSON_CreateBool(1));
		sbx_json_set_take(flags, "mount", mount);
	}
	if (o.isolate) {
		cJSON *local = cJSON_CreateObject();

		sbx_json_set_str(local, "isolation", "bwrap");
		sbx_json_set_take(flags, "local", local);
	}

	if (o.name) {
		name = sbx_xstrdup(o.name);
	} else {
		/* Avoid the rare clash with an existing session. */
		for (int i = 0; i < 8; i++) {
			free(name);
			rc = gen_name(&name, o.repo);
			if (rc < 0 || !sbx_state_exists(name))
				break;
		}
		generated = true;
	}

	uo.name = name;
	uo.repo = o.repo;
	uo.ref = o.ref;
	uo.mount = o.mount;
	uo.config_file = o.config ? o.config : cli_g.config_file;
	uo.flags = flags;
	uo.carry = o.carry;
	uo.isolate = o.isolate;
	uo.no_repo = o.no_repo;
	uo.progress = !o.json && isatty(STDERR_FILENO);
	rc = cli_session_up(&status, &ret, &uo);
	if (rc < 0) {
		if (ret == CLI_EXIT_USAGE)
			ret = cli_usage("up", "%s", sbx_error_last()->msg);
		else
			ret = cli_report(ret);
		goto out;
	}
	if (generated && !o.json)
		fprintf(stderr, "sbx: session %s\n", name);
	if (o.json)
		cli_print_json(status);
	else
		printf("%s\n", sbx_json_str(status, "mountpoint"));
	ret = CLI_EXIT_OK;
out:
	cJSON_Delete(status);
	cJSON_Delete(flags);
	free(name);
	return ret;
}
