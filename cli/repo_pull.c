/*
 * Pulling a sandbox's branch (repo_i.h; docs/design.md, "Repository in
 * and out").
 *
 * Round trips: one repo_state (HEAD, sbx/NAME, the loose objects, the
 * packs), one repo_objects for the loose objects this repository lacks
 * plus the .idx of any pack the sandbox made itself (git gc), and only
 * when the history is still incomplete one more for the packs that hold
 * what is missing.  The seed's pack (its .keep says "sbx seed") holds
 * nothing new and is never fetched unless objects turn out missing.
 *
 * Nothing from the sandbox is trusted: a loose object is inflated and
 * hashed before it is written (its name must be its id), a pack goes
 * through libgit2's indexer, and the new head's history must be complete
 * in this repository (every object reachable from it through objects that
 * arrived now exists) before any ref is set.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <git2.h>
#include <git2/sys/odb_backend.h>
#include <zlib.h>

#include "sbx/json.h"
#include "sbx/buf.h"
#include "sbx/log.h"
#include "sbx/provider.h"
#include "sbx/xmalloc.h"
#include "sbx/gitsource.h"
#include "repo_i.h"

#define LOOSE_MAX (1024u * 1024 * 1024)
#define IDX_MAX (512u * 1024 * 1024)

const char *cli_pull_outcome_name(int outcome)
{
	switch (outcome) {
	case CLI_PULL_NO_REPO: return "no-repository";
	case CLI_PULL_NO_BRANCH: return "no-branch";
	case CLI_PULL_UP_TO_DATE: return "up-to-date";
	case CLI_PULL_CREATED: return "created";
	case CLI_PULL_FAST_FORWARD: return "fast-forward";
	case CLI_PULL_AHEAD: return "ahead";
	}
	return "unknown";
}

/* ---- receiving ----------------------------------------------------------- */

struct pack_in {
	char *name;           /* "pack-<hex>" */
	git_oid *ids;         /* from its .idx */
	size_t nids;
	bool want;            /* fetch the .pack */
};

struct recv {
	git_repository *repo;
	git_odb *odb;
	struct cli_oidset fresh;  /* every object that arrived now */
	struct pack_in *packs;
	size_t npacks;
	/* the file being received */
	char *name;
	struct sbx_buf buf;
	git_odb_writepack *wp;
	git_indexer_progress stats;
	uint64_t objects, bytes;
	int rc;
};

/* Inflate a loose object file and check that it is what its name says. */
static int take_loose(struct recv *r, const char *name, const void *data,
		      size_t len)
{
	z_stream z;
	struct sbx_buf out;
	unsigned char chunk[65536];
	char hex[GIT_OID_HEXSZ + 1];
	git_oid want, got;
	git_object_t type;
	const char *raw, *nul, *sp;
	size_t rawlen, hdr;
	unsigned long long size;
	int zrc, rc = 0;

	memcpy(hex, name, 2);
	memcpy(hex + 2, name + 3, 38);
	hex[40] = '\0';
	if (git_oid_fromstr(&want, hex) < 0)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "bad object name %s", name);
	memset(&z, 0, sizeof(z));
	if (inflateInit(&z) != Z_OK)
		return sbx_error_set(SBX_ERR_INTERNAL, -ENOMEM, "inflateInit");
	sbx_buf_init(&out, LOOSE_MAX);
	z.next_in = (unsigned char *)data;
	z.avail_in = (uInt)len;
	do {
		z.next_out = chunk;
		z.avail_out = sizeof(chunk);
		zrc = inflate(&z, Z_NO_FLUSH);
		if (zrc != Z_OK && zrc != Z_STREAM_END) {
			rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					   "object %s from the sandbox is not "
					   "a valid loose object (zlib %d)",
					   hex, zrc);
			break;
		}
		if (sbx_buf_add(&out, chunk, sizeof(chunk) - z.avail_out) <
		    0) {
			rc = sbx_error_set(SBX_ERR_PROTO, -EFBIG,
					   "object %s is larger than %u bytes",
					   hex, LOOSE_MAX);
			break;
		}
	} while (zrc != Z_STREAM_END && (z.avail_in || !z.avail_out));
	inflateEnd(&z);
	if (rc == 0 && zrc != Z_STREAM_END)
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "object %s from the sandbox is truncated",
				   hex);
	if (rc < 0)
		goto out;
	raw = sbx_buf_ptr(&out);
	rawlen = sbx_buf_len(&out);
	nul = memchr(raw, '\0', rawlen < 64 ? rawlen : 64);
	sp = nul ? memchr(raw, ' ', (size_t)(nul - raw)) : NULL;
	if (!sp) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "object %s from the sandbox has no header",
				   hex);
		goto out;
	}
	{
		char tname[16];
		size_t tl = (size_t)(sp - raw);

		if (tl >= sizeof(tname))
			tl = sizeof(tname) - 1;
		memcpy(tname, raw, tl);
		tname[tl] = '\0';
		type = git_object_string2type(tname);
	}
	size = strtoull(sp + 1, NULL, 10);
	hdr = (size_t)(nul - raw) + 1;
	if (type == GIT_OBJECT_INVALID || size != rawlen - hdr) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "object %s from the sandbox has a bad "
				   "header", hex);
		goto out;
	}
	if (git_odb_hash(&got, raw + hdr, (size_t)size, type) < 0 ||
	    !git_oid_equal(&got, &want)) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "object %s from the sandbox is corrupt (its "
				   "content hashes to %s)",
				   hex, git_oid_tostr_s(&got));
		goto out;
	}
	rc = git_odb_write(&got, r->odb, raw + hdr, (size_t)size, type);
	if (rc < 0) {
		rc = sbx_git_fail(rc, "cannot store object %s", hex);
		goto out;
	}
	cli_oidset_add(&r->fresh, &want);
	r->objects++;
