/* Waiting for a descriptor, a wake descriptor or a deadline; see sbx/waitfd.h. */
#include "config.h"

#include <errno.h>
#include <poll.h>

#include "sbx/clock.h"
#include "sbx/error.h"
#include "sbx/waitfd.h"

int sbx_waitfd(int fd, short events, int wake_fd, int timeout_ms,
	       short *revents)
{
	long long end = timeout_ms > 0 ? sbx_clock_mono_ms() + timeout_ms : 0;
	int left = timeout_ms < 0 ? -1 : timeout_ms;

	if (revents)
		*revents = 0;
	for (;;) {
		/* poll(2) skips entries with a negative fd. */
		struct pollfd p[2] = {
			{ .fd = fd, .events = events },
			{ .fd = wake_fd, .events = POLLIN },
		};
		int n = poll(p, 2, left);

		if (n < 0 && errno != EINTR)
			return sbx_error_os("poll");
		if (n > 0) {
			if (p[1].revents)
				return SBX_WAITFD_WOKEN;
			if (revents)
				*revents = p[0].revents;
			return SBX_WAITFD_READY;
		}
		if (n == 0 && timeout_ms >= 0)
			return SBX_WAITFD_TIMEOUT;
		/* EINTR: again, with what is left of the timeout. */
		if (timeout_ms > 0) {
			long long now = sbx_clock_mono_ms();

			if (now >= end)
				return SBX_WAITFD_TIMEOUT;
			left = (int)(end - now);
		}
	}
}
