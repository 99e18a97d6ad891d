/*
 * sbx serve: the session REST API (docs/api.md) on libmicrohttpd.
 *
 * This file owns the listening socket, the token, the request life cycle
 * (auth, body cap) and the signal loop; serve_routes.c the routes and
 * serve_exec.c the exec stream.  Sockets, the daemon, route matching, body
 * accumulation and the request log are lib/httpd.c's (sbx/httpd.h), shared
 * with sbx-agent.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <microhttpd.h>

#include "sbx/httpd.h"
#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/token.h"
#include "sbx/xmalloc.h"
#include "cli_i.h"
#include "serve_i.h"

/* Bytes of randomness in a generated token (64 hex characters). */
#define TOKEN_BYTES 32

struct listener {
	int fd;
	char *unix_path;  /* removed at exit */
	char *token_path; /* a generated token file, removed at exit */
	struct sbx_httpd_addr addr; /* TCP: the bound address and port */
};

static bool authorized(const struct serve *srv, struct MHD_Connection *conn)
{
	const char *auth, *x;

	if (!srv->token)
		return true;
	x = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Sbx-Token");
	auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
					   MHD_HTTP_HEADER_AUTHORIZATION);
	if (auth && strncasecmp(auth, "Bearer ", 7) == 0 &&
	    sbx_token_equal(srv->token, srv->token_len, auth + 7))
		return true;
	return sbx_token_equal(srv->token, srv->token_len, x);
}

/*
 * On a unix socket, only the server's own user and root may talk to it
 * (SO_PEERCRED): the socket's directory and mode already keep others out,
 * this holds even for a --socket in a shared directory.  *uid_out gets the
 * peer's uid (or -1 when unknown).
 */
static bool peer_allowed(const struct serve *srv, struct MHD_Connection *conn,
			 long *uid_out)
{
	const union MHD_ConnectionInfo *ci;
	struct ucred cr;
	socklen_t len = sizeof(cr);

	*uid_out = -1;
	if (!srv->unix_socket)
		return true;
	ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (!ci || getsockopt(ci->connect_fd, SOL_SOCKET, SO_PEERCRED, &cr,
			      &len) < 0)
		return false;
	*uid_out = (long)cr.uid;
	return cr.uid == 0 || cr.uid == geteuid();
}

/* Headers in: the peer, the token, the body size (`begin`, sbx/httpd.h). */
static int req_begin(void **req_out, void *payload, struct MHD_Connection *conn,
		     const char *method, const char *url)
{
	struct serve *srv = payload;
	struct serve_req *r = sbx_xcalloc(1, sizeof(*r));
	unsigned long long clen;
	long uid;

	*req_out = r;
	r->srv = srv;
	r->conn = conn;
	r->method = method;
	r->url = url;
	sbx_buf_init(&r->body, SERVE_MAX_BODY);
	if (!peer_allowed(srv, conn, &uid))
		return sbx_httpd_answered(serve_reply_errorf(
			r, MHD_HTTP_FORBIDDEN, "AuthError",
			"uid %ld may not use this socket: only uid %ld "
			"(the server's user) and root may",
			uid, (long)geteuid()));
	if (!authorized(srv, conn))
		return sbx_httpd_answered(serve_reply_errorf(
			r, MHD_HTTP_UNAUTHORIZED, "AuthError",
			"missing or wrong token (Authorization: Bearer or "
			"X-Sbx-Token)"));
	if (sbx_httpd_content_length(conn, &clen) && clen > SERVE_MAX_BODY)
		/* Answer before reading the body; MHD closes. */
		return sbx_httpd_answered(serve_reply_errorf(
			r, MHD_HTTP_CONTENT_TOO_LARGE, "ConfigError",
			"request body of %llu bytes exceeds %d", clen,
			SERVE_MAX_BODY));
	return SBX_HTTPD_NEXT;
}