out:
	sbx_buf_fini(&out);
	return rc;
}

/* The object ids in a pack's .idx. */
static int parse_idx(struct pack_in *p, const unsigned char *d, size_t len)
{
	int rc = cli_idx_oids(&p->ids, &p->nids, d, len);

	if (rc < 0)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "%s.idx from the sandbox is malformed",
				     p->name);
	return 0;
}

static struct pack_in *pack_by_file(struct recv *r, const char *name)
{
	for (size_t i = 0; i < r->npacks; i++)
		if (strncmp(name + 5, r->packs[i].name,
			    strlen(r->packs[i].name)) == 0)
			return &r->packs[i];
	return NULL;
}

static int on_object(const char *name, uint64_t size, uint64_t offset,
		     const void *data, size_t len, int err, void *payload)
{
	struct recv *r = payload;
	bool is_pack = strncmp(name, "pack/", 5) == 0;
	size_t nl = strlen(name);
	int rc = 0;

	if (err < 0) {
		/* A loose object packed meanwhile: the history check finds
		 * out whether it matters. */
		sbx_debug("pull: %s: %s", name, sbx_error_last()->msg);
		sbx_error_clear();
		return 0;
	}
	r->bytes += len;
	if (is_pack && nl > 5 && strcmp(name + nl - 5, ".pack") == 0) {
		if (offset == 0) {
			if (r->wp)
				r->wp->free(r->wp);
			r->wp = NULL;
			memset(&r->stats, 0, sizeof(r->stats));
			rc = git_odb_write_pack(&r->wp, r->odb, NULL, NULL);
			if (rc < 0)
				return sbx_git_fail(rc, "cannot receive %s",
						    name);
		}
		if (!r->wp)
			return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					     "%s: data without a start", name);
		if (len) {
			rc = r->wp->append(r->wp, data, len, &r->stats);
			if (rc < 0)
				return sbx_git_fail(rc, "cannot receive %s",
						    name);
		}
		if (offset + len >= size) {
			struct pack_in *p = pack_by_file(r, name);

			rc = r->wp->commit(r->wp, &r->stats);
			r->wp->free(r->wp);
			r->wp = NULL;
			if (rc < 0)
				return sbx_git_fail(rc, "%s from the sandbox "
						    "is not a valid pack",
						    name);
			r->objects += r->stats.indexed_objects;
			for (size_t i = 0; p && i < p->nids; i++)
				cli_oidset_add(&r->fresh, &p->ids[i]);
		}
		return 0;
	}
	/* loose objects and .idx files: whole, then handled */
	if (offset == 0) {
		sbx_buf_fini(&r->buf);
		sbx_buf_init(&r->buf, is_pack ? IDX_MAX : LOOSE_MAX);
	}
	if (len && sbx_buf_add(&r->buf, data, len) < 0)
		return sbx_error_set(SBX_ERR_PROTO, -EFBIG, "%s is too large",
				     name);
	if (offset + len < size)
		return 0;
	if (is_pack) {
		struct pack_in *p = pack_by_file(r, name);

		if (p)
			rc = parse_idx(p,
				       (const unsigned char *)sbx_buf_ptr(
					       &r->buf),
				       sbx_buf_len(&r->buf));
	} else {
		rc = take_loose(r, name, sbx_buf_ptr(&r->buf),
				sbx_buf_len(&r->buf));
	}
	sbx_buf_reset(&r->buf);
	return rc;
}

