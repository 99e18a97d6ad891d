/* Line-oriented logging; see sbx/log.h. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "sbx/log.h"

static int level = SBX_LOG_WARN;
static int log_fd = STDERR_FILENO;
static char component[16] = "sbx";

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void sbx_log_init(const char *comp)
{
	const char *env = getenv("SBX_LOG");

	snprintf(component, sizeof(component), "%s", comp);
	if (!env)
		return;
	for (int i = 0; i <= SBX_LOG_DEBUG; i++)
		if (strcasecmp(env, level_names[i]) == 0)
			level = i;
}

void sbx_log_set_level(enum sbx_log_level l)
{
	level = l;
}

bool sbx_log_enabled(enum sbx_log_level l)
{
	return (int)l <= level;
}

int sbx_log_open(const char *path)
{
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);

	if (fd < 0)
		return sbx_error_os("open log file %s", path);
	if (log_fd != STDERR_FILENO)
		close(log_fd);
	log_fd = fd;
	return 0;
}

void sbx_log(enum sbx_log_level l, const char *fmt, ...)
{
	char line[2048];
	struct timespec ts;
	struct tm tm;
	size_t n;
	int saved = errno;
	va_list ap;

	if ((int)l > level)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
	n += (size_t)snprintf(line + n, sizeof(line) - n, ".%03ldZ %s[%d] %s: ",
			      ts.tv_nsec / 1000000, component, (int)getpid(),
			      level_names[l]);
	va_start(ap, fmt);
	if (n < sizeof(line))
		vsnprintf(line + n, sizeof(line) - n, fmt, ap);
	va_end(ap);
	n = strnlen(line, sizeof(line) - 2);
	line[n++] = '\n';
	if (write(log_fd, line, n) < 0) {
		/* Nowhere left to report a failing log write. */
	}
	errno = saved;
}
