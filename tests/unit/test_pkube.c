/*
 * Unit tests: the pure parts of the kubernetes provider
 * (providers/kubernetes/pkube_pod.c, pkube_watch.c, pkube_api.c): names
 * and labels, the pod manifest, the verdict on a pod's status, the agent
 * token in a pod spec, the watch API's JSON-lines parser, and the errors
 * made of API Status objects.  No cluster: JSON fixtures only.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "sbx/error.h"
#include "sbx/json.h"
#include "sbx/xmalloc.h"
#include "../../providers/kubernetes/pkube_i.h"

static cJSON *parse(const char *text)
{
	cJSON *j = cJSON_Parse(text);

	assert_non_null(j);
	return j;
}

/* A configuration with the defaults of the "kubernetes" section. */
static void cfg_default(struct kcfg *c, cJSON **sec, const char *text)
{
	*sec = parse(text);
	assert_int_equal(pkube_cfg_parse(c, *sec), 0);
}

/* ---- names ----------------------------------------------------------------- */

static void test_label_value(void **state)
{
	char out[64];

	pkube_label_value(out, sizeof(out), "feature/x y");
	assert_string_equal(out, "feature-x-y");
	pkube_label_value(out, sizeof(out), "-lead-and-trail-");
	assert_string_equal(out, "xlead-and-trail");
	pkube_label_value(out, sizeof(out),
			  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
			  "aaaaaaaaaaaaaaaaaaaa");
	assert_int_equal(strlen(out), 63);
	pkube_label_value(out, 8, "abcdefghij");
	assert_string_equal(out, "abcdefg");
}

static void test_pod_name(void **state)
{
	char *a = pkube_pod_name("My_Session", "home1");
	char *b = pkube_pod_name("My_Session", "home2");
	char *c = pkube_pod_name("---", "home1");

	/* DNS-1123: lower case, '-' for the rest, a hash per home. */
	assert_memory_equal(a, "sbx-my-session-", 15);
	assert_int_equal(strlen(a), 15 + 8);
	assert_string_not_equal(a, b);
	assert_memory_equal(c, "sbx-", 4);
	assert_int_equal(strlen(c), 4 + 8);
	free(a);
	free(b);
	free(c);
}

/* ---- the manifest ---------------------------------------------------------- */

static const cJSON *path(const cJSON *j, const char *a, const char *b)
{
	return jget(jget(j, a), b);
}

static const cJSON *named(const cJSON *list, const char *name)
{
	const cJSON *it;

	cJSON_ArrayForEach(it, list) {
		const char *n = sbx_json_str(it, "name");

		if (n && !strcmp(n, name))
			return it;
	}
	return NULL;
}

static void test_manifest_defaults(void **state)
{
	struct kcfg c;
	cJSON *sec, *pod;
	const cJSON *spec, *ct, *ic, *env;
	char *text;

	cfg_default(&c, &sec, "{}");
	pod = pkube_pod_manifest(&c, "sbx-s-1", "s", "home", "tok");
	assert_string_equal(sbx_json_str(pod, "kind"), "Pod");
	assert_string_equal(sbx_json_str(jget(pod, "metadata"), "name"),
			    "sbx-s-1");
	assert_string_equal(sbx_json_str(path(pod, "metadata", "labels"),
					 LABEL_SESSION), "s");
	assert_string_equal(sbx_json_str(path(pod, "metadata", "labels"),
					 LABEL_HOME), "home");
	spec = jget(pod, "spec");
	assert_string_equal(sbx_json_str(spec, "restartPolicy"), "Never");
	assert_true(cJSON_IsFalse(jget(spec, "automountServiceAccountToken")));
	assert_int_equal(cJSON_GetArraySize(jget(spec, "volumes")), 2);
	assert_non_null(named(jget(spec, "volumes"), "workspace"));
	assert_null(jget(spec, "nodeSelector"));

	ic = named(jget(spec, "initContainers"), INSTALL_CONTAINER);
	assert_non_null(ic);
	ct = named(jget(spec, "containers"), MAIN_CONTAINER);
	assert_non_null(ct);
	assert_string_equal(sbx_json_str(ct, "workingDir"), "/workspace");
	env = jget(ct, "env");
	assert_int_equal(cJSON_GetArraySize(env), 1);
	assert_string_equal(sbx_json_str(named(env, TOKEN_ENV), "value"),
			    "tok");
	assert_int_equal(
		(int)cJSON_GetNumberValue(jget(named(jget(ct, "ports"),
						     "sbx-agent"),
					       "containerPort")), 7070);
	assert_int_equal((int)cJSON_GetNumberValue(
				 path(jget(ct, "readinessProbe"), "httpGet",
				      "port")), 7070);
	assert_int_equal(cJSON_GetArraySize(jget(ct, "volumeMounts")), 2);
	assert_true(cJSON_IsTrue(jget(named(jget(ct, "volumeMounts"),
					    "sbx-agent"), "readOnly")));
	/* The command listens on the configured port. */
	text = cJSON_PrintUnformatted(jget(ct, "command"));
	assert_non_null(strstr(text, "\"0.0.0.0:7070\""));
	assert_non_null(strstr(text, "\"--token-env\",\"" TOKEN_ENV "\""));
	cJSON_free(text);
	/* The token of the pod is what pkube_pod_token() reads back. */
	{
		char *tok = NULL;

		assert_int_equal(pkube_pod_token(pod, &tok), 0);
		assert_string_equal(tok, "tok");
		free(tok);
	}
	cJSON_Delete(pod);
	cJSON_Delete(sec);
}

