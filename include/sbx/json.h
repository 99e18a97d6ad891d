/*
 * cJSON helpers: JSONC parsing with "file:line:col" errors, typed getters,
 * deep merge, printing, RFC 3339 times.
 *
 * JSONC is JSON plus // line comments, slash-star block comments and
 * trailing commas before '}' or ']' (what opencode.jsonc and VS Code
 * settings accept).  Comments and trailing commas are blanked out in a copy
 * of the text, keeping every newline, so the line numbers cJSON's error
 * position maps to are the lines of the original file.
 *
 * Ownership: a parsed tree (*out) belongs to the caller, released once at
 * the root with cJSON_Delete().  Items returned by getters are borrowed from
 * their parent.  Strings from sbx_json_print() are malloc'd (free()).
 *
 * Errors: -EINVAL with SBX_ERR_JSON for malformed documents and for values
 * of the wrong type; file errors as sbx_file_read() (SBX_ERR_OS).
 *
 * Threads: no shared state; cJSON itself is reentrant for distinct trees.
 */
#ifndef SBX_JSON_H
#define SBX_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "sbx/error.h"

struct cJSON;

/* Default cap for configuration and state files. */
#define SBX_JSON_FILE_CAP (1024 * 1024)

/*
 * Parse `len` bytes of JSONC text.  `source` names the text in error
 * messages ("config.json", "<command line>").  On error the message is
 * "<source>:<line>:<col>: <what>" and *out is NULL.  A NUL byte inside the
 * text is an error, and so is a string holding U+0000 ("\u0000"): it
 * could only reach C as a string cut short.
 */
SBX_WUR int sbx_json_parse(struct cJSON **out, const char *text, size_t len,
			   const char *source);

/*
 * Read the file at `path` (at most `cap` bytes: -EFBIG beyond) and parse it
 * as JSONC.  -ENOENT (SBX_ERR_OS) when it does not exist.
 */
SBX_WUR int sbx_json_parse_file(struct cJSON **out, const char *path,
				size_t cap);

/*
 * Typed getters.  `obj` may be NULL (treated as empty).  A missing key or a
 * JSON null gives the default (NULL for strings/objects) and returns 0.  A
 * value of another type returns -EINVAL (SBX_ERR_JSON) with the message
 * "<where>: \"<key>\" must be a <type>, not <actual>".
 */
SBX_WUR int sbx_json_get_string(const char **out, const struct cJSON *obj,
				const char *key, const char *where);
SBX_WUR int sbx_json_get_bool(bool *out, const struct cJSON *obj,
			      const char *key, bool dflt, const char *where);
/* Integral numbers only (no fraction), within long long. */
SBX_WUR int sbx_json_get_int(long long *out, const struct cJSON *obj,
			     const char *key, long long dflt,
			     const char *where);
SBX_WUR int sbx_json_get_object(const struct cJSON **out,
				const struct cJSON *obj, const char *key,
				const char *where);

/* Non-failing accessors: the value, or NULL/dflt when missing or mistyped. */
const char *sbx_json_str(const struct cJSON *obj, const char *key);
bool sbx_json_bool(const struct cJSON *obj, const char *key, bool dflt);

/* JSON type name of an item for messages ("string", "object", ...). */
const char *sbx_json_type_name(const struct cJSON *item);

/*
 * Deep merge `src` into `dst` (both objects): members of `src` that are
 * objects are merged recursively into objects of `dst`; anything else
 * replaces the member of `dst` with a copy.  `src` is not modified.
 */
void sbx_json_merge(struct cJSON *dst, const struct cJSON *src);

/*
 * Set obj[key] = item, replacing any existing member.  Takes ownership of
 * `item` (it becomes part of `obj`).
 */
void sbx_json_set_take(struct cJSON *obj, const char *key,
		       struct cJSON *item);

/* Set obj[key] to a string copy, or JSON null when `value` is NULL. */
void sbx_json_set_str(struct cJSON *obj, const char *key, const char *value);

/* Serialise; malloc'd, NUL-terminated, free() it.  Aborts on OOM. */
char *sbx_json_print(const struct cJSON *item, bool pretty);

/*
 * RFC 3339 UTC time "YYYY-MM-DDTHH:MM:SSZ" into buf (size >= 21).  Returns
 * buf.
 */
char *sbx_json_time_format(char *buf, size_t size, time_t t);

/*
 * Parse an RFC 3339 time (a "Z" or "+HH:MM" offset; fractional seconds
 * ignored).  -EINVAL (SBX_ERR_JSON) when malformed.
 */
SBX_WUR int sbx_json_time_parse(time_t *out, const char *s);

#endif
