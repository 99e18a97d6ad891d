/*
 * toml_min: a reader for the small TOML subset of Modal's ~/.modal.toml.
 *
 * Accepted: blank lines, comments ('#' to the end of a line), table headers
 * `[name]` and `["quoted name"]` / `['literal name']`, and `key = value`
 * lines with a bare or quoted key and a value that is a basic string
 * ("..." with \b \t \n \f \r \" \\ \uXXXX \UXXXXXXXX escapes), a literal
 * string ('...'), a boolean (true/false) or a decimal integer (optional
 * sign, '_' between digits).  Keys before the first table header belong to
 * the table "" (the root).
 *
 * Rejected with an error naming the file and line: arrays, inline tables,
 * multi-line strings, dotted keys, arrays of tables, floats and dates,
 * duplicate keys or tables, anything malformed.  Errors are SBX_ERR_CONFIG
 * with -EINVAL.  The error messages quote keys and table names but never
 * values (they may be secrets).
 */
#ifndef SBX_MODAL_TOML_MIN_H
#define SBX_MODAL_TOML_MIN_H

#include <stdbool.h>
#include <stddef.h>

#include "sbx/error.h"

enum toml_min_type {
	TOML_MIN_STRING,
	TOML_MIN_BOOL,
	TOML_MIN_INT,
};

struct toml_min_kv {
	char *key;
	enum toml_min_type type;
	char *str;      /* TOML_MIN_STRING: the decoded value */
	bool b;         /* TOML_MIN_BOOL */
	long long i;    /* TOML_MIN_INT */
	int line;       /* 1-based line of the definition */
};

struct toml_min_table {
	char *name;     /* "" for the root table */
	int line;       /* line of the header; 0 for the root */
	struct toml_min_kv *kv;
	size_t nkv;
};

struct toml_min_doc {
	struct toml_min_table *tables; /* [0] is the root table */
	size_t ntables;
};

/*
 * Parse `len` bytes of `text`.  `what` names the source in error messages
 * (a file path).  Returns 0 and fills *out (free with toml_min_fini()), or
 * -EINVAL (SBX_ERR_CONFIG: "<what>:<line>: <problem>"); *out is then empty.
 */
SBX_WUR int toml_min_parse(struct toml_min_doc *out, const char *text,
			   size_t len, const char *what);

/*
 * Read and parse the file `path`.  Returns 0, -ENOENT (no such file;
 * SBX_ERR_OS), another negative errno from reading (SBX_ERR_OS) or -EINVAL
 * as toml_min_parse().
 */
SBX_WUR int toml_min_parse_file(struct toml_min_doc *out, const char *path);

/* Free what a parse filled (NULL and empty documents are fine).  String
 * values are wiped before they are freed. */
void toml_min_fini(struct toml_min_doc *doc);

/* The table `name` ("" for the root), or NULL.  Borrowed. */
const struct toml_min_table *toml_min_table(const struct toml_min_doc *doc,
					    const char *name);

/* The key `key` of table `t` (NULL is fine), or NULL.  Borrowed. */
const struct toml_min_kv *toml_min_get(const struct toml_min_table *t,
				       const char *key);

#endif
