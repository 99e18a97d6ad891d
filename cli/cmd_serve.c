/*
 * sbx serve: the session REST API (docs/api.md) on libmicrohttpd.
 *
 * This file owns the listening socket, the token, the request life cycle
 * (auth, body cap) and the signal loop; serve_routes.c the routes.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <microhttpd.h>

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
	char host[INET6_ADDRSTRLEN]; /* TCP: the bound address and port */
	unsigned port;
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

static bool content_length(struct MHD_Connection *conn, unsigned long long *out)
{
	const char *v = MHD_lookup_connection_value(
		conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
	char *end;

	if (!v)
		return false;
	errno = 0;
	*out = strtoull(v, &end, 10);
	return !errno && end != v;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
				  const char *url, const char *method,
				  const char *version, const char *upload,
				  size_t *upload_size, void **con_cls)
{
	struct serve *srv = cls;
	struct serve_req *r = *con_cls;
	unsigned long long clen;
	long uid;

	if (!r) {
		r = sbx_xcalloc(1, sizeof(*r));
		r->srv = srv;
		r->conn = conn;
		r->method = method;
		r->url = sbx_xstrdup(url);
		sbx_buf_init(&r->body, SERVE_MAX_BODY);
		*con_cls = r;
		sbx_error_clear();
		if (!peer_allowed(srv, conn, &uid))
			return (enum MHD_Result)serve_reply_errorf(
				r, MHD_HTTP_FORBIDDEN, "AuthError",
				"uid %ld may not use this socket: only uid %ld "
				"(the server's user) and root may",
				uid, (long)geteuid());
		if (!authorized(srv, conn))
			return (enum MHD_Result)serve_reply_errorf(
				r, MHD_HTTP_UNAUTHORIZED, "AuthError",
				"missing or wrong token (Authorization: "
				"Bearer or X-Sbx-Token)");
		if (content_length(conn, &clen) && clen > SERVE_MAX_BODY)
			/* Answer before reading the body; MHD closes. */
			return (enum MHD_Result)serve_reply_errorf(
				r, MHD_HTTP_CONTENT_TOO_LARGE, "ConfigError",
				"request body of %llu bytes exceeds %d", clen,
				SERVE_MAX_BODY);
		return MHD_YES;
	}
	if (r->answered) {
		*upload_size = 0;
		return MHD_YES;
	}
	if (*upload_size) {
		if (!r->body_too_big &&
		    sbx_buf_add(&r->body, upload, *upload_size) < 0) {
			/* Chunked body over the limit: answer 413 at the end. */
			sbx_error_clear();
			r->body_too_big = true;
			sbx_buf_fini(&r->body);
		}
		*upload_size = 0;
		return MHD_YES;
	}
	if (r->body_too_big)
		return (enum MHD_Result)serve_reply_errorf(
			r, MHD_HTTP_CONTENT_TOO_LARGE, "ConfigError",
			"request body exceeds %d bytes", SERVE_MAX_BODY);
	return (enum MHD_Result)serve_dispatch(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn,
			 void **con_cls, enum MHD_RequestTerminationCode toe)
{
	struct serve_req *r = *con_cls;

	if (!r)
		return;
	sbx_debug("%s %s -> %u%s", r->method, r->url, r->status,
		  toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? ""
							     : " (aborted)");
	sbx_buf_fini(&r->body);
	free(r->url);
	free(r);
	*con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) SBX_PRINTF(2, 0);

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[512];
	size_t n;

	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n && msg[n - 1] == '\n')
		msg[--n] = '\0';
	sbx_debug("libmicrohttpd: %s", msg);
}

static int read_token(struct serve *srv, const char *file)
{
	int rc = sbx_token_file_read(&srv->token, file);

	if (rc < 0)
		return rc;
	srv->token_len = strlen(srv->token);
	return 0;
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
	for (char *p = l->host; *p; p++)
		if (*p == ':')
			*p = '_'; /* ::1 */
	l->token_path = sbx_xasprintf("%s/serve-%s-%u.token", dir, l->host,
				      l->port);
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

static int listen_unix(struct listener *l, const char *path)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	struct stat st;
	int fd;

	if (!*path || strlen(path) >= sizeof(sun.sun_path))
		return sbx_error_set(SBX_ERR_CONFIG, -ENAMETOOLONG,
				     "bad unix socket path (empty, or %zu "
				     "bytes or more): '%s'; give a shorter "
				     "--socket PATH",
				     sizeof(sun.sun_path), path);
	memcpy(sun.sun_path, path, strlen(path) + 1);
	/* A stale socket from a previous run; never remove anything else. */
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return sbx_error_os("socket");
	/* The socket file's mode is the access control: owner only. */
	{
		mode_t old = umask(077);
		int b = bind(fd, (struct sockaddr *)&sun, sizeof(sun));

		umask(old);
		if (b < 0 || listen(fd, 128) < 0) {
			int rc = sbx_error_os("listen on unix:%s", path);

			close(fd);
			return rc;
		}
	}
	l->fd = fd;
	l->unix_path = sbx_xstrdup(path);
	printf("listening on unix:%s\n", path);
	return 0;
}

