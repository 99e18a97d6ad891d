/* Unit tests: lib/waitfd.c (wait for a descriptor, a wake pipe or a deadline). */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "sbx/clock.h"
#include "sbx/waitfd.h"

static void make_pipe(int p[2])
{
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
}

static void close_pipe(int p[2])
{
	close(p[0]);
	close(p[1]);
}

static void test_ready(void **state)
{
	int fd[2], wake[2];
	short ev = 0;

	make_pipe(fd);
	make_pipe(wake);
	assert_int_equal(write(fd[1], "x", 1), 1);
	assert_int_equal(sbx_waitfd(fd[0], POLLIN, wake[0], -1, &ev),
			 SBX_WAITFD_READY);
	assert_true(ev & POLLIN);
	/* A write end with room is ready for POLLOUT. */
	assert_int_equal(sbx_waitfd(fd[1], POLLOUT, wake[0], 1000, &ev),
			 SBX_WAITFD_READY);
	assert_true(ev & POLLOUT);
	/* Events not asked for still end the wait: the writer hung up. */
	close(fd[1]);
	fd[1] = -1;
	assert_int_equal(sbx_waitfd(fd[0], POLLPRI, wake[0], 1000, &ev),
			 SBX_WAITFD_READY);
	assert_true(ev & POLLHUP);
	close(fd[0]);
	close_pipe(wake);
}

static void test_woken_wins(void **state)
{
	int fd[2], wake[2];
	short ev = 42;

	make_pipe(fd);
	make_pipe(wake);
	assert_int_equal(write(fd[1], "x", 1), 1);
	assert_int_equal(write(wake[1], "w", 1), 1);
	assert_int_equal(sbx_waitfd(fd[0], POLLIN, wake[0], -1, &ev),
			 SBX_WAITFD_WOKEN);
	assert_int_equal(ev, 0);
	/* The wake pipe is not drained: woken again at once. */
	assert_int_equal(sbx_waitfd(-1, 0, wake[0], -1, NULL),
			 SBX_WAITFD_WOKEN);
	/* A closed writer wakes too (the owner went away). */
	close_pipe(wake);
	make_pipe(wake);
	close(wake[1]);
	assert_int_equal(sbx_waitfd(-1, 0, wake[0], -1, NULL),
			 SBX_WAITFD_WOKEN);
	close(wake[0]);
	close_pipe(fd);
}

static void test_timeouts(void **state)
{
	int fd[2], wake[2];
	long long t0, el;
	short ev = 42;

	make_pipe(fd);
	make_pipe(wake);
	t0 = sbx_clock_mono_ms();
	assert_int_equal(sbx_waitfd(fd[0], POLLIN, wake[0], 0, &ev),
			 SBX_WAITFD_TIMEOUT);
	assert_int_equal(ev, 0);
	assert_int_equal(sbx_waitfd(fd[0], POLLIN, wake[0], 80, NULL),
			 SBX_WAITFD_TIMEOUT);
	el = sbx_clock_mono_ms() - t0;
	assert_true(el >= 79);
	assert_true(el < 5000);
	/* Nothing to watch: a plain sleep. */
	t0 = sbx_clock_mono_ms();
	assert_int_equal(sbx_waitfd(-1, 0, -1, 50, NULL), SBX_WAITFD_TIMEOUT);
	assert_true(sbx_clock_mono_ms() - t0 >= 49);
	close_pipe(fd);
	close_pipe(wake);
}

static void test_bad_fd_is_ready_not_an_error(void **state)
{
	int fd[2];
	short ev = 0;

	make_pipe(fd);
	close_pipe(fd);
	/* poll reports POLLNVAL for a closed descriptor. */
	assert_int_equal(sbx_waitfd(fd[0], POLLIN, -1, 1000, &ev),
			 SBX_WAITFD_READY);
	assert_true(ev & POLLNVAL);
}

/* ---- EINTR ------------------------------------------------------------------ */

static void on_usr1(int sig)
{
	(void)sig;
}

struct kicker {
	pthread_t target;
	int wake_w;     /* written at the end, when >= 0 */
	int kicks;
	atomic_bool stop; /* set by the test thread, read by the kicker */
};

/* Interrupt the target's poll every 5 ms for ~150 ms, then maybe wake it. */
static void *kick_thread(void *arg)
{
	struct kicker *k = arg;

	for (int i = 0; i < 30 && !atomic_load(&k->stop); i++) {
		pthread_kill(k->target, SIGUSR1);
		k->kicks++;
		usleep(5000);
	}
	if (k->wake_w >= 0 && write(k->wake_w, "w", 1) != 1)
		fail();
	return NULL;
}

static void test_eintr_retried(void **state)
{
	/* No SA_RESTART: poll fails with EINTR on each signal. */
	struct sigaction sa = { .sa_handler = on_usr1 }, old;
	struct kicker k = { .target = pthread_self(), .wake_w = -1 };
	int fd[2], wake[2];
	pthread_t t;
	long long t0, el;

	make_pipe(fd);
	make_pipe(wake);
	assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);

	/* A bounded wait lasts its whole timeout despite the signals. */
	assert_int_equal(pthread_create(&t, NULL, kick_thread, &k), 0);
	t0 = sbx_clock_mono_ms();
	assert_int_equal(sbx_waitfd(fd[0], POLLIN, wake[0], 300, NULL),
			 SBX_WAITFD_TIMEOUT);
	el = sbx_clock_mono_ms() - t0;
	atomic_store(&k.stop, true);
	pthread_join(t, NULL);
	assert_true(k.kicks > 0);
	assert_true(el >= 299);
	assert_true(el < 5000);

	/* An unbounded one ends only when woken. */
	k = (struct kicker){ .target = pthread_self(), .wake_w = wake[1] };
	assert_int_equal(pthread_create(&t, NULL, kick_thread, &k), 0);
	assert_int_equal(sbx_waitfd(fd[0], POLLIN, wake[0], -1, NULL),
			 SBX_WAITFD_WOKEN);
	pthread_join(t, NULL);
	assert_int_equal(k.kicks, 30);

	assert_int_equal(sigaction(SIGUSR1, &old, NULL), 0);
	close_pipe(fd);
	close_pipe(wake);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ready),
		cmocka_unit_test(test_woken_wins),
		cmocka_unit_test(test_timeouts),
		cmocka_unit_test(test_bad_fd_is_ready_not_an_error),
		cmocka_unit_test(test_eintr_retried),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
