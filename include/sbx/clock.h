/*
 * Time for timeouts: an absolute deadline for pthread_cond_timedwait(), and
 * a monotonic millisecond count for poll() loops.  Neither can fail (the
 * clocks used are always present on Linux); both are thread-safe.
 */
#ifndef SBX_CLOCK_H
#define SBX_CLOCK_H

#include <time.h>

/*
 * The time `timeout_ms` milliseconds from now on clock `clk`, normalised
 * (tv_nsec below one second).  With CLOCK_REALTIME it is the deadline a
 * default pthread_cond_timedwait() takes.  A negative timeout counts as 0.
 */
struct timespec sbx_clock_deadline(clockid_t clk, int timeout_ms);

/* CLOCK_MONOTONIC in milliseconds: for measuring what is left of a wait. */
long long sbx_clock_mono_ms(void);

#endif