static int req_body(void *req, const char *data, size_t len)
{
	struct serve_req *r = req;

	/* A chunked body over the limit: answer 413 at the end. */
	if (sbx_httpd_body_add(&r->body, &r->body_too_big, data, len) < 0)
		sbx_error_clear();
	return SBX_HTTPD_NEXT;
}

static int req_end(void *req)
{
	struct serve_req *r = req;

	if (r->body_too_big)
		return sbx_httpd_answered(serve_reply_errorf(
			r, MHD_HTTP_CONTENT_TOO_LARGE, "ConfigError",
			"request body exceeds %d bytes", SERVE_MAX_BODY));
	return sbx_httpd_answered(serve_dispatch(r));
}

static unsigned req_done(void *req, enum MHD_RequestTerminationCode toe)
{
	struct serve_req *r = req;
	unsigned status = r->status;

	sbx_buf_fini(&r->body);
	free(r);
	return status;
}

/*
 * TCP without --token-file: a new random token each start, written (0600)
 * to $SBX_HOME/run/serve-HOST-PORT.token, whose path is printed.  Anyone
 * who can read that file is the server's user (or root) already.
 */
static int make_token(struct serve *srv, struct listener *l)
{
	char tok[2 * TOKEN_BYTES + 2], *dir = NULL, *text = NULL;
	int rc;

	rc = sbx_token_random(tok, TOKEN_BYTES);
	if (rc < 0)
		return rc;
	rc = sbx_paths_subdir(&dir, "run");
	if (rc < 0)
		goto out;
	for (char *p = l->addr.host; *p; p++)
		if (*p == ':')
			*p = '_'; /* ::1 */
	l->token_path = sbx_xasprintf("%s/serve-%s-%u.token", dir,
				      l->addr.host, l->addr.port);
	text = sbx_xasprintf("%s\n", tok);
	rc = sbx_file_write_atomic(l->token_path, text, strlen(text), 0600);
	if (rc < 0) {
		rc = sbx_error_prefix(rc, "token file");
		free(l->token_path);
		l->token_path = NULL;
		goto out;
	}
	srv->token = sbx_xstrdup(tok);
	srv->token_len = strlen(tok);
	printf("token-file %s\n", l->token_path);
out:
	explicit_bzero(tok, sizeof(tok));
	if (text)
		explicit_bzero(text, strlen(text));
	free(text);
	free(dir);
	return rc;
}

/*
 * The directory of the default socket must be its owner's alone: the
 * socket's mode is not honoured everywhere, a 0700 directory is.
 */
static int private_dir(const char *dir)
{
	struct stat st;
	int rc = sbx_paths_mkdir_p(dir, 0700);

	if (rc < 0)
		return rc;
	if (lstat(dir, &st) < 0)
		return sbx_error_os("%s", dir);
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
	    (st.st_mode & 077))
		return sbx_error_set(SBX_ERR_CONFIG, -EPERM,
				     "%s must be a directory of uid %ld with "
				     "no access for others (chmod 700 %s), "
				     "or give --socket PATH",
				     dir, (long)geteuid(), dir);
	return 0;
}

/*
 * The default socket: $SBX_HOME/run/serve.sock when SBX_HOME is set (one
 * server per state directory, as the sessions are), else
 * $XDG_RUNTIME_DIR/sbx/serve.sock, else the default $SBX_HOME's run/.
 */
static int default_socket(char **out)
{
	const char *home = getenv("SBX_HOME"), *rt = getenv("XDG_RUNTIME_DIR");
	char *dir = NULL;
	int rc;

	*out = NULL;
	if ((!home || !*home) && rt && rt[0] == '/') {
		dir = sbx_xasprintf("%s/sbx", rt);
	} else {
		rc = sbx_paths_subdir(&dir, "run");
		if (rc < 0)
			return rc;
	}
	rc = private_dir(dir);
	if (rc == 0)
		*out = sbx_xasprintf("%s/serve.sock", dir);
	free(dir);
	return rc;
}

