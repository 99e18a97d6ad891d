/* cJSON helpers and JSONC parsing; see sbx/json.h. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/paths.h"
#include "sbx/xmalloc.h"

/* 1-based line and column of offset `off` in `text`. */
static void position(const char *text, size_t off, unsigned *line,
		     unsigned *col)
{
	unsigned l = 1, c = 1;

	for (size_t i = 0; i < off; i++) {
		if (text[i] == '\n') {
			l++;
			c = 1;
		} else {
			c++;
		}
	}
	*line = l;
	*col = c;
}

static int syntax_error(const char *source, const char *text, size_t off,
			const char *what)
{
	unsigned line, col;

	position(text, off, &line, &col);
	return sbx_error_set(SBX_ERR_JSON, -EINVAL, "%s:%u:%u: %s", source,
			     line, col, what);
}

/* The index just past the string literal that starts at t[i] ('"'). */
static size_t skip_string(const char *t, size_t len, size_t i)
{
	for (i++; i < len && t[i] != '"'; i++)
		if (t[i] == '\\' && i + 1 < len)
			i++;
	return i + 1;
}

/*
 * Blank out comments (keeping newlines, so positions stay those of the
 * original text).  Strings are skipped so "http://x" stays intact.
 */
static int strip_comments(char *t, size_t len, const char *source,
			  const char *orig)
{
	size_t i = 0;

	while (i < len) {
		if (t[i] == '"') {
			i = skip_string(t, len, i);
		} else if (t[i] == '/' && i + 1 < len && t[i + 1] == '/') {
			for (; i < len && t[i] != '\n'; i++)
				t[i] = ' ';
		} else if (t[i] == '/' && i + 1 < len && t[i + 1] == '*') {
			size_t start = i;

			t[i++] = ' ';
			t[i++] = ' ';
			while (i < len &&
			       !(t[i] == '*' && i + 1 < len && t[i + 1] == '/')) {
				if (t[i] != '\n')
					t[i] = ' ';
				i++;
			}
			if (i >= len)
				return syntax_error(source, orig, start,
						    "unterminated /* comment");
			t[i++] = ' ';
			t[i++] = ' ';
		} else {
			i++;
		}
	}
	return 0;
}

/* Blank out a ',' followed (after whitespace) by '}' or ']'. */
static void strip_trailing_commas(char *t, size_t len)
{
	size_t i = 0, j;

	while (i < len) {
		if (t[i] == '"') {
			i = skip_string(t, len, i);
			continue;
		}
		if (t[i] == ',') {
			for (j = i + 1; j < len && isspace((unsigned char)t[j]);
			     j++)
				;
			if (j < len && (t[j] == '}' || t[j] == ']'))
				t[i] = ' ';
		}
		i++;
	}
}

/*
 * The offset of the first "\u0000" escape inside a string, or `len` when
 * there is none.  cJSON decodes it into the string, which then ends there
 * as a C string: "a\u0000b" would silently become "a" (a path, a name, an
 * argument), so such text is refused like a raw NUL byte.
 */
static size_t escaped_nul(const char *t, size_t len)
{
	bool in_str = false;

	for (size_t i = 0; i < len; i++) {
		if (!in_str) {
			in_str = t[i] == '"';
			continue;
		}
		if (t[i] == '"') {
			in_str = false;
		} else if (t[i] == '\\' && i + 1 < len) {
			if (t[i + 1] == 'u' && i + 5 < len &&
			    !memcmp(t + i + 2, "0000", 4))
				return i;
			i++; /* the escaped character */
		}
	}
	return len;
}

