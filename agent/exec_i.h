/*
 * Private to the agent's exec: the process table and output buffers
 * (exec_proc.c) shared with the exec routes (handlers_exec.c).  See
 * exec_proc.c for the buffering rules and docs/protocol.md, "Exec".
 *
 * Locking: execs->lock (the table) before proc->lock (chunks, state);
 * proc->in_lock (stdin fd, resize) is never held with either.  A proc is
 * reference counted: the table, the pump thread and every handler or
 * stream using it hold one.
 */
#ifndef SBX_AGENT_EXEC_I_H
#define SBX_AGENT_EXEC_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "sbx/error.h"

#include "agent_i.h"

struct sbx_exec_start_msg;

struct agent_chunk {
	int stream; /* 0 stdout, 1 stderr */
	bool sent;  /* handed to a client at least once */
	size_t len;
	unsigned char data[];
};

struct agent_proc {
	char id[33];
	pid_t pid;
	int pidfd;
	bool tty;
	struct agent *a;
	atomic_int refs;
	int wake_fd; /* eventfd: space freed, or deleted */
	int out_fd[2]; /* pump thread only */

	pthread_mutex_t in_lock;
	int in_fd; /* protected by in_lock; tty: a dup of the master */

	pthread_mutex_t lock;
	pthread_cond_t cond;
	/* protected by lock: */
	struct agent_chunk **chunks; /* chunks[head + i] has seq base_seq + i */
	size_t head, n, cap;
	uint64_t base_seq;
	uint64_t last_seq;
	uint64_t dropped; /* highest sequence freed */
	size_t unsent[2];
	size_t sent_bytes;
	bool reaped;
	int status;
	bool finished; /* output drained, status and watch_seq valid */
	uint64_t watch_seq;
	uint64_t finish_ns;
	bool deleted;
};

struct agent_execs {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct agent_proc **v; /* protected by lock */
	size_t n, cap;   /* protected by lock */
	int pumps;       /* protected by lock: live pump threads */
};

/* References (agent_proc_put frees on the last one; NULL is fine). */
void agent_proc_get(struct agent_proc *p);
void agent_proc_put(struct agent_proc *p);

/*
 * Start the process `m` describes in `cwd` (normalised, relative to the
 * root) and register it with its pump thread.  *out holds a reference for
 * the caller.  Errors: -EAGAIN (SBX_ERR_STATE) with too many processes
 * kept; the working directory's errors; sbx_spawn_start()'s
 * (sbx/spawn.h: -ENOENT "command not found" ...).
 */
SBX_WUR int agent_proc_start(struct agent *a,
			     const struct sbx_exec_start_msg *m,
			     const char *cwd, struct agent_proc **out);

/* The process `id` with a reference, or NULL (-ENOENT recorded). */
struct agent_proc *agent_proc_lookup(struct agent *a, const char *id);

/* Kill it if it runs, end its streams, and drop it from the table. */
void agent_proc_delete(struct agent_proc *p);
void agent_proc_unlink(struct agent *a, struct agent_proc *p);

/* Output buffer; called with p->lock held. */
struct agent_chunk *agent_proc_chunk(struct agent_proc *p, uint64_t seq);
/* The client holds everything up to `seq`: free it. */
void agent_proc_ack(struct agent_proc *p, uint64_t seq);
/* Mark a chunk handed out (kept for re-attach up to REPLAY_MAX). */
void agent_proc_mark_sent(struct agent_proc *p, struct agent_chunk *c);

#endif
