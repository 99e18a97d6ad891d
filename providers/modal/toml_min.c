/*
 * A minimal TOML subset reader; see toml_min.h.  Line-oriented: every
 * construct of the subset fits on one line, so anything that would span
 * lines (multi-line strings, arrays) is refused where it starts.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sbx/xmalloc.h"

#include "toml_min.h"

/* ~/.modal.toml holds a few profiles; anything this big is not one. */
#define TOML_MIN_MAX_FILE (1024 * 1024)

struct parser {
	const char *what;
	int line;
	const char *p, *end;    /* the current line, without its newline */
	struct toml_min_doc *doc;
	struct toml_min_table *cur;
};

static int perr(const struct parser *ps, const char *fmt, ...)
	SBX_PRINTF(2, 3);

static int perr(const struct parser *ps, const char *fmt, ...)
{
	char msg[320];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return sbx_error_set(SBX_ERR_CONFIG, -EINVAL, "%s:%d: %s", ps->what,
			     ps->line, msg);
}

static void skip_ws(struct parser *ps)
{
	while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t'))
		ps->p++;
}

/* After a construct: only blanks and a comment may follow. */
static int expect_eol(struct parser *ps, const char *after)
{
	skip_ws(ps);
	if (ps->p < ps->end && *ps->p != '#')
		return perr(ps, "unexpected text after %s", after);
	for (const char *q = ps->p; q < ps->end; q++)
		if ((unsigned char)*q < 0x20 && *q != '\t')
			return perr(ps, "control character in a comment");
	return 0;
}

static bool is_bare(char ch)
{
	return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
	       (ch >= '0' && ch <= '9') || ch == '_' || ch == '-';
}

static void put_utf8(char **o, uint32_t cp)
{
	char *d = *o;

	if (cp < 0x80) {
		*d++ = (char)cp;
	} else if (cp < 0x800) {
		*d++ = (char)(0xc0 | cp >> 6);
		*d++ = (char)(0x80 | (cp & 0x3f));
	} else if (cp < 0x10000) {
		*d++ = (char)(0xe0 | cp >> 12);
		*d++ = (char)(0x80 | ((cp >> 6) & 0x3f));
		*d++ = (char)(0x80 | (cp & 0x3f));
	} else {
		*d++ = (char)(0xf0 | cp >> 18);
		*d++ = (char)(0x80 | ((cp >> 12) & 0x3f));
		*d++ = (char)(0x80 | ((cp >> 6) & 0x3f));
		*d++ = (char)(0x80 | (cp & 0x3f));
	}
	*o = d;
}

/* A basic ("...") or literal ('...') string at ps->p; *out malloc'd. */
static int parse_string(struct parser *ps, char **out, const char *what)
{
	char q = *ps->p;
	char *buf, *o;

	*out = NULL;
	if (ps->end - ps->p >= 3 && ps->p[1] == q && ps->p[2] == q)
		return perr(ps, "multi-line strings are not supported (%s)",
			    what);
	ps->p++;
	/* Escapes never grow: \uXXXX (6) gives at most 3 bytes, \UXXXXXXXX
	 * (10) at most 4. */
	buf = o = sbx_xmalloc((size_t)(ps->end - ps->p) + 1);
	for (;;) {
		unsigned char ch;

		if (ps->p >= ps->end) {
			free(buf);
			return perr(ps, "unterminated string (%s)", what);
		}
		ch = (unsigned char)*ps->p++;
		if (ch == (unsigned char)q)
			break;
		if ((ch < 0x20 && ch != '\t') || ch == 0x7f) {
			free(buf);
			return perr(ps, "control character in a string (%s)",
				    what);
		}
		if (ch != '\\' || q == '\'') {
			*o++ = (char)ch;
			continue;
		}
		if (ps->p >= ps->end) {
			free(buf);
			return perr(ps, "unterminated string (%s)", what);
		}
		ch = (unsigned char)*ps->p++;
		switch (ch) {
		case 'b': *o++ = '\b'; break;
		case 't': *o++ = '\t'; break;
		case 'n': *o++ = '\n'; break;
		case 'f': *o++ = '\f'; break;
		case 'r': *o++ = '\r'; break;
		case '"': *o++ = '"'; break;
		case '\\': *o++ = '\\'; break;
		case 'u':
		case 'U': {
			int nd = ch == 'u' ? 4 : 8;
			uint32_t cp = 0;

			if (ps->end - ps->p < nd) {
				free(buf);
				return perr(ps, "short \\%c escape (%s)", ch,
					    what);
			}
			for (int i = 0; i < nd; i++) {
				char h = ps->p[i];
				int v = h >= '0' && h <= '9'   ? h - '0'
					: h >= 'a' && h <= 'f' ? h - 'a' + 10
					: h >= 'A' && h <= 'F' ? h - 'A' + 10
							       : -1;

				if (v < 0) {
					free(buf);
					return perr(ps, "bad \\%c escape (%s)",
						    ch, what);
				}
				cp = cp << 4 | (uint32_t)v;
			}
			ps->p += nd;
			if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ||
			    cp == 0) {
				free(buf);
				return perr(ps, "\\%c escape is not a valid "
						"character (%s)", ch, what);
			}
			put_utf8(&o, cp);
			break;
		}
		default:
			free(buf);
			return perr(ps, "unknown escape \\%c (%s)",
				    ch >= 0x20 && ch < 0x7f ? ch : '?', what);
		}
	}
	*o = '\0';
	*out = buf;
	return 0;
}