/* ---- the history check --------------------------------------------------- */

/*
 * Is everything reachable from `tip` here?  Objects that did not arrive
 * now were complete before (this repository's invariant); the walk only
 * goes through the new ones.  *missing (may be NULL) gets the first
 * missing object.  Returns 1 complete, 0 incomplete, < 0 an error.
 */
static int complete(struct recv *r, const git_oid *tip, git_oid *missing)
{
	struct cli_oidset seen = { 0 };
	git_oid *queue = NULL;
	size_t qn = 0, qcap = 0;
	int rc = 1;

#define PUSH(id)                                                        \
	do {                                                            \
		if (!cli_oidset_has(&seen, (id))) {                     \
			cli_oidset_add(&seen, (id));                    \
			if (qn == qcap) {                               \
				qcap = qcap ? 2 * qcap : 64;            \
				queue = sbx_xrealloc(                   \
					queue, qcap * sizeof(*queue));  \
			}                                               \
			git_oid_cpy(&queue[qn++], (id));                \
		}                                                       \
	} while (0)

	PUSH(tip);
	while (qn && rc == 1) {
		git_oid id;
		git_object *o = NULL;

		git_oid_cpy(&id, &queue[--qn]);
		if (!git_odb_exists(r->odb, &id)) {
			if (missing)
				git_oid_cpy(missing, &id);
			rc = 0;
			break;
		}
		if (!cli_oidset_has(&r->fresh, &id) && !git_oid_equal(&id, tip))
			continue; /* was here before: complete */
		if (git_object_lookup(&o, r->repo, &id, GIT_OBJECT_ANY) < 0) {
			rc = sbx_git_fail(-1, "cannot read object %s",
					  git_oid_tostr_s(&id));
			break;
		}
		switch (git_object_type(o)) {
		case GIT_OBJECT_COMMIT: {
			const git_commit *c = (const git_commit *)o;

			PUSH(git_commit_tree_id(c));
			for (unsigned i = 0; i < git_commit_parentcount(c); i++)
				PUSH(git_commit_parent_id(c, i));
			break;
		}
		case GIT_OBJECT_TREE: {
			const git_tree *t = (const git_tree *)o;

			for (size_t i = 0; i < git_tree_entrycount(t); i++) {
				const git_tree_entry *e =
					git_tree_entry_byindex(t, i);

				if (git_tree_entry_type(e) != GIT_OBJECT_COMMIT)
					PUSH(git_tree_entry_id(e));
			}
			break;
		}
		case GIT_OBJECT_TAG:
			PUSH(git_tag_target_id((const git_tag *)o));
			break;
		default:
			break;
		}
		git_object_free(o);
	}
#undef PUSH
	/* A shallow sandbox's boundary parents are here (they came from
	 * this repository), so no special case is needed. */
	free(queue);
	cli_oidset_fini(&seen);
	return rc;
}

/* ---- pull ---------------------------------------------------------------- */

static bool seeded_keep(const struct sbx_repo_pack *p)
{
	return p->keep && strncmp(p->keep, "sbx seed", 8) == 0;
}

static int fetch(struct recv *r, struct sbx_sandbox *sb, const char **names,
		 size_t n, unsigned *requests)
{
	int rc;

	if (!n)
		return 0;
	rc = sb->ops->repo_objects(sb, "", names, n, on_object, r);
	(*requests)++;
	if (r->wp) {
		r->wp->free(r->wp);
		r->wp = NULL;
	}
	return rc;
}

/*
 * The object names of one repo_objects request.  `owned` keeps every name
 * made until receive() ends; `names` is the current round's list.  Both
 * have room for the most names all rounds together can ask for (every
 * loose object, and an .idx and a .pack of every pack).
 */
struct wants {
	const char **names;
	size_t n;
	char **owned;
	size_t no;
};

static void want(struct wants *w, char *name)
{
	w->owned[w->no++] = name;
	w->names[w->n++] = name;
}

