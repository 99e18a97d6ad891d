/*
 * Exec messages of the agent protocol; see sbx/proto_exec.h.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/proto.h"
#include "sbx/proto_exec.h"
#include "sbx/xmalloc.h"

/* Integers that survive a double: [0, 2^53]. */
#define SEQ_MAX 9007199254740992.0

static cJSON *new_object(void)
{
	cJSON *o = cJSON_CreateObject();

	if (!o)
		abort();
	return o;
}

static cJSON *str_array(const char *const *v)
{
	cJSON *a = cJSON_CreateArray();

	if (!a)
		abort();
	for (size_t i = 0; v && v[i]; i++)
		cJSON_AddItemToArray(a, cJSON_CreateString(v[i]));
	return a;
}

/* ---- start request ------------------------------------------------------ */

cJSON *sbx_exec_start_encode(const struct sbx_exec_start_msg *m)
{
	cJSON *b = new_object();

	cJSON_AddItemToObject(b, "argv", str_array(m->argv));
	sbx_json_set_str(b, "cwd", m->cwd ? m->cwd : "");
	if (m->envp)
		cJSON_AddItemToObject(b, "env", str_array(m->envp));
	cJSON_AddBoolToObject(b, "tty", m->tty);
	if (m->tty && m->rows && m->cols) {
		cJSON_AddNumberToObject(b, "rows", m->rows);
		cJSON_AddNumberToObject(b, "cols", m->cols);
	}
	cJSON_AddBoolToObject(b, "attach", m->attach);
	/* Older agents ignore it (their own umask applies). */
	if (m->umask >= 0)
		cJSON_AddNumberToObject(b, "umask", m->umask & 0777);
	/* Path identity (docs/protocol.md, "Exec"); older agents ignore it. */
	if (m->alias)
		sbx_json_set_str(b, "alias", m->alias);
	return b;
}

/* A JSON array of strings into a malloc'd NULL-terminated vector. */
static int strv_decode(const char ***out, const cJSON *arr, const char *key,
		       bool kv)
{
	const cJSON *it;
	size_t i = 0;
	int n;

	if (!cJSON_IsArray(arr) || (n = cJSON_GetArraySize(arr)) < (kv ? 0 : 1) ||
	    n > SBX_EXEC_MAX_ARGS)
		return kv ? sbx_error_set(SBX_ERR_PROTO, -EINVAL,
					  "exec: \"%s\" must be an array of "
					  "\"K=V\" strings", key)
			  : sbx_error_set(SBX_ERR_PROTO, -EINVAL,
					  "exec: \"%s\" must be a non-empty "
					  "array of strings", key);
	*out = sbx_xcalloc((size_t)n + 1, sizeof(char *));
	cJSON_ArrayForEach(it, arr)
	{
		const char *s = cJSON_IsString(it) ? it->valuestring : NULL;

		if (!s)
			return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
					     "exec: %s[%zu] is not a string",
					     key, i);
		if (kv && (!strchr(s, '=') || s[0] == '='))
			return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
					     "exec: %s[%zu] is not \"K=V\"",
					     key, i);
		(*out)[i++] = s;
	}
	return 0;
}