static void test_manifest_options(void **state)
{
	struct kcfg c;
	cJSON *sec, *pod;
	const cJSON *spec, *ct, *env;

	cfg_default(&c, &sec,
		    "{\"port\": 8080, \"workdir\": \"/src\", "
		    "\"workdir_volume\": false, \"service_account\": \"sa\", "
		    "\"runtime_class\": \"gvisor\", "
		    "\"node_selector\": {\"pool\": \"sbx\"}, "
		    "\"tolerations\": [{\"key\": \"k\"}], "
		    "\"image_pull_secrets\": [\"reg\"], "
		    "\"resources\": {\"limits\": {\"cpu\": \"1\"}}, "
		    "\"env\": {\"A\": \"1\", \"B\": \"2\"}}");
	pod = pkube_pod_manifest(&c, "p", "s", "h", "t");
	spec = jget(pod, "spec");
	assert_string_equal(sbx_json_str(spec, "serviceAccountName"), "sa");
	assert_null(jget(spec, "automountServiceAccountToken"));
	assert_string_equal(sbx_json_str(spec, "runtimeClassName"), "gvisor");
	assert_string_equal(sbx_json_str(jget(spec, "nodeSelector"), "pool"),
			    "sbx");
	assert_int_equal(cJSON_GetArraySize(jget(spec, "tolerations")), 1);
	assert_non_null(named(jget(spec, "imagePullSecrets"), "reg"));
	assert_int_equal(cJSON_GetArraySize(jget(spec, "volumes")), 1);
	ct = named(jget(spec, "containers"), MAIN_CONTAINER);
	assert_string_equal(sbx_json_str(ct, "workingDir"), "/src");
	assert_non_null(jget(ct, "resources"));
	env = jget(ct, "env");
	assert_int_equal(cJSON_GetArraySize(env), 3);
	/* The token first: configured names cannot shadow it. */
	assert_string_equal(sbx_json_str(cJSON_GetArrayItem(env, 0), "name"),
			    TOKEN_ENV);
	assert_string_equal(sbx_json_str(named(env, "B"), "value"), "2");
	assert_int_equal(cJSON_GetArraySize(jget(ct, "volumeMounts")), 1);
	assert_int_equal((int)cJSON_GetNumberValue(
				 path(jget(ct, "readinessProbe"), "httpGet",
				      "port")), 8080);
	cJSON_Delete(pod);
	cJSON_Delete(sec);
}

static void test_cfg_refused(void **state)
{
	struct kcfg c;
	cJSON *sec = parse("{\"workdir\": \"relative\"}");

	assert_int_equal(pkube_cfg_parse(&c, sec), -EINVAL);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
	cJSON_Delete(sec);
	sec = parse("{\"port\": 0}");
	assert_int_equal(pkube_cfg_parse(&c, sec), -EINVAL);
	cJSON_Delete(sec);
	sbx_error_clear();
}

