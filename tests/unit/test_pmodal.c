/*
 * Unit tests: the pure parts of the modal provider (providers/modal/
 * pmodal*.c): the configuration, the sandbox's entrypoint (the request's
 * definition), the tunnel chosen from a SandboxGetTunnels answer, the
 * names of results, the agent's configuration, and what `sbx status`
 * shows of a sandbox (the mapping of results to states).  No Modal: the
 * messages are built here.
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
#include "sbx/provider.h"
#include "sbx/remote.h"
#include "../../providers/modal/pmodal_i.h"

static void cfg(struct mcfg *c, cJSON **sec, const char *text)
{
	*sec = cJSON_Parse(text);
	assert_non_null(*sec);
	assert_int_equal(pmodal_cfg_parse(c, *sec), 0);
}

static void test_cfg(void **state)
{
	struct mcfg c;
	cJSON *sec;

	cfg(&c, &sec, "{}");
	assert_string_equal(c.image, "python:3.11");
	assert_string_equal(c.app, "sbx");
	assert_string_equal(c.workdir, "/workspace");
	assert_int_equal(c.port, 7070);
	assert_int_equal(c.timeout_s, 86400);
	assert_int_equal(c.request_s, 30);
	cJSON_Delete(sec);
	cfg(&c, &sec, "{\"port\": 9000, \"cpu\": 1.5, \"memory\": 2048, "
		      "\"idle_timeout\": 600}");
	assert_int_equal(c.port, 9000);
	assert_int_equal(c.memory_mb, 2048);
	assert_int_equal(c.idle_timeout_s, 600);
	cJSON_Delete(sec);

	sec = cJSON_Parse("{\"workdir\": \"rel\"}");
	assert_int_equal(pmodal_cfg_parse(&c, sec), -EINVAL);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
	cJSON_Delete(sec);
	sec = cJSON_Parse("{\"timeout\": 10}");
	assert_int_equal(pmodal_cfg_parse(&c, sec), -EINVAL);
	cJSON_Delete(sec);
	sbx_error_clear();
}

static void test_entrypoint(void **state)
{
	struct mcfg c;
	cJSON *sec;
	char **args;
	size_t n;

	cfg(&c, &sec, "{\"port\": 8000, \"workdir\": \"/src\", "
		      "\"env\": {\"A\": \"1\", \"B\": \"x y\"}}");
	args = pmodal_entrypoint_args(&c, "secret", &n);
	/* env A=1 B=x y TOKEN=secret, then the bundle's loader. */
	assert_int_equal(n, 4 + 11);
	assert_null(args[n]);
	assert_string_equal(args[0], "env");
	assert_string_equal(args[1], "A=1");
	assert_string_equal(args[2], "B=x y");
	assert_string_equal(args[3], TOKEN_ENV "=secret");
	assert_string_equal(args[4], AGENT_DIR "/lib/ld.so");
	assert_string_equal(args[7], AGENT_DIR "/bin/sbx-agent");
	assert_string_equal(args[8], "serve");
	assert_string_equal(args[10], "/src");
	assert_string_equal(args[12], "0.0.0.0:8000");
	assert_string_equal(args[14], TOKEN_ENV);
	pmodal_args_free(args);
	cJSON_Delete(sec);

	cfg(&c, &sec, "{}");
	args = pmodal_entrypoint_args(&c, "t", &n);
	assert_int_equal(n, 2 + 11);
	assert_string_equal(args[1], TOKEN_ENV "=t");
	pmodal_args_free(args);
	pmodal_args_free(NULL);
	cJSON_Delete(sec);
}

static void test_tunnel_url(void **state)
{
	Modal__Client__SandboxGetTunnelsResponse r =
		MODAL__CLIENT__SANDBOX_GET_TUNNELS_RESPONSE__INIT;
	Modal__Client__TunnelData t[2] = {
		MODAL__CLIENT__TUNNEL_DATA__INIT,
		MODAL__CLIENT__TUNNEL_DATA__INIT,
	};
	Modal__Client__TunnelData *tv[2] = {&t[0], &t[1]};
	char *url;

	assert_null(pmodal_tunnel_url(&r, 7070));
	assert_null(pmodal_tunnel_url(NULL, 7070));
	t[0].host = "a.modal.host";
	t[0].port = 443;
	t[0].container_port = 8080;
	t[1].host = "b.modal.host";
	t[1].port = 30443;
	t[1].container_port = 7070;
	r.n_tunnels = 2;
	r.tunnels = tv;
	url = pmodal_tunnel_url(&r, 7070);
	assert_string_equal(url, "https://b.modal.host:30443");
	free(url);
	url = pmodal_tunnel_url(&r, 8080);
	assert_string_equal(url, "https://a.modal.host:443");
	free(url);
	assert_null(pmodal_tunnel_url(&r, 9));
}

