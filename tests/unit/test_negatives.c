/*
 * Unit tests: fs/negatives.c, the list of negative entries the kernel was
 * given with the long timeout (dropped when events are lost).  What an
 * overflow does with the list (fs_negatives_invalidate) needs a FUSE
 * session: test_remote.py::test_name_made_while_events_were_lost.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../fs/fs_i.h"

static int setup(void **state)
{
	struct fs *fs = calloc(1, sizeof(*fs));

	if (!fs)
		return -1;
	fs_negatives_init(fs);
	*state = fs;
	return 0;
}

static int teardown(void **state)
{
	struct fs *fs = *state;

	fs_negatives_fini(fs); /* frees what is listed (ASan: no leak) */
	free(fs);
	return 0;
}

static void test_listed_once_until_dropped(void **state)
{
	struct fs *fs = *state;

	assert_true(fs_negative_timeout(fs, 7, "a") == FS_TIMEOUT_WATCHED);
	assert_true(fs_negative_timeout(fs, 7, "a") == FS_TIMEOUT_WATCHED);
	assert_true(fs_negative_timeout(fs, 8, "a") == FS_TIMEOUT_WATCHED);
	assert_int_equal(sbx_hashmap_count(&fs->negatives), 2);
	fs_negative_drop(fs, 7, "a");
	fs_negative_drop(fs, 7, "a"); /* not listed: nothing */
	fs_negative_drop(fs, 7, "b");
	assert_int_equal(sbx_hashmap_count(&fs->negatives), 1);
}

/* Past FS_NEGATIVES_MAX live entries, a new name gets the short timeout
 * (it is not listed, so an overflow could not drop it); a listed one
 * keeps the long one, and a drop makes room. */
static void test_full_list_gives_the_short_timeout(void **state)
{
	struct fs *fs = *state;
	char name[32];

	for (int i = 0; i < FS_NEGATIVES_MAX; i++) {
		snprintf(name, sizeof(name), "n%d", i);
		assert_true(fs_negative_timeout(fs, 1, name) ==
			    FS_TIMEOUT_WATCHED);
	}
	assert_int_equal(sbx_hashmap_count(&fs->negatives), FS_NEGATIVES_MAX);
	assert_true(fs_negative_timeout(fs, 1, "one-more") == FS_TIMEOUT_BLIND);
	assert_true(fs_negative_timeout(fs, 1, "n5") == FS_TIMEOUT_WATCHED);
	fs_negative_drop(fs, 1, "n5");
	assert_true(fs_negative_timeout(fs, 1, "one-more") ==
		    FS_TIMEOUT_WATCHED);
	assert_int_equal(sbx_hashmap_count(&fs->negatives), FS_NEGATIVES_MAX);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_listed_once_until_dropped,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_full_list_gives_the_short_timeout, setup,
			teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