static void test_pod_token_missing(void **state)
{
	cJSON *pod = parse("{\"metadata\": {\"name\": \"p\"}, \"spec\": "
			   "{\"containers\": [{\"name\": \"other\", \"env\": "
			   "[{\"name\": \"" TOKEN_ENV "\", \"value\": \"x\"}]}"
			   "]}}");
	char *tok = NULL;

	assert_int_equal(pkube_pod_token(pod, &tok), -EINVAL);
	assert_null(tok);
	assert_non_null(strstr(sbx_error_last()->msg, "not made by sbx"));
	sbx_error_clear();
	cJSON_Delete(pod);
}

/* ---- status verdict -------------------------------------------------------- */

static enum pkube_verdict verdict_of(const char *text, char *stage,
				     char *why)
{
	cJSON *pod = parse(text);
	enum pkube_verdict v = pkube_pod_verdict(pod, stage, 256, why, 1024);

	cJSON_Delete(pod);
	return v;
}

static void test_verdict(void **state)
{
	char stage[256], why[1024];

	assert_int_equal(verdict_of("{\"status\": {\"phase\": \"Pending\"}}",
				    stage, why), PKUBE_WAIT);
	assert_string_equal(stage, "pending");
	assert_int_equal(
		verdict_of("{\"spec\": {\"nodeName\": \"n1\"}, \"status\": "
			   "{\"phase\": \"Pending\", \"conditions\": [{\"type\": "
			   "\"PodScheduled\", \"status\": \"True\"}]}}",
			   stage, why), PKUBE_WAIT);
	assert_string_equal(stage, "scheduled on n1");
	assert_int_equal(
		verdict_of("{\"status\": {\"phase\": \"Pending\", "
			   "\"initContainerStatuses\": [{\"name\": \"i\", "
			   "\"state\": {\"waiting\": {\"reason\": "
			   "\"PodInitializing\"}}}]}}", stage, why),
		PKUBE_WAIT);
	assert_string_equal(stage, "installing the agent (PodInitializing)");
	assert_int_equal(
		verdict_of("{\"status\": {\"phase\": \"Running\", "
			   "\"containerStatuses\": [{\"name\": \"sandbox\", "
			   "\"state\": {\"running\": {}}}], \"conditions\": "
			   "[{\"type\": \"Ready\", \"status\": \"False\"}]}}",
			   stage, why), PKUBE_WAIT);
	assert_string_equal(stage, "started, waiting for the agent");
	assert_int_equal(
		verdict_of("{\"status\": {\"phase\": \"Running\", "
			   "\"conditions\": [{\"type\": \"Ready\", \"status\": "
			   "\"True\"}]}}", stage, why), PKUBE_READY);
	assert_string_equal(stage, "ready");
}

