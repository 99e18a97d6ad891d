/* Deadlines and monotonic milliseconds; see sbx/clock.h. */
#include "config.h"

#include <time.h>

#include "sbx/clock.h"

struct timespec sbx_clock_deadline(clockid_t clk, int timeout_ms)
{
	struct timespec t;

	if (timeout_ms < 0)
		timeout_ms = 0;
	clock_gettime(clk, &t);
	t.tv_sec += timeout_ms / 1000;
	t.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (t.tv_nsec >= 1000000000L) {
		t.tv_sec++;
		t.tv_nsec -= 1000000000L;
	}
	return t;
}

long long sbx_clock_mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
