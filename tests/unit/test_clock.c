/* Unit tests: lib/clock.c (deadlines, monotonic milliseconds). */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "sbx/clock.h"

static long long ts_ms(const struct timespec *t)
{
	return (long long)t->tv_sec * 1000 + t->tv_nsec / 1000000;
}

static void test_deadline_ahead(void **state)
{
	struct timespec now, d;

	for (int ms = 0; ms < 2500; ms += 333) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		d = sbx_clock_deadline(CLOCK_MONOTONIC, ms);
		assert_true(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
		assert_true(ts_ms(&d) >= ts_ms(&now) + ms);
		/* Generous: a loaded machine may be slow between the calls. */
		assert_true(ts_ms(&d) <= ts_ms(&now) + ms + 1000);
	}
}

static void test_deadline_negative_is_now(void **state)
{
	struct timespec now, d;

	clock_gettime(CLOCK_REALTIME, &now);
	d = sbx_clock_deadline(CLOCK_REALTIME, -5000);
	assert_true(ts_ms(&d) >= ts_ms(&now));
	assert_true(ts_ms(&d) <= ts_ms(&now) + 1000);
}

static void test_mono_ms_advances(void **state)
{
	long long a = sbx_clock_mono_ms(), b;
	struct timespec nap = { 0, 20 * 1000000L };

	nanosleep(&nap, NULL);
	b = sbx_clock_mono_ms();
	assert_true(b >= a + 20);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_deadline_ahead),
		cmocka_unit_test(test_deadline_negative_is_now),
		cmocka_unit_test(test_mono_ms_advances),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