/* A bare or quoted key (or table name); *out malloc'd. */
static int parse_key(struct parser *ps, char **out, const char *what)
{
	const char *s = ps->p;
	int rc;

	*out = NULL;
	if (ps->p < ps->end && (*ps->p == '"' || *ps->p == '\'')) {
		rc = parse_string(ps, out, what);
		if (rc < 0)
			return rc;
	} else {
		while (ps->p < ps->end && is_bare(*ps->p))
			ps->p++;
		if (ps->p == s)
			return perr(ps, "expected a %s", what);
		*out = sbx_xstrndup(s, (size_t)(ps->p - s));
	}
	skip_ws(ps);
	if (ps->p < ps->end && *ps->p == '.') {
		free(*out);
		*out = NULL;
		return perr(ps, "dotted keys are not supported (%s)", what);
	}
	return 0;
}

static struct toml_min_table *add_table(struct toml_min_doc *doc,
					const char *name, int line)
{
	struct toml_min_table *t;

	doc->tables = sbx_xrealloc(doc->tables, (doc->ntables + 1) *
							sizeof(*doc->tables));
	t = &doc->tables[doc->ntables++];
	memset(t, 0, sizeof(*t));
	t->name = sbx_xstrdup(name);
	t->line = line;
	return t;
}

static int parse_table(struct parser *ps)
{
	char *name = NULL;
	int rc;

	ps->p++; /* '[' */
	if (ps->p < ps->end && *ps->p == '[')
		return perr(ps, "arrays of tables ([[...]]) are not "
				"supported");
	skip_ws(ps);
	rc = parse_key(ps, &name, "table name");
	if (rc < 0)
		return rc;
	if (ps->p >= ps->end || *ps->p != ']') {
		free(name);
		return perr(ps, "expected ']' after the table name");
	}
	ps->p++;
	if (!*name) {
		free(name);
		return perr(ps, "empty table name");
	}
	rc = expect_eol(ps, "the table header");
	if (rc < 0) {
		free(name);
		return rc;
	}
	for (size_t i = 1; i < ps->doc->ntables; i++)
		if (!strcmp(ps->doc->tables[i].name, name)) {
			rc = perr(ps, "table [%s] defined twice (first on "
				      "line %d)", name,
				  ps->doc->tables[i].line);
			free(name);
			return rc;
		}
	ps->cur = add_table(ps->doc, name, ps->line);
	free(name);
	return 0;
}