int sbx_exec_start_decode(const cJSON *doc, struct sbx_exec_start_msg *out)
{
	const cJSON *env = cJSON_GetObjectItemCaseSensitive(doc, "env");
	long long rows, cols, um;
	int rc;

	memset(out, 0, sizeof(*out));
	out->umask = -1;
	rc = strv_decode(&out->argv, cJSON_GetObjectItemCaseSensitive(doc,
								      "argv"),
			 "argv", false);
	if (rc < 0)
		return rc;
	if (!*out->argv[0])
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "exec: argv[0] is empty");
	if (env && !cJSON_IsNull(env)) {
		rc = strv_decode(&out->envp, env, "env", true);
		if (rc < 0)
			return rc;
	}
	rc = sbx_json_get_string(&out->cwd, doc, "cwd", "exec");
	if (rc == 0)
		rc = sbx_json_get_bool(&out->tty, doc, "tty", false, "exec");
	if (rc == 0)
		rc = sbx_json_get_bool(&out->attach, doc, "attach", false,
				       "exec");
	if (rc == 0)
		rc = sbx_json_get_int(&rows, doc, "rows", 0, "exec");
	if (rc == 0)
		rc = sbx_json_get_int(&cols, doc, "cols", 0, "exec");
	if (rc == 0)
		rc = sbx_json_get_int(&um, doc, "umask", -1, "exec");
	if (rc == 0)
		rc = sbx_json_get_string(&out->alias, doc, "alias", "exec");
	if (rc < 0)
		return rc;
	if (um < -1 || um > 0777)
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "exec: umask out of range");
	if (rows < 0 || rows > 65535 || cols < 0 || cols > 65535)
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "exec: rows/cols out of range");
	out->umask = (int)um;
	out->rows = (unsigned short)rows;
	out->cols = (unsigned short)cols;
	return 0;
}

void sbx_exec_start_fini(struct sbx_exec_start_msg *m)
{
	if (!m)
		return;
	free(m->argv);
	free(m->envp);
	memset(m, 0, sizeof(*m));
}

/* ---- output frames ------------------------------------------------------ */

cJSON *sbx_exec_exit_encode(int status)
{
	cJSON *e = new_object();
	int code = 0, sig = 0;

	if (WIFEXITED(status)) {
		code = WEXITSTATUS(status);
	} else if (WIFSIGNALED(status)) {
		sig = WTERMSIG(status);
		code = 128 + sig;
	}
	cJSON_AddNumberToObject(e, "code", code);
	cJSON_AddNumberToObject(e, "signal", sig);
	return e;
}

int sbx_exec_exit_decode(const cJSON *exit_obj, int *status)
{
	const cJSON *code = cJSON_GetObjectItemCaseSensitive(exit_obj, "code");
	const cJSON *sig = cJSON_GetObjectItemCaseSensitive(exit_obj,
							   "signal");

	*status = 0;
	if (!cJSON_IsObject(exit_obj) || !cJSON_IsNumber(code))
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "exec: malformed \"exit\" object");
	if (cJSON_IsNumber(sig) && sig->valuedouble > 0 &&
	    sig->valuedouble < 128) {
		*status = (int)sig->valuedouble & 0x7f;
		return 0;
	}
	if (code->valuedouble < 0 || code->valuedouble > 255)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "exec: exit code out of range");
	*status = ((int)code->valuedouble & 0xff) << 8;
	return 0;
}

cJSON *sbx_exec_frame_encode(const struct sbx_exec_frame *f)
{
	cJSON *h = new_object(), *l;

	switch (f->kind) {
	case SBX_EXEC_FRAME_STARTED:
		sbx_json_set_str(h, "id", f->id);
		cJSON_AddNumberToObject(h, "pid", (double)f->pid);
		break;
	case SBX_EXEC_FRAME_OUTPUT:
		cJSON_AddNumberToObject(h, "seq", (double)f->seq);
		sbx_json_set_str(h, "stream", f->stream ? "stderr" : "stdout");
		break;
	case SBX_EXEC_FRAME_LOST:
		l = cJSON_AddObjectToObject(h, "lost");
		cJSON_AddNumberToObject(l, "from", (double)f->from);
		cJSON_AddNumberToObject(l, "to", (double)f->to);
		break;
	case SBX_EXEC_FRAME_EXIT:
		cJSON_AddItemToObject(h, "exit", sbx_exec_exit_encode(f->status));
		cJSON_AddNumberToObject(h, "watch_seq", (double)f->watch_seq);
		break;
	case SBX_EXEC_FRAME_END:
		cJSON_AddBoolToObject(h, "end", 1);
		break;
	default:
		break;
	}
	return h;
}