static bool is_loopback(const struct sockaddr_storage *ss)
{
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)ss;

		return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
	}
	if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)ss;

		return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
	}
	return false;
}

static int listen_tcp(struct listener *l, const char *spec, bool have_token)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_NUMERICHOST |
					     AI_NUMERICSERV};
	struct addrinfo *res = NULL;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	const char *colon = strrchr(spec, ':');
	char *host = NULL, addr[INET6_ADDRSTRLEN];
	int rc, fd = -1, one = 1;

	if (!colon || colon == spec || !colon[1])
		goto bad;
	if (spec[0] == '[') {
		/* [::1]:PORT */
		if (colon - spec < 3 || colon[-1] != ']')
			goto bad;
		host = sbx_xstrndup(spec + 1, (size_t)(colon - spec - 2));
	} else {
		host = sbx_xstrndup(spec, (size_t)(colon - spec));
	}
	if (strcmp(host, "localhost") == 0) {
		free(host);
		host = sbx_xstrdup("127.0.0.1");
	}
	if (getaddrinfo(host, colon + 1, &hints, &res) != 0 || !res)
		goto bad;
	memcpy(&ss, res->ai_addr, res->ai_addrlen);
	if (!is_loopback(&ss) && !have_token) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EPERM,
				   "--listen %s is not a loopback address: "
				   "give --token-file too",
				   spec);
		goto out;
	}
	fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = sbx_error_os("socket");
		goto out;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, res->ai_addr, res->ai_addrlen) < 0 ||
	    listen(fd, 128) < 0 ||
	    getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
		rc = sbx_error_os("listen on %s", spec);
		close(fd);
		goto out;
	}
	if (ss.ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)&ss;

		inet_ntop(AF_INET6, &in6->sin6_addr, addr, sizeof(addr));
		l->port = ntohs(in6->sin6_port);
		printf("listening on [%s]:%u\n", addr, l->port);
	} else {
		const struct sockaddr_in *in = (const void *)&ss;

		inet_ntop(AF_INET, &in->sin_addr, addr, sizeof(addr));
		l->port = ntohs(in->sin_port);
		printf("listening on %s:%u\n", addr, l->port);
	}
	memcpy(l->host, addr, sizeof(l->host));
	l->fd = fd;
	rc = 0;
out:
	if (res)
		freeaddrinfo(res);
	free(host);
	return rc;
bad:
	free(host);
	if (res)
		freeaddrinfo(res);
	return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
			     "--listen %s: expected IP:PORT or unix:PATH",
			     spec);
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
	struct MHD_Daemon *d = NULL;
	struct serve srv;
	sigset_t set;
	int opt, rc, sig, ret = CLI_EXIT_FAIL;

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

	/*
	 * SIGPIPE ignored (gone clients); SIGINT/TERM/HUP blocked in every
	 * thread (MHD's inherit the mask) and taken by sigwait() below.  The
	 * session daemons forked by `up` unblock them again (daemon.c).
	 * Blocked before "listening on" is printed, so a script that stops
	 * the server as soon as it reads that line gets a clean exit.
	 */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);

	serve_init(&srv);
	if (token_file) {
		rc = read_token(&srv, token_file);
		if (rc < 0) {
			ret = cli_report(CLI_EXIT_CONFIG);
			goto out;
		}
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
		rc = listen_unix(&l, socket_path);
	} else {
		rc = listen_tcp(&l, listen_spec, srv.token != NULL);
		/* TCP reaches every local user: never without a token. */
		if (rc == 0 && !srv.token)
			rc = make_token(&srv, &l);
	}
	if (rc < 0) {
		ret = cli_report(CLI_EXIT_CONFIG);
		goto out;
	}
	fflush(stdout);

	d = MHD_start_daemon(
		MHD_USE_INTERNAL_POLLING_THREAD |
			MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG,
		0, NULL, NULL, on_request, &srv, MHD_OPTION_LISTEN_SOCKET,
		l.fd, MHD_OPTION_NOTIFY_COMPLETED, on_completed, &srv,
		MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
		MHD_OPTION_END);
	if (!d) {
		sbx_error_set(SBX_ERR_OS, -EIO, "cannot start libmicrohttpd");
		ret = cli_report(CLI_EXIT_FAIL);
		goto out;
	}
	sbx_info("serving the session API on %s%s", socket_path ? "unix:" : "",
		 socket_path ? socket_path : listen_spec);
	do {
		if (sigwait(&set, &sig) != 0)
			break;
	} while (sig != SIGINT && sig != SIGTERM && sig != SIGHUP);
	atomic_store(&srv.stopping, true);
	serve_wake(&srv);
	/* Lets running lifecycle operations finish first. */
	pthread_mutex_lock(&srv.ops_lock);
	pthread_mutex_unlock(&srv.ops_lock);
	MHD_stop_daemon(d);
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