static int parse_int(struct parser *ps, struct toml_min_kv *kv)
{
	char digits[32];
	size_t nd = 0;
	bool neg = false;
	char *endp;

	if (*ps->p == '+' || *ps->p == '-')
		neg = *ps->p++ == '-';
	if (ps->end - ps->p >= 2 && ps->p[0] == '0' &&
	    (ps->p[1] == 'x' || ps->p[1] == 'o' || ps->p[1] == 'b'))
		return perr(ps, "only decimal integers are supported "
				"(key \"%s\")", kv->key);
	while (ps->p < ps->end && (is_bare(*ps->p) || *ps->p == '.' ||
				   *ps->p == ':' || *ps->p == '+')) {
		char ch = *ps->p;

		if (ch == '_') {
			if (!nd || ps->p + 1 >= ps->end ||
			    ps->p[1] < '0' || ps->p[1] > '9')
				return perr(ps, "bad '_' in an integer (key "
						"\"%s\")", kv->key);
		} else if (ch >= '0' && ch <= '9') {
			if (nd + 1 >= sizeof(digits))
				return perr(ps, "integer out of range (key "
						"\"%s\")", kv->key);
			digits[nd++] = ch;
		} else if (ch == '.' || ch == 'e' || ch == 'E' || ch == ':' ||
			   ch == '-' || ch == 'T' || ch == '+') {
			return perr(ps, "floats and dates are not supported "
					"(key \"%s\")", kv->key);
		} else {
			return perr(ps, "expected a value for key \"%s\"",
				    kv->key);
		}
		ps->p++;
	}
	if (!nd)
		return perr(ps, "expected a value for key \"%s\"", kv->key);
	if (nd > 1 && digits[0] == '0')
		return perr(ps, "leading zeros in an integer (key \"%s\")",
			    kv->key);
	digits[nd] = '\0';
	errno = 0;
	kv->i = strtoll(digits, &endp, 10);
	if (errno == ERANGE)
		return perr(ps, "integer out of range (key \"%s\")", kv->key);
	if (neg)
		kv->i = -kv->i;
	kv->type = TOML_MIN_INT;
	return 0;
}

static int parse_value(struct parser *ps, struct toml_min_kv *kv)
{
	char ch;

	if (ps->p >= ps->end || *ps->p == '#')
		return perr(ps, "expected a value for key \"%s\"", kv->key);
	ch = *ps->p;
	if (ch == '"' || ch == '\'') {
		char what[96];

		snprintf(what, sizeof(what), "value of key \"%.60s\"",
			 kv->key);
		kv->type = TOML_MIN_STRING;
		return parse_string(ps, &kv->str, what);
	}
	if (ch == '[')
		return perr(ps, "arrays are not supported (key \"%s\")",
			    kv->key);
	if (ch == '{')
		return perr(ps, "inline tables are not supported (key "
				"\"%s\")", kv->key);
	if (ps->end - ps->p >= 4 && !strncmp(ps->p, "true", 4) &&
	    (ps->end - ps->p == 4 || !is_bare(ps->p[4]))) {
		ps->p += 4;
		kv->type = TOML_MIN_BOOL;
		kv->b = true;
		return 0;
	}
	if (ps->end - ps->p >= 5 && !strncmp(ps->p, "false", 5) &&
	    (ps->end - ps->p == 5 || !is_bare(ps->p[5]))) {
		ps->p += 5;
		kv->type = TOML_MIN_BOOL;
		kv->b = false;
		return 0;
	}
	if ((ch >= '0' && ch <= '9') || ch == '+' || ch == '-') {
		if (ps->end - ps->p >= 4 &&
		    (!strncmp(ps->p + 1, "inf", 3) ||
		     !strncmp(ps->p + 1, "nan", 3)))
			return perr(ps, "floats are not supported (key "
					"\"%s\")", kv->key);
		return parse_int(ps, kv);
	}
	if (ps->end - ps->p >= 3 &&
	    (!strncmp(ps->p, "inf", 3) || !strncmp(ps->p, "nan", 3)))
		return perr(ps, "floats are not supported (key \"%s\")",
			    kv->key);
	return perr(ps, "expected a value (string, boolean or integer) for "
			"key \"%s\"", kv->key);
}

static int parse_kv(struct parser *ps)
{
	struct toml_min_kv kv = {0};
	struct toml_min_table *t = ps->cur;
	int rc;

	kv.line = ps->line;
	rc = parse_key(ps, &kv.key, "key");
	if (rc < 0)
		return rc;
	if (ps->p >= ps->end || *ps->p != '=') {
		rc = perr(ps, "expected '=' after key \"%s\"", kv.key);
		goto fail;
	}
	ps->p++;
	skip_ws(ps);
	rc = parse_value(ps, &kv);
	if (rc < 0)
		goto fail;
	rc = expect_eol(ps, "the value");
	if (rc < 0)
		goto fail;
	for (size_t i = 0; i < t->nkv; i++)
		if (!strcmp(t->kv[i].key, kv.key)) {
			rc = perr(ps, "key \"%s\" defined twice (first on "
				      "line %d)", kv.key, t->kv[i].line);
			goto fail;
		}
	t->kv = sbx_xrealloc(t->kv, (t->nkv + 1) * sizeof(*t->kv));
	t->kv[t->nkv++] = kv;
	return 0;
fail:
	free(kv.key);
	if (kv.str) {
		memset(kv.str, 0, strlen(kv.str));
		free(kv.str);
	}
	return rc;
}