/* An integer in [0, 2^53], or false. */
static bool get_u64(const cJSON *o, const char *key, uint64_t *out)
{
	const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, key);

	if (!cJSON_IsNumber(n) || n->valuedouble < 0 ||
	    n->valuedouble > SEQ_MAX ||
	    n->valuedouble != floor(n->valuedouble))
		return false;
	*out = (uint64_t)n->valuedouble;
	return true;
}

int sbx_exec_frame_decode(const cJSON *hdr, struct sbx_exec_frame *out)
{
	const cJSON *ex = cJSON_GetObjectItemCaseSensitive(hdr, "exit");
	const cJSON *lost = cJSON_GetObjectItemCaseSensitive(hdr, "lost");
	const char *stream = sbx_json_str(hdr, "stream");
	const char *id = sbx_json_str(hdr, "id");

	memset(out, 0, sizeof(*out));
	if (lost) {
		out->kind = SBX_EXEC_FRAME_LOST;
		if (!get_u64(lost, "from", &out->from) ||
		    !get_u64(lost, "to", &out->to))
			out->from = out->to = 0; /* informational only */
		return 0;
	}
	if (id) {
		const cJSON *pid = cJSON_GetObjectItemCaseSensitive(hdr, "pid");

		out->kind = SBX_EXEC_FRAME_STARTED;
		out->id = id;
		out->pid = cJSON_IsNumber(pid) ? (long long)pid->valuedouble
					       : 0;
		return 0;
	}
	if (stream) {
		out->kind = SBX_EXEC_FRAME_OUTPUT;
		if (!get_u64(hdr, "seq", &out->seq))
			return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					     "exec output: frame without "
					     "\"seq\"");
		/* Anything but "stderr" is the main output stream. */
		out->stream = !strcmp(stream, "stderr");
		return 0;
	}
	if (ex) {
		out->kind = SBX_EXEC_FRAME_EXIT;
		out->has_watch_seq = get_u64(hdr, "watch_seq", &out->watch_seq);
		return sbx_exec_exit_decode(ex, &out->status);
	}
	if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(hdr, "end")))
		out->kind = SBX_EXEC_FRAME_END;
	return 0;
}

/* ---- control requests --------------------------------------------------- */

cJSON *sbx_exec_resize_encode(unsigned short rows, unsigned short cols)
{
	cJSON *b = new_object();

	cJSON_AddNumberToObject(b, "rows", rows);
	cJSON_AddNumberToObject(b, "cols", cols);
	return b;
}

int sbx_exec_resize_decode(const cJSON *doc, unsigned short *rows,
			   unsigned short *cols)
{
	long long r = 0, c = 0;
	int rc;

	*rows = *cols = 0;
	rc = sbx_json_get_int(&r, doc, "rows", 0, "resize");
	if (rc == 0)
		rc = sbx_json_get_int(&c, doc, "cols", 0, "resize");
	if (rc < 0)
		return rc;
	if (r < 1 || r > 65535 || c < 1 || c > 65535)
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "resize: rows and cols must be 1-65535");
	*rows = (unsigned short)r;
	*cols = (unsigned short)c;
	return 0;
}

cJSON *sbx_exec_signal_encode(int sig)
{
	const char *name = sbx_proto_signal_name(sig);
	cJSON *b;

	if (!name)
		return NULL;
	b = new_object();
	sbx_json_set_str(b, "signal", name);
	return b;
}

int sbx_exec_signal_decode(const cJSON *doc, int *sig)
{
	const char *name = NULL;
	int rc = sbx_json_get_string(&name, doc, "signal", "signal");

	*sig = 0;
	if (rc < 0)
		return rc;
	*sig = sbx_proto_signal_from_name(name);
	if (!*sig)
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "signal: unknown signal \"%s\"",
				     name ? name : "");
	return 0;
}
