/* Shared libcurl pieces; see sbx/http.h. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "sbx/http.h"
#include "sbx/xmalloc.h"

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc;

static void global_init(void)
{
	global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

int sbx_http_global_init(void)
{
	pthread_once(&global_once, global_init);
	if (global_rc != CURLE_OK)
		return sbx_error_setd(SBX_ERR_HTTP, -EIO, global_rc,
				      "cannot initialise libcurl: %s",
				      curl_easy_strerror(global_rc));
	return 0;
}

int sbx_errno_from_curl(int code)
{
	switch ((CURLcode)code) {
	case CURLE_OK:
		return 0;
	case CURLE_OPERATION_TIMEDOUT:
		return -ETIMEDOUT;
	case CURLE_COULDNT_CONNECT:
		return -ECONNREFUSED;
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_COULDNT_RESOLVE_PROXY:
		return -EHOSTUNREACH;
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
		return -ECONNRESET;
	case CURLE_ABORTED_BY_CALLBACK:
		return -ECANCELED;
	default:
		return -EIO;
	}
}

const char *sbx_http_user_agent(void)
{
	return "sbx/" SBX_VERSION;
}

void sbx_http_set_body(void *easy, const char *method, const void *body,
		       size_t len)
{
	CURL *e = easy;

	/*
	 * POSTFIELDS makes libcurl send the body whatever the request
	 * method; CUSTOMREQUEST then replaces "POST" on the request line.
	 * (CURLOPT_CUSTOMREQUEST alone sends DELETE without a body.)
	 */
	curl_easy_setopt(e, CURLOPT_POST, 1L);
	curl_easy_setopt(e, CURLOPT_POSTFIELDS, body ? (const char *)body : "");
	curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE,
			 (curl_off_t)(body ? len : 0));
	if (strcmp(method, "POST"))
		curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
}

const char *sbx_http_header_value(const char *line, size_t n,
				  const char *name, size_t *vlen)
{
	size_t l = strlen(name);
	const char *v, *end = line + n;

	if (n <= l || strncasecmp(line, name, l) || line[l] != ':')
		return NULL;
	v = line + l + 1;
	while (v < end && (*v == ' ' || *v == '\t'))
		v++;
	while (end > v && isspace((unsigned char)end[-1]))
		end--;
	*vlen = (size_t)(end - v);
	return v;
}

/* ---- the pool ------------------------------------------------------------- */

struct sbx_http_pool {
	CURLSH *share;
	pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];
	pthread_mutex_t lock;
	CURL **idle;  /* protected by lock */
	size_t nidle, cap;
};

static void share_lock(CURL *e, curl_lock_data data, curl_lock_access a,
		       void *userp)
{
	struct sbx_http_pool *p = userp;

	if (data >= 0 && data < CURL_LOCK_DATA_LAST)
		pthread_mutex_lock(&p->share_locks[data]);
}

static void share_unlock(CURL *e, curl_lock_data data, void *userp)
{
	struct sbx_http_pool *p = userp;

	if (data >= 0 && data < CURL_LOCK_DATA_LAST)
		pthread_mutex_unlock(&p->share_locks[data]);
}

int sbx_http_pool_new(struct sbx_http_pool **out)
{
	struct sbx_http_pool *p;
	int rc;

	*out = NULL;
	rc = sbx_http_global_init();
	if (rc < 0)
		return rc;
	p = sbx_xcalloc(1, sizeof(*p));
	for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
		pthread_mutex_init(&p->share_locks[i], NULL);
	pthread_mutex_init(&p->lock, NULL);
	p->share = curl_share_init();
	if (!p->share)
		abort(); /* out of memory, as sbx_xmalloc */
	curl_share_setopt(p->share, CURLSHOPT_LOCKFUNC, share_lock);
	curl_share_setopt(p->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
	curl_share_setopt(p->share, CURLSHOPT_USERDATA, p);
	curl_share_setopt(p->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
	curl_share_setopt(p->share, CURLSHOPT_SHARE,
			  CURL_LOCK_DATA_SSL_SESSION);
	/* Not CURL_LOCK_DATA_CONNECT: see sbx/http.h. */
	*out = p;
	return 0;
}

void sbx_http_pool_free(struct sbx_http_pool *p)
{
	if (!p)
		return;
	/* Handles first: they hold references into the share. */
	for (size_t i = 0; i < p->nidle; i++)
		curl_easy_cleanup(p->idle[i]);
	free(p->idle);
	if (p->share)
		curl_share_cleanup(p->share);
	for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
		pthread_mutex_destroy(&p->share_locks[i]);
	pthread_mutex_destroy(&p->lock);
	free(p);
}

void *sbx_http_pool_get(struct sbx_http_pool *p)
{
	CURL *e = NULL;

	pthread_mutex_lock(&p->lock);
	if (p->nidle)
		e = p->idle[--p->nidle];
	pthread_mutex_unlock(&p->lock);
	if (!e) {
		e = curl_easy_init();
		if (!e)
			abort(); /* out of memory */
	}
	curl_easy_setopt(e, CURLOPT_SHARE, p->share);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_USERAGENT, sbx_http_user_agent());
	return e;
}

void sbx_http_pool_put(struct sbx_http_pool *p, void *easy)
{
	CURL *e = easy;

	if (!e)
		return;
	/* Options go; the handle's connection cache stays. */
	curl_easy_reset(e);
	pthread_mutex_lock(&p->lock);
	if (p->nidle == p->cap) {
		p->cap = p->cap ? p->cap * 2 : 16;
		p->idle = sbx_xrealloc(p->idle, p->cap * sizeof(*p->idle));
	}
	p->idle[p->nidle++] = e;
	pthread_mutex_unlock(&p->lock);
}