/*
 * Ask for this round's names, then walk tip's history: 1 when it is
 * complete, 0 with *missing when not, or an error.  Empties the list for
 * the next round.
 */
static int round_trip(struct recv *r, struct sbx_sandbox *sb,
		      struct wants *w, const git_oid *tip, git_oid *missing,
		      unsigned *requests)
{
	int rc = fetch(r, sb, w->names, w->n, requests);

	w->n = 0;
	if (rc < 0)
		return rc;
	return complete(r, tip, missing);
}

static int receive(struct recv *r, struct sbx_sandbox *sb,
		   const struct sbx_repo_state *st, const git_oid *tip,
		   unsigned *requests)
{
	size_t cap = st->nloose + 2 * st->npacks + 1;
	struct wants w = {
		.names = sbx_xcalloc(cap, sizeof(char *)),
		.owned = sbx_xcalloc(cap, sizeof(char *)),
	};
	git_oid id, missing;
	int rc;

	/* Round 1: the loose objects we lack, the .idx of unknown packs. */
	for (size_t i = 0; i < st->nloose; i++) {
		if (git_oid_fromstr(&id, st->loose[i]) < 0 ||
		    git_odb_exists(r->odb, &id))
			continue;
		want(&w, sbx_xasprintf("%.2s/%s", st->loose[i],
				       st->loose[i] + 2));
	}
	r->packs = sbx_xcalloc(st->npacks + 1, sizeof(*r->packs));
	for (size_t i = 0; i < st->npacks; i++) {
		struct pack_in *p = &r->packs[r->npacks++];

		p->name = sbx_xstrdup(st->packs[i].name);
		if (seeded_keep(&st->packs[i]))
			continue;
		want(&w, sbx_xasprintf("pack/%s.idx", p->name));
	}
	rc = round_trip(r, sb, &w, tip, &missing, requests);
	if (rc != 0)
		goto out;

	/* Round 2: the packs holding objects we lack (all of them when
	 * their .idx did not come: the seed's, as a last resort). */
	for (size_t i = 0; i < r->npacks; i++) {
		struct pack_in *p = &r->packs[i];
		bool need = !p->ids;

		for (size_t k = 0; !need && k < p->nids; k++)
			need = !git_odb_exists(r->odb, &p->ids[k]);
		if (!need)
			continue;
		p->want = true;
		if (!p->ids) {
			/* Its ids count as new once it arrived. */
			continue;
		}
		want(&w, sbx_xasprintf("pack/%s.pack", p->name));
	}
	rc = round_trip(r, sb, &w, tip, &missing, requests);
	if (rc != 0)
		goto out;
	/* Last resort: the seed's pack (this repository lost objects). */
	for (size_t i = 0; i < r->npacks; i++) {
		struct pack_in *p = &r->packs[i];

		if (p->ids)
			continue;
		want(&w, sbx_xasprintf("pack/%s.idx", p->name));
		want(&w, sbx_xasprintf("pack/%s.pack", p->name));
	}
	rc = round_trip(r, sb, &w, tip, &missing, requests);
	if (rc == 0)
		rc = sbx_error_set(SBX_ERR_PROTO, -EIO,
				   "the sandbox's history of %s is incomplete: "
				   "object %s is missing",
				   git_oid_tostr_s(tip),
				   git_oid_tostr_s(&missing));
out:
	for (size_t i = 0; i < w.no; i++)
		free(w.owned[i]);
	free(w.owned);
	free(w.names);
	return rc < 0 ? rc : 0;
}

static void recv_fini(struct recv *r)
{
	if (r->wp)
		r->wp->free(r->wp);
	for (size_t i = 0; i < r->npacks; i++) {
		free(r->packs[i].name);
		free(r->packs[i].ids);
	}
	free(r->packs);
	sbx_buf_fini(&r->buf);
	cli_oidset_fini(&r->fresh);
	git_odb_free(r->odb);
}

static int open_local(git_repository **out, const char *repo)
{
	int rc = git_repository_open_ext(out, repo, 0, NULL);

	if (rc == GIT_ENOTFOUND)
		return sbx_error_setd(SBX_ERR_CONFIG, -EINVAL, rc,
				      "%s is not a git repository", repo);
	if (rc < 0)
		return sbx_git_fail(rc, "cannot open the repository %s", repo);
	return 0;
}

static void short_id(char out[13], const char *hex)
{
	snprintf(out, 13, "%.12s", hex && *hex ? hex : "-");
}