int cli_cmd_serve(int argc, char **argv)
{
	static const struct option opts[] = {
		{"listen", required_argument, NULL, 'l'},
		{"socket", required_argument, NULL, 's'},
		{"token-file", required_argument, NULL, 't'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	const char *listen_spec = NULL, *socket_path = NULL,
		   *token_file = NULL;
	char *dflt_socket = NULL;
	struct listener l = {.fd = -1};
	struct sbx_httpd *d = NULL;
	struct serve srv;
	sigset_t set;
	int opt, rc, ret = CLI_EXIT_FAIL;

	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'l': listen_spec = optarg; break;
		case 's': socket_path = optarg; break;
		case 't': token_file = optarg; break;
		default: return cli_common_opt("serve", opt);
		}
	}
	if (optind < argc)
		return cli_usage("serve", "unexpected argument '%s'",
				 argv[optind]);
	if (listen_spec && socket_path)
		return cli_usage("serve", "give --listen or --socket, not "
				 "both");
	if (listen_spec && strncmp(listen_spec, "unix:", 5) == 0)
		socket_path = listen_spec + 5;

	/* Before "listening on" is printed.  The session daemons forked by
	 * `up` unblock the signals again (daemon.c). */
	sbx_httpd_block_signals(&set);

	serve_init(&srv);
	if (token_file) {
		rc = sbx_token_file_read(&srv.token, token_file);
		if (rc < 0) {
			ret = cli_report(CLI_EXIT_CONFIG);
			goto out;
		}
		srv.token_len = strlen(srv.token);
	}
	if (!listen_spec && !socket_path) {
		rc = default_socket(&dflt_socket);
		if (rc < 0) {
			ret = cli_report(CLI_EXIT_CONFIG);
			goto out;
		}
		socket_path = dflt_socket;
	}
	if (socket_path) {
		srv.unix_socket = true;
		rc = sbx_httpd_listen_unix(&l.fd, socket_path,
					   SBX_HTTPD_LISTEN_PRIVATE);
		if (rc == 0)
			l.unix_path = sbx_xstrdup(socket_path);
	} else {
		rc = sbx_httpd_listen_tcp(
			&l.fd, &l.addr, listen_spec,
			SBX_HTTPD_LISTEN_NUMERIC |
				(srv.token ? 0 : SBX_HTTPD_LISTEN_LOOPBACK));
		/* TCP reaches every local user: never without a token. */
		if (rc == 0 && !srv.token)
			rc = make_token(&srv, &l);
	}
	if (rc < 0) {
		ret = cli_report(CLI_EXIT_CONFIG);
		goto out;
	}
	fflush(stdout);

	if (sbx_httpd_start(&d, &(const struct sbx_httpd_opts){
			.listen_fd = l.fd,
			.conn_timeout_s = 600,
			.begin = req_begin,
			.body = req_body,
			.end = req_end,
			.done = req_done,
			.payload = &srv,
		}) < 0) {
		ret = cli_report(CLI_EXIT_FAIL);
		goto out;
	}
	sbx_info("serving the session API on %s%s", socket_path ? "unix:" : "",
		 socket_path ? socket_path : listen_spec);
	sbx_httpd_wait_signal(&set);
	atomic_store(&srv.stopping, true);
	serve_wake(&srv);
	/* Lets running lifecycle operations finish first. */
	pthread_mutex_lock(&srv.ops_lock);
	pthread_mutex_unlock(&srv.ops_lock);
	sbx_httpd_stop(d);
	l.fd = -1; /* closed by MHD */
	ret = CLI_EXIT_OK;
out:
	if (l.fd >= 0)
		close(l.fd);
	if (l.unix_path)
		unlink(l.unix_path);
	free(l.unix_path);
	if (l.token_path)
		unlink(l.token_path);
	free(l.token_path);
	free(dflt_socket);
	serve_fini(&srv);
	return ret;
}