static void test_verdict_failed(void **state)
{
	static const struct {
		const char *pod, *reason;
	} reasons[] = {
		{"{\"status\": {\"phase\": \"Failed\", \"containerStatuses\": "
		 "[{\"name\": \"sandbox\", \"state\": {\"terminated\": "
		 "{\"exitCode\": 1, \"reason\": \"Error\"}}}]}}", "Error"},
		{"{\"status\": {\"phase\": \"Failed\", \"reason\": "
		 "\"DeadlineExceeded\"}}", "DeadlineExceeded"},
		{"{\"metadata\": {\"deletionTimestamp\": \"x\"}}",
		 "Terminating"},
		{"{\"status\": {\"conditions\": [{\"type\": "
		 "\"PodScheduled\", \"reason\": \"Unschedulable\"}]}}",
		 "Unschedulable"},
		{"{\"status\": {\"phase\": \"Pending\"}}", "Pending"},
	};
	char stage[256], why[1024];
	cJSON *pod;

	assert_int_equal(
		verdict_of("{\"metadata\": {\"deletionTimestamp\": \"x\"}, "
			   "\"status\": {\"phase\": \"Running\"}}", stage,
			   why), PKUBE_FAILED);
	assert_string_equal(why, "the pod is being deleted");
	assert_int_equal(
		verdict_of("{\"status\": {\"phase\": \"Pending\", "
			   "\"conditions\": [{\"type\": \"PodScheduled\", "
			   "\"status\": \"False\", \"reason\": "
			   "\"Unschedulable\", \"message\": \"0/3 nodes\"}]}}",
			   stage, why), PKUBE_FAILED);
	assert_string_equal(why, "the pod cannot be scheduled "
			    "(Unschedulable): 0/3 nodes");
	assert_int_equal(
		verdict_of("{\"status\": {\"phase\": \"Pending\", "
			   "\"containerStatuses\": [{\"name\": \"sandbox\", "
			   "\"state\": {\"waiting\": {\"reason\": "
			   "\"ImagePullBackOff\", \"message\": \"no such "
			   "image\"}}}]}}", stage, why), PKUBE_FAILED);
	assert_string_equal(why, "container sandbox: ImagePullBackOff: no "
			    "such image");
	/* An init container that exited 0 is done, not failed. */
	assert_int_equal(
		verdict_of("{\"status\": {\"phase\": \"Pending\", "
			   "\"initContainerStatuses\": [{\"name\": \"i\", "
			   "\"state\": {\"terminated\": {\"exitCode\": 0}}}]}}",
			   stage, why), PKUBE_WAIT);
	assert_int_equal(
		verdict_of("{\"status\": {\"phase\": \"Failed\", \"reason\": "
			   "\"Evicted\", \"message\": \"low memory\", "
			   "\"containerStatuses\": [{\"name\": \"sandbox\", "
			   "\"state\": {\"terminated\": {\"exitCode\": 137, "
			   "\"reason\": \"OOMKilled\"}}}]}}", stage, why),
		PKUBE_FAILED);
	assert_string_equal(why, "the pod failed (Evicted): low memory; "
			    "container sandbox exited with status 137 "
			    "(OOMKilled)");

	for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++) {
		pod = parse(reasons[i].pod);
		assert_string_equal(pkube_pod_reason(pod), reasons[i].reason);
		cJSON_Delete(pod);
	}
}

/* ---- the watch parser ------------------------------------------------------ */

static void watch_init(struct pkube_watch *w, bool want_gone)
{
	memset(w, 0, sizeof(*w));
	sbx_buf_init(&w->line, 1u << 20);
	w->pod = "p";
	w->want_gone = want_gone;
}

static int feed(struct pkube_watch *w, const char *s)
{
	return pkube_watch_data(s, strlen(s), w);
}

static void test_watch_lines(void **state)
{
	struct pkube_watch w;
	const char *ready = "{\"type\":\"MODIFIED\",\"object\":{\"metadata\":"
			    "{\"resourceVersion\":\"12\"},\"status\":{\"phase\":"
			    "\"Running\",\"conditions\":[{\"type\":\"Ready\","
			    "\"status\":\"True\"}]}}}\n";

	watch_init(&w, false);
	/* Split anywhere: nothing is decided until a line is complete. */
	assert_int_equal(feed(&w, "{\"type\":\"ADDED\",\"object\":{\"metadata"
			      "\":{\"resourceVersion\":\"11\"},\"status\":"), 0);
	assert_int_equal(feed(&w, "{\"phase\":\"Pending\"}}}\n\n"), 0);
	assert_string_equal(w.rv, "11");
	assert_int_equal(w.v, PKUBE_WAIT);
	assert_int_equal(feed(&w, "{\"type\":\"BOOKMARK\",\"object\":{"
			      "\"metadata\":{\"resourceVersion\":\"20\"}}}\n"),
			 0);
	assert_string_equal(w.rv, "20");
	assert_int_equal(pkube_watch_data(ready, 30, &w), 0);
	assert_int_equal(feed(&w, ready + 30), 1);
	assert_int_equal(w.v, PKUBE_READY);
	assert_string_equal(w.rv, "12");
	sbx_buf_fini(&w.line);

	/* Waiting for deletion: only DELETED decides. */
	watch_init(&w, true);
	assert_int_equal(feed(&w, ready), 0);
	assert_int_equal(feed(&w, "{\"type\":\"DELETED\",\"object\":{}}\n"),
			 1);
	assert_int_equal(w.v, PKUBE_GONE);
	sbx_buf_fini(&w.line);
}

