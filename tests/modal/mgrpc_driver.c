/*
 * Test driver for providers/modal/mgrpc.c (tests/integration/test_mgrpc.py).
 *
 *   mgrpc_driver [options] URL unary APP_NAME
 *       AppGetOrCreate(app_name=APP_NAME); prints
 *       "ok app_id=<id> attempts=<n>"
 *   mgrpc_driver [options] URL stream IMAGE_ID
 *       ImageJoinStreaming(image_id=IMAGE_ID); prints
 *       "msg entry_id=<id> eof=<0|1> t=<ms since the call started>" for each
 *       message as it arrives, then "ok attempts=<n>"
 *   mgrpc_driver [options] URL snapshot TASK_ID
 *       TaskCommandRouter/TaskSnapshotFilesystem; "ok image_id=<id> ..."
 *
 * Failures print "err errno=<NAME> status=<grpc code> class=<n>
 * detail=<n> attempts=<n> msg=<message>"; a callback stop prints
 * "stopped rc=<n> attempts=<n>".  Exit status 0 unless the usage is wrong.
 *
 * Options: --ca FILE, --retry, --deadline MS, --header "name: value"
 * (repeatable), --stop-after N (stream: stop after N messages),
 * --threads N (unary: N concurrent calls on one channel; prints one line
 * per call).
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sbx/error.h"

#include "mgrpc.h"
#include "modal_api.pb-c.h"
#include "task_command_router.pb-c.h"

#define MAX_HEADERS 16

static struct mgrpc *chan;
static struct mgrpc_call opts;
static const char *arg;
static int stop_after = -1;
static struct timespec t0;

static long elapsed_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0.tv_sec) * 1000L +
	       (t.tv_nsec - t0.tv_nsec) / 1000000L;
}

static void print_err(int rc, int attempts)
{
	const struct sbx_error *e = sbx_error_last();
	const char *name = sbx_errno_name(-rc);

	printf("err errno=%s status=%d class=%d detail=%ld attempts=%d "
	       "msg=%s\n", name ? name : "?", mgrpc_last_status(), e->klass,
	       e->detail, attempts, e->msg);
}

static void *unary_one(void *unused)
{
	Modal__Client__AppGetOrCreateRequest req;
	ProtobufCMessage *out = NULL;
	struct mgrpc_call call = opts;
	int rc;

	modal__client__app_get_or_create_request__init(&req);
	req.app_name = (char *)arg;
	req.object_creation_type =
		MODAL__CLIENT__OBJECT_CREATION_TYPE__OBJECT_CREATION_TYPE_CREATE_IF_MISSING;
	rc = mgrpc_unary(chan, "/modal.client.ModalClient/AppGetOrCreate",
			 &req.base,
			 &modal__client__app_get_or_create_response__descriptor,
			 &out, &call);
	flockfile(stdout);
	if (rc == 0) {
		Modal__Client__AppGetOrCreateResponse *r =
			(Modal__Client__AppGetOrCreateResponse *)out;

		printf("ok app_id=%s attempts=%d\n", r->app_id, call.attempts);
		protobuf_c_message_free_unpacked(out, NULL);
	} else {
		print_err(rc, call.attempts);
	}
	fflush(stdout);
	funlockfile(stdout);
	return NULL;
}

static int on_msg(const ProtobufCMessage *m, void *payload)
{
	const Modal__Client__ImageJoinStreamingResponse *r =
		(const Modal__Client__ImageJoinStreamingResponse *)m;
	int *n = payload;

	printf("msg entry_id=%s eof=%d t=%ld\n", r->entry_id, r->eof ? 1 : 0,
	       elapsed_ms());
	fflush(stdout);
	if (stop_after >= 0 && ++*n >= stop_after)
		return 42;
	return 0;
}

static void stream(void)
{
	Modal__Client__ImageJoinStreamingRequest req;
	struct mgrpc_call call = opts;
	int n = 0, rc;

	modal__client__image_join_streaming_request__init(&req);
	req.image_id = (char *)arg;
	req.timeout = 55;
	rc = mgrpc_stream(chan,
			  "/modal.client.ModalClient/ImageJoinStreaming",
			  &req.base,
			  &modal__client__image_join_streaming_response__descriptor,
			  on_msg, &n, &call);
	if (rc == 0)
		printf("ok attempts=%d\n", call.attempts);
	else if (rc > 0)
		printf("stopped rc=%d attempts=%d\n", rc, call.attempts);
	else
		print_err(rc, call.attempts);
}

static void snapshot(void)
{
	Modal__TaskCommandRouter__TaskSnapshotFilesystemRequest req;
	ProtobufCMessage *out = NULL;
	struct mgrpc_call call = opts;
	int rc;

	modal__task_command_router__task_snapshot_filesystem_request__init(
		&req);
	req.task_id = (char *)arg;
	req.snapshot_id = "00000000-0000-4000-8000-000000000000";
	rc = mgrpc_unary(
		chan,
		"/modal.task_command_router.TaskCommandRouter/"
		"TaskSnapshotFilesystem",
		&req.base,
		&modal__task_command_router__task_snapshot_filesystem_response__descriptor,
		&out, &call);
	if (rc == 0) {
		printf("ok image_id=%s attempts=%d\n",
		       ((Modal__TaskCommandRouter__TaskSnapshotFilesystemResponse
				 *)out)->image_id,
		       call.attempts);
		protobuf_c_message_free_unpacked(out, NULL);
	} else {
		print_err(rc, call.attempts);
	}
}

static int usage(void)
{
	fprintf(stderr, "usage: mgrpc_driver [--ca FILE] [--retry] "
			"[--deadline MS] [--header H]... [--stop-after N] "
			"[--threads N] URL unary|stream|snapshot ARG\n");
	return 2;
}

int main(int argc, char **argv)
{
	const char *headers[MAX_HEADERS + 1] = {0};
	struct mgrpc_opts o = {0};
	int nh = 0, threads = 1, i, rc;
	const char *mode;

	for (i = 1; i < argc && !strncmp(argv[i], "--", 2); i++) {
		if (!strcmp(argv[i], "--retry")) {
			opts.retry = true;
		} else if (i + 1 >= argc) {
			return usage();
		} else if (!strcmp(argv[i], "--ca")) {
			o.ca_file = argv[++i];
		} else if (!strcmp(argv[i], "--deadline")) {
			opts.deadline_ms = strtol(argv[++i], NULL, 10);
		} else if (!strcmp(argv[i], "--header") && nh < MAX_HEADERS) {
			headers[nh++] = argv[++i];
		} else if (!strcmp(argv[i], "--stop-after")) {
			stop_after = (int)strtol(argv[++i], NULL, 10);
		} else if (!strcmp(argv[i], "--threads")) {
			threads = (int)strtol(argv[++i], NULL, 10);
		} else {
			return usage();
		}
	}
	if (argc - i != 3 || threads < 1 || threads > 64)
		return usage();
	o.url = argv[i];
	o.headers = headers;
	mode = argv[i + 1];
	arg = argv[i + 2];

	rc = mgrpc_new(&chan, &o);
	if (rc < 0) {
		print_err(rc, 0);
		return 0;
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (!strcmp(mode, "unary")) {
		pthread_t th[64];

		for (int t = 0; t < threads; t++)
			if (pthread_create(&th[t], NULL, unary_one, NULL))
				abort();
		for (int t = 0; t < threads; t++)
			pthread_join(th[t], NULL);
	} else if (!strcmp(mode, "stream")) {
		stream();
	} else if (!strcmp(mode, "snapshot")) {
		snapshot();
	} else {
		mgrpc_free(chan);
		return usage();
	}
	mgrpc_free(chan);
	return 0;
}
