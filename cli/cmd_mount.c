/* sbx mount / sbx umount: attach and detach a session's daemon. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "sbx/state.h"
#include "sbx/status.h"
#include "cli_i.h"

int cli_cmd_mount(int argc, char **argv)
{
	static const struct option opts[] = {
		{"foreground", no_argument, NULL, 'f'},
		{"allow-other", no_argument, NULL, 'A'},
		{"no-allow-other", no_argument, NULL, 'N'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	struct sbx_session s;
	const char *dir = NULL;
	int allow_other = -1;
	char *mp = NULL;
	bool fg = false, created;
	int opt, rc, lock = -1, ret = CLI_EXIT_FAIL;

	sbx_session_init(&s);
	while ((opt = getopt_long(argc, argv, "fh", opts, NULL)) != -1) {
		switch (opt) {
		case 'f': fg = true; break;
		case 'A': allow_other = 1; break;
		case 'N': allow_other = 0; break;
		default: return cli_common_opt("mount", opt);
		}
	}
	ret = cli_args_name("mount", argc, argv, 1, 2, "expected NAME [DIR]");
	if (ret != CLI_EXIT_OK)
		return ret;
	if (argc - optind == 2)
		dir = argv[optind + 1];

	rc = cli_session_lock_load(&s, &lock, argv[optind]);
	if (rc < 0)
		goto fail;
	if (sbx_status_mounted(&s)) {
		rc = sbx_error_set(SBX_ERR_STATE, -EBUSY,
				   "session %s is already mounted at %s; run "
				   "`sbx umount %s` first to move it",
				   s.session, s.mountpoint, s.session);
		goto fail;
	}
	if (!dir && !s.mountpoint) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "session %s has no previous mountpoint: "
				   "pass DIR", s.session);
		goto fail;
	}
	/* A live daemon without its mount is wedged; a dead one left junk. */
	rc = cli_daemon_stop(&s, true);
	if (rc < 0)
		goto fail;
	rc = cli_mountpoint_prepare(&mp, &created, dir ? dir : s.mountpoint,
				    s.session);
	if (rc < 0)
		goto fail;
	free(s.mountpoint);
	s.mountpoint = mp;
	if (allow_other >= 0)
		s.allow_other = allow_other;
	sbx_session_set_error(&s, NULL, NULL);
	if (fg) {
		rc = cli_daemon_foreground(&s, &lock);
		if (rc < 0)
			goto fail;
		ret = CLI_EXIT_OK;
		goto out;
	}
	rc = cli_daemon_start(&s, lock);
	if (rc < 0) {
		if (created)
			rmdir(s.mountpoint);
		goto fail;
	}
	rc = sbx_state_save(&s);
	if (rc < 0)
		goto fail;
	printf("%s\n", s.mountpoint);
	ret = CLI_EXIT_OK;
	goto out;
fail:
	ret = cli_report(CLI_EXIT_FAIL);
out:
	sbx_state_unlock(lock);
	sbx_session_fini(&s);
	return ret;
}

int cli_cmd_umount(int argc, char **argv)
{
	static const struct option opts[] = {
		{"force", no_argument, NULL, 'f'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	struct sbx_session s;
	bool force = false;
	int opt, rc, lock = -1, ret = CLI_EXIT_FAIL;

	sbx_session_init(&s);
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'f': force = true; break;
		default: return cli_common_opt("umount", opt);
		}
	}
	ret = cli_args_name("umount", argc, argv, 1, 1,
			    "expected one session NAME");
	if (ret != CLI_EXIT_OK)
		return ret;
	rc = cli_session_lock_load(&s, &lock, argv[optind]);
	if (rc == 0)
		rc = cli_daemon_stop(&s, force);
	if (rc == 0)
		rc = sbx_state_save(&s);
	ret = rc < 0 ? cli_report(CLI_EXIT_FAIL) : CLI_EXIT_OK;
	sbx_state_unlock(lock);
	sbx_session_fini(&s);
	return ret;
}