int sbx_json_parse(cJSON **out, const char *text, size_t len,
		   const char *source)
{
	const char *end = NULL;
	char *copy = NULL, *nul;
	cJSON *root = NULL;
	size_t off;
	int rc;

	*out = NULL;
	if (!source)
		source = "<json>";
	nul = memchr(text, '\0', len);
	if (nul) {
		rc = syntax_error(source, text, (size_t)(nul - text),
				  "NUL byte in JSON text");
		goto out;
	}
	copy = sbx_xmalloc(len + 1);
	memcpy(copy, text, len);
	copy[len] = '\0';
	rc = strip_comments(copy, len, source, text);
	if (rc < 0)
		goto out;
	strip_trailing_commas(copy, len);
	off = escaped_nul(copy, len);
	if (off < len) {
		rc = syntax_error(source, text, off,
				  "\\u0000 (a NUL character) in a string");
		goto out;
	}

	for (off = 0; off < len && isspace((unsigned char)copy[off]); off++)
		;
	if (off == len) {
		rc = syntax_error(source, text, len, "empty JSON document");
		goto out;
	}
	/* len + 1 includes the NUL, which require_null_terminated needs. */
	root = cJSON_ParseWithLengthOpts(copy, len + 1, &end, 1);
	if (!root) {
		off = end && end >= copy ? (size_t)(end - copy) : 0;
		if (off > len)
			off = len;
		if (off == len) {
			rc = syntax_error(source, text, len,
					  "unexpected end of JSON document");
		} else {
			char what[64];

			snprintf(what, sizeof(what),
				 "invalid JSON near '%.16s'", copy + off);
			/* Keep the message on one line. */
			for (char *p = what; *p; p++)
				if (*p == '\n' || *p == '\r' || *p == '\t')
					*p = ' ';
			rc = syntax_error(source, text, off, what);
		}
		goto out;
	}
	*out = root;
	rc = 0;
out:
	free(copy);
	return rc;
}

int sbx_json_parse_file(cJSON **out, const char *path, size_t cap)
{
	char *text = NULL;
	size_t len = 0;
	int rc;

	*out = NULL;
	rc = sbx_file_read(path, cap, &text, &len);
	if (rc < 0)
		return rc;
	rc = sbx_json_parse(out, text, len, path);
	free(text);
	return rc;
}

const char *sbx_json_type_name(const cJSON *item)
{
	static const struct {
		cJSON_bool (*is)(const cJSON *);
		const char *name;
	} types[] = {
		{ cJSON_IsString, "string" }, { cJSON_IsBool, "boolean" },
		{ cJSON_IsNumber, "number" }, { cJSON_IsObject, "object" },
		{ cJSON_IsArray, "array" },   { cJSON_IsNull, "null" },
	};

	if (!item)
		return "missing";
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
		if (types[i].is(item))
			return types[i].name;
	return "invalid";
}

/* The member, or NULL when missing or null (both mean "use the default"). */
static const cJSON *member(const cJSON *obj, const char *key)
{
	const cJSON *it;

	if (!obj || !cJSON_IsObject(obj))
		return NULL;
	it = cJSON_GetObjectItemCaseSensitive(obj, key);
	if (!it || cJSON_IsNull(it))
		return NULL;
	return it;
}

static int type_error(const char *where, const char *key, const char *want,
		      const cJSON *it)
{
	return sbx_error_set(SBX_ERR_JSON, -EINVAL,
			     "%s: \"%s\" must be %s, not %s",
			     where ? where : "JSON", key, want,
			     sbx_json_type_name(it));
}

/*
 * The member `key` when present and of the type `is` accepts: 1, with
 * *it_out set.  0 when it is missing or null; a type error naming `want`
 * otherwise.  The sbx_json_get_*() getters are this plus their default.
 */
static int typed_member(const cJSON **it_out, const cJSON *obj,
			const char *key, cJSON_bool (*is)(const cJSON *),
			const char *want, const char *where)
{
	const cJSON *it = member(obj, key);

	*it_out = NULL;
	if (!it)
		return 0;
	if (!is(it))
		return type_error(where, key, want, it);
	*it_out = it;
	return 1;
}

int sbx_json_get_string(const char **out, const cJSON *obj, const char *key,
			const char *where)
{
	const cJSON *it;
	int rc = typed_member(&it, obj, key, cJSON_IsString, "a string", where);

	*out = it ? it->valuestring : NULL;
	return rc < 0 ? rc : 0;
}

int sbx_json_get_bool(bool *out, const cJSON *obj, const char *key,
		      bool dflt, const char *where)
{
	const cJSON *it;
	int rc = typed_member(&it, obj, key, cJSON_IsBool, "true or false",
			      where);

	*out = it ? cJSON_IsTrue(it) : dflt;
	return rc < 0 ? rc : 0;
}

int sbx_json_get_int(long long *out, const cJSON *obj, const char *key,
		     long long dflt, const char *where)
{
	const cJSON *it;
	int rc = typed_member(&it, obj, key, cJSON_IsNumber, "an integer",
			      where);
	double d;

	*out = dflt;
	if (!it)
		return rc < 0 ? rc : 0;
	d = it->valuedouble;
	/* 2^63 bounds; doubles beyond 2^53 are already inexact anyway. */
	if (d != floor(d) || d < -9.2e18 || d > 9.2e18)
		return sbx_error_set(SBX_ERR_JSON, -EINVAL,
				     "%s: \"%s\" must be an integer",
				     where ? where : "JSON", key);
	*out = (long long)d;
	return 0;
}

