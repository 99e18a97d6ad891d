/*
 * Logging for the daemon, CLI and agent.
 *
 * Messages go to stderr (or the file set with sbx_log_open()), one line each,
 * prefixed with time, level and component.  The level comes from $SBX_LOG
 * ("error", "warn", "info", "debug"; default "warn") unless set explicitly.
 * Thread-safe: each line is written with a single write(2).
 */
#ifndef SBX_LOG_H
#define SBX_LOG_H

#include <stdbool.h>

#include "sbx/error.h"

enum sbx_log_level {
	SBX_LOG_ERROR = 0,
	SBX_LOG_WARN,
	SBX_LOG_INFO,
	SBX_LOG_DEBUG,
};

/* Set the component tag ("sbx", "sbxfs", "agent") and level from $SBX_LOG. */
void sbx_log_init(const char *component);
void sbx_log_set_level(enum sbx_log_level level);
/* True when messages of `level` are emitted (to skip costly formatting). */
bool sbx_log_enabled(enum sbx_log_level level);
/*
 * Send log lines to `path` (appended, created 0600).  Returns 0 or -errno.
 */
SBX_WUR int sbx_log_open(const char *path);

void sbx_log(enum sbx_log_level level, const char *fmt, ...) SBX_PRINTF(2, 3);

#define sbx_error(...) sbx_log(SBX_LOG_ERROR, __VA_ARGS__)
#define sbx_warn(...) sbx_log(SBX_LOG_WARN, __VA_ARGS__)
#define sbx_info(...) sbx_log(SBX_LOG_INFO, __VA_ARGS__)
#define sbx_debug(...)                                                         \
	do {                                                                   \
		if (sbx_log_enabled(SBX_LOG_DEBUG))                            \
			sbx_log(SBX_LOG_DEBUG, __VA_ARGS__);                   \
	} while (0)

#endif
