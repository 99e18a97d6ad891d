/* Unit tests: lib/config.c (layer order, opencode section, validation). */
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

#include "sbx/config.h"
#include "sbx/json.h"
#include "sbx/paths.h"
#include "test_helpers_i.h"

struct fx {
	char *tmp;
	char repo[2048];
	char user[4096];
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	char p[2048];

	f->tmp = th_tmpdir();
	snprintf(f->repo, sizeof(f->repo), "%s/repo", f->tmp);
	snprintf(p, sizeof(p), "%s/repo/.git", f->tmp);
	if (sbx_paths_mkdir_p(p, 0755) < 0)
		return -1;
	snprintf(p, sizeof(p), "%s/xdg/sbx", f->tmp);
	if (sbx_paths_mkdir_p(p, 0755) < 0)
		return -1;
	snprintf(f->user, sizeof(f->user), "%s/config.json", p);
	snprintf(p, sizeof(p), "%s/xdg", f->tmp);
	setenv("XDG_CONFIG_HOME", p, 1);
	unsetenv("SBX_CONFIG");
	unsetenv("SBX_MOUNT_ROOT");
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;

	th_rmrf(f->tmp);
	free(f->tmp);
	free(f);
	unsetenv("XDG_CONFIG_HOME");
	unsetenv("SBX_CONFIG");
	unsetenv("SBX_MOUNT_ROOT");
	return 0;
}

static void test_defaults(void **state)
{
	struct fx *f = *state;
	struct sbx_config_opts o = {.repo = f->repo};
	cJSON *cfg = NULL;
	char *root = NULL;

	assert_int_equal(sbx_config_load(&cfg, &o), 0);
	assert_string_equal(sbx_config_provider(cfg), "local");
	assert_string_equal(
		sbx_json_str(sbx_config_section(cfg, "local"), "isolation"),
		"none");
	assert_false(sbx_config_allow_other(cfg));
	setenv("HOME", "/home/u", 1);
	assert_int_equal(sbx_config_mount_root(&root, cfg), 0);
	assert_string_equal(root, "/home/u/sbx");
	free(root);
	setenv("SBX_MOUNT_ROOT", "/mnt/s", 1);
	assert_int_equal(sbx_config_mount_root(&root, cfg), 0);
	assert_string_equal(root, "/mnt/s");
	free(root);
	cJSON_Delete(cfg);
}

/* Each layer overrides the one below; objects merge key by key. */
static void test_merge_order(void **state)
{
	struct fx *f = *state;
	char p[4096], q[4096];
	struct sbx_config_opts o = {.repo = f->repo};
	cJSON *cfg = NULL, *flags;
	const cJSON *modal;

	th_write(f->user, "{\"mount_root\": \"/u\", \"provider\": \"modal\","
			  " \"modal\": {\"image\": \"user\", \"cpu\": 1}}");
	snprintf(p, sizeof(p), "%s/opencode.jsonc", f->repo);
	th_write(p, "{\n  // opencode config\n  \"model\": \"x\",\n"
		    "  \"sandbox\": {\"provider\": \"kubernetes\",\n"
		    "    \"modal\": {\"image\": \"repo\",},},\n}\n");
	snprintf(p, sizeof(p), "%s/env.json", f->tmp);
	th_write(p, "{\"mount_root\": \"/env\"}");
	setenv("SBX_CONFIG", p, 1);
	snprintf(q, sizeof(q), "%s/cli.json", f->tmp);
	th_write(q, "{\"provider\": \"remote\"}");
	o.config_file = q;

	assert_int_equal(sbx_config_load(&cfg, &o), 0);
	assert_string_equal(sbx_config_provider(cfg), "remote");
	assert_string_equal(sbx_json_str(cfg, "mount_root"), "/env");
	modal = sbx_config_section(cfg, "modal");
	assert_string_equal(sbx_json_str(modal, "image"), "repo");
	assert_int_equal(cJSON_GetObjectItem(modal, "cpu")->valueint, 1);
	/* Keys outside "sandbox" of opencode.json are not ours. */
	assert_null(cJSON_GetObjectItem(cfg, "model"));
	cJSON_Delete(cfg);

	/* Command-line flags win over everything. */
	flags = cJSON_Parse("{\"provider\": \"local\", "
			    "\"local\": {\"isolation\": \"bwrap\"}}");
	o.flags = flags;
	assert_int_equal(sbx_config_load(&cfg, &o), 0);
	assert_string_equal(sbx_config_provider(cfg), "local");
	assert_string_equal(
		sbx_json_str(sbx_config_section(cfg, "local"), "isolation"),
		"bwrap");
	assert_true(sbx_json_bool(sbx_config_section(cfg, "local"), "network",
				  false));
	cJSON_Delete(cfg);
	cJSON_Delete(flags);
}