int sbx_json_get_object(const cJSON **out, const cJSON *obj, const char *key,
			const char *where)
{
	int rc = typed_member(out, obj, key, cJSON_IsObject, "an object",
			      where);

	return rc < 0 ? rc : 0;
}

const char *sbx_json_str(const cJSON *obj, const char *key)
{
	const cJSON *it = member(obj, key);

	return cJSON_IsString(it) ? it->valuestring : NULL;
}

bool sbx_json_bool(const cJSON *obj, const char *key, bool dflt)
{
	const cJSON *it = member(obj, key);

	return cJSON_IsBool(it) ? cJSON_IsTrue(it) : dflt;
}

void sbx_json_set_take(cJSON *obj, const char *key, cJSON *item)
{
	if (cJSON_GetObjectItemCaseSensitive(obj, key))
		cJSON_ReplaceItemInObjectCaseSensitive(obj, key, item);
	else
		cJSON_AddItemToObject(obj, key, item);
}

static cJSON *must(cJSON *item)
{
	/* cJSON reports allocation failure as NULL; follow xmalloc. */
	if (!item) {
		fputs("sbx: out of memory (cJSON)\n", stderr);
		abort();
	}
	return item;
}

void sbx_json_set_str(cJSON *obj, const char *key, const char *value)
{
	sbx_json_set_take(obj, key,
			  must(value ? cJSON_CreateString(value)
				     : cJSON_CreateNull()));
}

void sbx_json_merge(cJSON *dst, const cJSON *src)
{
	const cJSON *it;

	cJSON_ArrayForEach(it, src) {
		cJSON *cur;

		if (!it->string)
			continue;
		cur = cJSON_GetObjectItemCaseSensitive(dst, it->string);
		if (cur && cJSON_IsObject(cur) && cJSON_IsObject(it)) {
			sbx_json_merge(cur, it);
			continue;
		}
		sbx_json_set_take(dst, it->string,
				  must(cJSON_Duplicate(it, 1)));
	}
}

char *sbx_json_print(const cJSON *item, bool pretty)
{
	char *p = pretty ? cJSON_Print(item) : cJSON_PrintUnformatted(item);
	char *copy;

	if (!p) {
		fputs("sbx: out of memory (cJSON print)\n", stderr);
		abort();
	}
	/* Hand out plain malloc memory so callers never need cJSON_free. */
	copy = sbx_xstrdup(p);
	cJSON_free(p);
	return copy;
}

char *sbx_json_time_format(char *buf, size_t size, time_t t)
{
	struct tm tm;

	if (!gmtime_r(&t, &tm) ||
	    strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0) {
		if (size)
			buf[0] = '\0';
	}
	return buf;
}

int sbx_json_time_parse(time_t *out, const char *s)
{
	struct tm tm;
	const char *p;
	long off = 0;
	time_t t;

	*out = 0;
	memset(&tm, 0, sizeof(tm));
	p = s ? strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
	if (!p)
		goto bad;
	if (*p == '.') {
		for (p++; isdigit((unsigned char)*p); p++)
			;
	}
	if (*p == 'Z' || *p == 'z') {
		p++;
	} else if ((*p == '+' || *p == '-') && isdigit((unsigned char)p[1]) &&
		   isdigit((unsigned char)p[2]) && p[3] == ':' &&
		   isdigit((unsigned char)p[4]) && isdigit((unsigned char)p[5])) {
		off = ((p[1] - '0') * 10 + (p[2] - '0')) * 3600L +
		      ((p[4] - '0') * 10 + (p[5] - '0')) * 60L;
		if (*p == '-')
			off = -off;
		p += 6;
	} else {
		goto bad;
	}
	if (*p)
		goto bad;
	t = timegm(&tm);
	if (t == (time_t)-1)
		goto bad;
	*out = t - off;
	return 0;
bad:
	return sbx_error_set(SBX_ERR_JSON, -EINVAL,
			     "bad time \"%s\": expected RFC 3339 like "
			     "2024-01-31T12:00:00Z", s ? s : "(null)");
}