int toml_min_parse(struct toml_min_doc *out, const char *text, size_t len,
		   const char *what)
{
	struct parser ps = {.what = what ? what : "(toml)", .doc = out};
	const char *s = text, *end = text + len;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	ps.cur = add_table(out, "", 0);
	/* A UTF-8 byte order mark is allowed at the start. */
	if (len >= 3 && !memcmp(s, "\xef\xbb\xbf", 3))
		s += 3;
	while (s < end) {
		const char *nl = memchr(s, '\n', (size_t)(end - s));
		size_t n = (size_t)((nl ? nl : end) - s);

		if (n && s[n - 1] == '\r')
			n--;
		ps.line++;
		ps.p = s;
		ps.end = s + n;
		if (memchr(s, '\0', n)) {
			rc = perr(&ps, "NUL byte (not a text file?)");
			break;
		}
		skip_ws(&ps);
		if (ps.p >= ps.end || *ps.p == '#')
			rc = expect_eol(&ps, "a comment");
		else if (*ps.p == '[')
			rc = parse_table(&ps);
		else
			rc = parse_kv(&ps);
		if (rc < 0)
			break;
		s = nl ? nl + 1 : end;
	}
	if (rc < 0) {
		/* ps.cur points into out: keep the error, drop the doc. */
		toml_min_fini(out);
	}
	return rc;
}

int toml_min_parse_file(struct toml_min_doc *out, const char *path)
{
	struct stat st;
	char *buf = NULL;
	size_t len = 0;
	int fd, rc;

	memset(out, 0, sizeof(*out));
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return sbx_error_os("cannot open %s", path);
	if (fstat(fd, &st) < 0) {
		rc = sbx_error_os("cannot stat %s", path);
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "%s is not a regular file", path);
		goto out;
	}
	if (st.st_size > TOML_MIN_MAX_FILE) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EFBIG,
				   "%s is larger than %d bytes: not a Modal "
				   "config file", path, TOML_MIN_MAX_FILE);
		goto out;
	}
	buf = sbx_xmalloc((size_t)st.st_size + 1);
	while (len < (size_t)st.st_size) {
		ssize_t r = read(fd, buf + len, (size_t)st.st_size - len);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = sbx_error_os("cannot read %s", path);
			goto out;
		}
		if (!r)
			break;
		len += (size_t)r;
	}
	rc = toml_min_parse(out, buf, len, path);
out:
	if (buf) {
		memset(buf, 0, len);
		free(buf);
	}
	close(fd);
	return rc;
}

void toml_min_fini(struct toml_min_doc *doc)
{
	if (!doc)
		return;
	for (size_t i = 0; i < doc->ntables; i++) {
		struct toml_min_table *t = &doc->tables[i];

		for (size_t j = 0; j < t->nkv; j++) {
			free(t->kv[j].key);
			if (t->kv[j].str) {
				memset(t->kv[j].str, 0, strlen(t->kv[j].str));
				free(t->kv[j].str);
			}
		}
		free(t->kv);
		free(t->name);
	}
	free(doc->tables);
	memset(doc, 0, sizeof(*doc));
}

const struct toml_min_table *toml_min_table(const struct toml_min_doc *doc,
					    const char *name)
{
	for (size_t i = 0; doc && i < doc->ntables; i++)
		if (!strcmp(doc->tables[i].name, name))
			return &doc->tables[i];
	return NULL;
}

const struct toml_min_kv *toml_min_get(const struct toml_min_table *t,
				       const char *key)
{
	for (size_t i = 0; t && i < t->nkv; i++)
		if (!strcmp(t->kv[i].key, key))
			return &t->kv[i];
	return NULL;
}