static void expect_fail(struct sbx_config_opts *o, const char *needle)
{
	cJSON *cfg = (cJSON *)1;

	assert_int_not_equal(sbx_config_load(&cfg, o), 0);
	assert_null(cfg);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
	if (!strstr(sbx_error_last()->msg, needle))
		fail_msg("'%s' does not contain '%s'", sbx_error_last()->msg,
			 needle);
}

static void test_bad_values(void **state)
{
	struct fx *f = *state;
	struct sbx_config_opts o = {.repo = f->repo};
	char p[4096], want[4200];

	th_write(f->user, "{\"provider\": \"nope\"}");
	snprintf(want, sizeof(want), "%s: \"provider\": unknown provider "
				     "'nope'", f->user);
	expect_fail(&o, want);

	th_write(f->user, "{\"local\": {\"network\": \"yes\"}}");
	expect_fail(&o, "local: \"network\" must be true or false, not "
			"string");
	th_write(f->user, "{\"local\": {\"isolation\": \"docker\"}}");
	expect_fail(&o, "\"isolation\" must be \"none\" or \"bwrap\"");
	th_write(f->user, "{\"mount\": {\"allow_other\": 1}}");
	expect_fail(&o, "mount: \"allow_other\" must be true or false");
	th_write(f->user, "{\"mount\": true}");
	expect_fail(&o, "\"mount\" must be an object");
	th_write(f->user, "{\"modal\": []}");
	expect_fail(&o, "\"modal\" must be an object, not array");
	th_write(f->user, "[1]");
	expect_fail(&o, "must be a JSON object");
	th_write(f->user, "{\n\"provider\": \"local\"\n\"x\": 1}");
	snprintf(want, sizeof(want), "%s:3:", f->user);
	expect_fail(&o, want);
	th_write(f->user, "{}");

	snprintf(p, sizeof(p), "%s/opencode.json", f->repo);
	th_write(p, "{\"sandbox\": {\"provider\": 3}}");
	expect_fail(&o, "opencode.json: \"sandbox\": \"provider\" must be a "
			"string");
	th_write(p, "{\"sandbox\": null}");

	snprintf(p, sizeof(p), "%s/missing.json", f->tmp);
	o.config_file = p;
	expect_fail(&o, "does not exist");
	o.config_file = NULL;
	setenv("SBX_CONFIG", p, 1);
	expect_fail(&o, "$SBX_CONFIG");
	unsetenv("SBX_CONFIG");
}

/* Outside any repository there is no opencode layer, and no error. */
static void test_no_repo(void **state)
{
	struct fx *f = *state;
	struct sbx_config_opts o = {.repo = f->tmp, .skip_user = true};
	cJSON *cfg = NULL;

	th_write(f->user, "{\"provider\": \"nope\"}"); /* skipped */
	assert_int_equal(sbx_config_load(&cfg, &o), 0);
	assert_string_equal(sbx_config_provider(cfg), "local");
	cJSON_Delete(cfg);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TH_TEST(test_defaults),
		TH_TEST(test_merge_order),
		TH_TEST(test_bad_values),
		TH_TEST(test_no_repo),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