static void test_watch_errors(void **state)
{
	static const struct {
		const char *line;
		int rc;
		long detail;
		bool expired;
	} t[] = {
		/* 410 Gone: the resourceVersion expired; relist, no error. */
		{"{\"type\":\"ERROR\",\"object\":{\"code\":410,"
		 "\"message\":\"too old\"}}\n", 1, 0, true},
		{"{\"type\":\"ERROR\",\"object\":{\"code\":500,"
		 "\"message\":\"boom\"}}\n", -EIO, 500, false},
		{"{\"object\":{}}\n", -EPROTO, 0, false},
		{"not json\n", -EPROTO, 0, false},
	};

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct pkube_watch w;

		sbx_error_clear();
		watch_init(&w, false);
		assert_int_equal(feed(&w, t[i].line), t[i].rc);
		assert_int_equal(w.expired, t[i].expired);
		if (t[i].rc < 0)
			assert_int_equal(sbx_error_last()->detail,
					 t[i].detail);
		sbx_buf_fini(&w.line);
	}
	assert_non_null(strstr(sbx_error_last()->msg, "without a type"));
	sbx_error_clear();
}

/* ---- API Status objects ---------------------------------------------------- */

static void test_status_error(void **state)
{
	struct kube k = {.ns = "ns", .context = "ctx"};
	cJSON *st = parse("{\"kind\":\"Status\",\"message\":\"bad spec\","
			  "\"reason\":\"Invalid\",\"details\":{\"causes\":"
			  "[{\"field\":\"spec.x\",\"message\":\"wrong\"}]}}");

	assert_int_equal(pkube_status_error(&k, 422, st, "pod p"), -EINVAL);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
	assert_int_equal(sbx_error_last()->detail, 422);
	assert_non_null(strstr(sbx_error_last()->msg,
			       "bad spec (spec.x: wrong)"));
	assert_int_equal(pkube_status_error(&k, 403, st, "pod p"), -EACCES);
	assert_non_null(strstr(sbx_error_last()->msg, "rbac.yaml"));
	assert_int_equal(pkube_status_error(&k, 404, st, "pod p"), -ENOENT);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_NOTFOUND);
	assert_int_equal(pkube_status_error(&k, 409, st, "pod p"), -EEXIST);
	assert_int_equal(pkube_status_error(&k, 410, st, "pod p"), -ESTALE);
	assert_int_equal(pkube_status_error(&k, 429, st, "pod p"), -EAGAIN);
	assert_int_equal(pkube_status_error(&k, 503, NULL, "pod p"), -EIO);
	assert_non_null(strstr(sbx_error_last()->msg, "no Status object"));
	assert_int_equal(pkube_status_error(&k, 418, st, "pod p"), -EPROTO);
	sbx_error_clear();
	cJSON_Delete(st);
}

static void test_transient(void **state)
{
	sbx_error_setd(SBX_ERR_HTTP, -ECONNRESET, 56, "reset");
	assert_true(pkube_transient(-ECONNRESET));
	sbx_error_setd(SBX_ERR_REMOTE, -EIO, 503, "unavailable");
	assert_true(pkube_transient(-EIO));
	sbx_error_setd(SBX_ERR_CONFIG, -EACCES, 403, "forbidden");
	assert_false(pkube_transient(-EACCES));
	sbx_error_setd(SBX_ERR_REMOTE, -EPROTO, 418, "teapot");
	assert_false(pkube_transient(-EPROTO));
	sbx_error_clear();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_label_value),
		cmocka_unit_test(test_pod_name),
		cmocka_unit_test(test_manifest_defaults),
		cmocka_unit_test(test_manifest_options),
		cmocka_unit_test(test_cfg_refused),
		cmocka_unit_test(test_pod_token_missing),
		cmocka_unit_test(test_verdict),
		cmocka_unit_test(test_verdict_failed),
		cmocka_unit_test(test_watch_lines),
		cmocka_unit_test(test_watch_errors),
		cmocka_unit_test(test_status_error),
		cmocka_unit_test(test_transient),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