/* Move (or create) sbx/NAME to `tip`, never against the user. */
static int update_branch(git_repository *repo, const char *session,
			 const git_oid *tip, struct cli_pull_result *out)
{
	char *refname = sbx_xasprintf("refs/heads/" CLI_BRANCH_PREFIX "%s",
				      session);
	char *pulled = sbx_xasprintf(CLI_PULLED_PREFIX "%s", session);
	char *msg = sbx_xasprintf("sbx pull %s", session);
	git_reference *ref = NULL, *newref = NULL;
	git_oid local;
	char a[13], b[13];
	int rc;

	/* Always recorded: the sandbox's commits are safe here. */
	rc = git_reference_create(&newref, repo, pulled, tip, 1, msg);
	git_reference_free(newref);
	newref = NULL;
	if (rc < 0) {
		rc = sbx_git_fail(rc, "cannot set %s", pulled);
		goto out;
	}
	rc = git_reference_lookup(&ref, repo, refname);
	if (rc == GIT_ENOTFOUND) {
		git_error_clear();
		rc = git_reference_create(&newref, repo, refname, tip, 0, msg);
		if (rc < 0) {
			rc = sbx_git_fail(rc, "cannot create %s", refname);
			goto out;
		}
		out->outcome = CLI_PULL_CREATED;
		goto out;
	}
	if (rc < 0) {
		rc = sbx_git_fail(rc, "cannot read %s", refname);
		goto out;
	}
	if (git_reference_type(ref) != GIT_REFERENCE_DIRECT) {
		rc = sbx_error_set(SBX_ERR_STATE, -EBUSY,
				   "%s is a symbolic reference; not touching "
				   "it (the sandbox's head is in %s)",
				   refname, pulled);
		goto out;
	}
	git_oid_cpy(&local, git_reference_target(ref));
	git_oid_tostr(out->before, sizeof(out->before), &local);
	if (git_oid_equal(&local, tip)) {
		out->outcome = CLI_PULL_UP_TO_DATE;
		rc = 0;
		goto out;
	}
	short_id(a, out->before);
	short_id(b, out->head);
	if (git_graph_descendant_of(repo, &local, tip) == 1) {
		out->outcome = CLI_PULL_AHEAD;
		rc = 0;
		goto out;
	}
	if (git_graph_descendant_of(repo, tip, &local) != 1) {
		rc = sbx_error_set(
			SBX_ERR_STATE, -EBUSY,
			"not pulled: your branch " CLI_BRANCH_PREFIX "%s (%s) "
			"and the sandbox's (%s) have diverged, and sbx never "
			"overwrites a branch; the sandbox's commits are in %s: "
			"merge them into yours (`git merge %s` with "
			CLI_BRANCH_PREFIX "%s checked out), or move yours "
			"aside (`git branch -m " CLI_BRANCH_PREFIX "%s "
			CLI_BRANCH_PREFIX "%s-mine`) and run `sbx pull %s` "
			"again",
			session, a, b, pulled, pulled, session, session,
			session, session);
		goto out;
	}
	if (git_branch_is_checked_out(ref) == 1) {
		rc = sbx_error_set(
			SBX_ERR_STATE, -EBUSY,
			"not pulled: " CLI_BRANCH_PREFIX "%s is checked out, "
			"and moving it would leave that checkout behind; the "
			"sandbox's head %s is in %s: run `git merge --ff-only "
			"%s` in that checkout",
			session, b, pulled, pulled);
		goto out;
	}
	/* Compare-and-swap: a concurrent change is not overwritten. */
	rc = git_reference_create_matching(&newref, repo, refname, tip, 1,
					   &local, msg);
	if (rc < 0) {
		rc = sbx_git_fail(rc, "cannot move %s", refname);
		goto out;
	}
	out->outcome = CLI_PULL_FAST_FORWARD;
out:
	git_reference_free(newref);
	git_reference_free(ref);
	free(msg);
	free(pulled);
	free(refname);
	return rc < 0 ? rc : 0;
}