static void test_result_names(void **state)
{
	GResult r = MODAL__CLIENT__GENERIC_RESULT__INIT;

	assert_string_equal(pmodal_result_name(NULL), "unknown");
	r.status = MODAL__CLIENT__GENERIC_RESULT__GENERIC_STATUS__GENERIC_STATUS_SUCCESS;
	assert_string_equal(pmodal_result_name(&r), "success");
	r.status = MODAL__CLIENT__GENERIC_RESULT__GENERIC_STATUS__GENERIC_STATUS_TERMINATED;
	assert_string_equal(pmodal_result_name(&r), "terminated");
	r.status = MODAL__CLIENT__GENERIC_RESULT__GENERIC_STATUS__GENERIC_STATUS_TIMEOUT;
	assert_string_equal(pmodal_result_name(&r), "timeout");
	r.status = 8;
	assert_string_equal(pmodal_result_name(&r), "evicted (memory)");
	r.status = 99;
	assert_string_equal(pmodal_result_name(&r), "unknown");
}

static void test_agent_cfg(void **state)
{
	struct premote_config pc;
	struct mcfg c;
	cJSON *sec;

	cfg(&c, &sec, "{\"request_timeout\": 12, \"ca_file\": \"/ca.pem\"}");
	pmodal_agent_cfg(&pc, &c, "https://t.modal.host:443", "tok");
	assert_string_equal(pc.url, "https://t.modal.host:443");
	assert_string_equal(pc.token, "tok");
	assert_string_equal(pc.ca_file, "/ca.pem");
	assert_int_equal(pc.timeout_ms, 12000);
	assert_int_equal(pc.connect_timeout_ms,
			 PREMOTE_DEFAULT_CONNECT_TIMEOUT_S * 1000L);
	assert_true(pc.container_env);
	assert_non_null(strstr(pc.peer, "Modal's tunnel at "
				       "https://t.modal.host:443"));
	premote_config_fini(&pc);
	assert_null(pc.url);
	cJSON_Delete(sec);
}

static void test_fill_info(void **state)
{
	struct sbx_sandbox_info info;
	GResult r = MODAL__CLIENT__GENERIC_RESULT__INIT;
	struct mcfg c;
	cJSON *sec;

	cfg(&c, &sec, "{\"app\": \"myapp\"}");
	pmodal_fill_info(&info, "s", &c, "sb-1", NULL, "main", false);
	assert_string_equal(info.provider, "modal");
	assert_string_equal(info.sandbox_id, "sb-1");
	assert_string_equal(info.workdir, "/workspace");
	assert_true(info.remote);
	assert_int_equal(info.state, SBX_STATE_READY);
	assert_string_equal(sbx_json_str(info.extra, "app"), "myapp");
	assert_string_equal(sbx_json_str(info.extra, "environment"), "main");
	sbx_sandbox_info_fini(&info);

	r.status = MODAL__CLIENT__GENERIC_RESULT__GENERIC_STATUS__GENERIC_STATUS_FAILURE;
	r.exception = "boom";
	pmodal_fill_info(&info, "s", &c, "sb-1", &r, "main", false);
	assert_int_equal(info.state, SBX_STATE_ERROR);
	assert_string_equal(sbx_json_str(info.extra, "error_reason"),
			    "failure");
	assert_string_equal(sbx_json_str(info.extra, "error"),
			    "the Modal sandbox ended (failure: boom)");
	assert_true(cJSON_IsFalse(cJSON_GetObjectItem(info.extra, "gone")));
	sbx_sandbox_info_fini(&info);

	pmodal_fill_info(&info, "s", &c, "sb-1", &r, "main", true);
	assert_string_equal(sbx_json_str(info.extra, "error_reason"),
			    "NotFound");
	assert_true(cJSON_IsTrue(cJSON_GetObjectItem(info.extra, "gone")));
	sbx_sandbox_info_fini(&info);
	cJSON_Delete(sec);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cfg),
		cmocka_unit_test(test_entrypoint),
		cmocka_unit_test(test_tunnel_url),
		cmocka_unit_test(test_result_names),
		cmocka_unit_test(test_agent_cfg),
		cmocka_unit_test(test_fill_info),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