int cli_repo_pull(struct cli_pull_result *out, struct sbx_sandbox *sb,
		  const char *repo_dir, const char *session)
{
	struct sbx_repo_state st;
	struct recv r;
	git_repository *repo = NULL;
	char *refname = sbx_xasprintf("refs/heads/" CLI_BRANCH_PREFIX "%s",
				      session);
	git_oid tip;
	int rc;

	memset(out, 0, sizeof(*out));
	memset(&st, 0, sizeof(st));
	memset(&r, 0, sizeof(r));
	sbx_buf_init(&r.buf, LOOSE_MAX);
	git_libgit2_init();
	if (!sb->ops->repo_state || !sb->ops->repo_objects) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -ENOSYS,
				   "this provider's sandboxes have no "
				   "repository endpoints");
		goto out;
	}
	rc = open_local(&repo, repo_dir);
	if (rc < 0)
		goto out;
	rc = sb->ops->repo_state(sb, "", refname, &st);
	out->requests++;
	if (rc == -ENOENT) {
		sbx_error_clear();
		out->outcome = CLI_PULL_NO_REPO;
		rc = 0;
		goto out;
	}
	if (rc < 0)
		goto out;
	if (st.head)
		snprintf(out->sandbox_head, sizeof(out->sandbox_head), "%s",
			 st.head);
	if (!st.oid || git_oid_fromstr(&tip, st.oid) < 0) {
		out->outcome = CLI_PULL_NO_BRANCH;
		goto out;
	}
	snprintf(out->head, sizeof(out->head), "%s", st.oid);
	rc = git_repository_odb(&r.odb, repo);
	if (rc < 0) {
		rc = sbx_git_fail(rc, "cannot open the objects of %s",
				  repo_dir);
		goto out;
	}
	r.repo = repo;
	/* The sandbox made its loose objects: the history check walks
	 * through all of them, here or not (an earlier pull may have
	 * stopped half-way), and trusts only what came from here. */
	for (size_t i = 0; i < st.nloose; i++) {
		git_oid id;

		if (git_oid_fromstr(&id, st.loose[i]) == 0)
			cli_oidset_add(&r.fresh, &id);
	}
	rc = complete(&r, &tip, NULL);
	if (rc == 0)
		rc = receive(&r, sb, &st, &tip, &out->requests);
	if (rc < 0)
		goto out;
	out->objects = r.objects;
	out->bytes = r.bytes;
	rc = update_branch(repo, session, &tip, out);
out:
	recv_fini(&r);
	sbx_repo_state_fini(&st);
	git_repository_free(repo);
	free(refname);
	git_libgit2_shutdown();
	return rc;
}

int cli_repo_branch_status(cJSON **out, struct sbx_sandbox *sb,
			   const char *repo_dir, const char *session)
{
	struct sbx_repo_state st;
	git_repository *repo = NULL;
	git_reference *ref = NULL;
	char *refname = sbx_xasprintf("refs/heads/" CLI_BRANCH_PREFIX "%s",
				      session);
	char *branch = sbx_xasprintf(CLI_BRANCH_PREFIX "%s", session);
	git_oid tip, local;
	bool have_local = false, pulled;
	cJSON *o;
	int rc;

	*out = NULL;
	memset(&st, 0, sizeof(st));
	git_libgit2_init();
	if (!sb->ops->repo_state) {
		rc = 0;
		goto out;
	}
	rc = sb->ops->repo_state(sb, "", refname, &st);
	if (rc == -ENOENT) {
		sbx_error_clear();
		rc = 0;
		goto out;
	}
	if (rc < 0)
		goto out;
	o = cJSON_CreateObject();
	sbx_json_set_str(o, "name", branch);
	if (st.oid)
		sbx_json_set_str(o, "head", st.oid);
	else
		cJSON_AddNullToObject(o, "head");
	if (repo_dir && open_local(&repo, repo_dir) == 0 &&
	    git_reference_name_to_id(&local, repo, refname) == 0)
		have_local = true;
	git_error_clear();
	sbx_error_clear();
	if (have_local)
		sbx_json_set_str(o, "local", git_oid_tostr_s(&local));
	else
		cJSON_AddNullToObject(o, "local");
	if (!st.oid || git_oid_fromstr(&tip, st.oid) < 0)
		pulled = true; /* nothing to pull */
	else
		pulled = have_local &&
			 (git_oid_equal(&local, &tip) ||
			  git_graph_descendant_of(repo, &local, &tip) == 1);
	git_error_clear();
	cJSON_AddBoolToObject(o, "pulled", pulled);
	*out = o;
out:
	git_reference_free(ref);
	git_repository_free(repo);
	sbx_repo_state_fini(&st);
	free(branch);
	free(refname);
	git_libgit2_shutdown();
	return rc;
}
