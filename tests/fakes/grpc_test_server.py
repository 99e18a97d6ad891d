"""A tiny gRPC server (grpcio, TLS) for testing sbx's gRPC client (mgrpc).

Not a Modal fake: it implements two RPCs of modal.client.ModalClient and
one of modal.task_command_router.TaskCommandRouter with behaviours chosen
by the request, so that tests/integration/test_mgrpc.py can check the wire
details.  The message classes are generated at run time with
`protoc --python_out` from providers/modal/*.proto (no grpc_tools needed);
handlers are registered with grpc.method_handlers_generic_handler.

AppGetOrCreate(app_name):
    "ok"           -> app_id "ap-ok"
    "echo-md"      -> app_id = JSON {"md": {metadata}, "remaining": s}
    "notfound"     -> NOT_FOUND with a message needing percent-encoding
    "unauth"       -> UNAUTHENTICATED
    "flaky-<n>"    -> UNAVAILABLE for the first n attempts of one
                      x-idempotency-key, then app_id "ap-flaky"
    "slow"         -> sleeps 3 s, then "ap-slow"
    "trailers-only"-> INVALID_ARGUMENT before any message
ImageJoinStreaming(image_id):
    "im-<n>"       -> n messages entry_id "0".."n-1", 0.3 s apart, the last
                      with eof=true and a successful result
    "im-fail"      -> one message, then INTERNAL "build broke"
TaskSnapshotFilesystem(task_id) -> image_id "im-snap-<task_id>"

Every call is recorded in FakeGrpc.calls as (method, metadata dict,
request message).

Standalone: python3 grpc_test_server.py CERT KEY  (prints "port N").
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO / "providers" / "modal"


def load_protos(outdir=None):
    """Generate and import modal_api_pb2 and task_command_router_pb2."""
    outdir = outdir or tempfile.mkdtemp(prefix="sbx-pb2-")
    subprocess.run(["protoc", "--python_out=" + str(outdir),
                    "-I", str(PROTO_DIR), "-I", "/usr/include",
                    str(PROTO_DIR / "modal_api.proto"),
                    str(PROTO_DIR / "task_command_router.proto")],
                   check=True)
    if str(outdir) not in sys.path:
        sys.path.insert(0, str(outdir))
    import modal_api_pb2  # noqa: E402
    import task_command_router_pb2  # noqa: E402
    return modal_api_pb2, task_command_router_pb2


class FakeGrpc:
    def __init__(self, api, router):
        self.api = api
        self.router = router
        self.calls = []
        self.lock = threading.Lock()
        self.attempts = {}   # idempotency key -> attempts seen
        self.server = None
        self.port = None

    def _record(self, method, ctx, req):
        md = {k: v for k, v in ctx.invocation_metadata()}
        with self.lock:
            self.calls.append((method, md, req))
        return md

    def app_get_or_create(self, req, ctx):
        md = self._record("AppGetOrCreate", ctx, req)
        name = req.app_name
        resp = self.api.AppGetOrCreateResponse
        if name == "ok":
            return resp(app_id="ap-ok")
        if name == "echo-md":
            return resp(app_id=json.dumps(
                {"md": md, "remaining": ctx.time_remaining()}))
        if name == "notfound":
            ctx.abort(grpc.StatusCode.NOT_FOUND,
                      "App 'x' not found: 100% gone, ünïcode\tend")
        if name == "unauth":
            ctx.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")
        if name == "trailers-only":
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad app name")
        if name.startswith("flaky-"):
            n = int(name.split("-", 1)[1])
            key = md.get("x-idempotency-key", "")
            with self.lock:
                self.attempts[key] = self.attempts.get(key, 0) + 1
                seen = self.attempts[key]
            if seen <= n:
                ctx.abort(grpc.StatusCode.UNAVAILABLE, "try again later")
            return resp(app_id="ap-flaky")
        if name == "slow":
            time.sleep(3)
            return resp(app_id="ap-slow")
        ctx.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown test app " + name)

    def image_join_streaming(self, req, ctx):
        self._record("ImageJoinStreaming", ctx, req)
        api = self.api
        if req.image_id == "im-fail":
            yield api.ImageJoinStreamingResponse(entry_id="0")
            ctx.abort(grpc.StatusCode.INTERNAL, "build broke")
        n = int(req.image_id.split("-", 1)[1])
        for i in range(n):
            last = i == n - 1
            r = api.ImageJoinStreamingResponse(entry_id=str(i), eof=last)
            r.task_logs.add(data="line %d\n" % i)
            if last:
                r.result.status = api.GenericResult.GENERIC_STATUS_SUCCESS
            yield r
            if not last:
                time.sleep(0.3)

    def snapshot(self, req, ctx):
        self._record("TaskSnapshotFilesystem", ctx, req)
        return self.router.TaskSnapshotFilesystemResponse(
            image_id="im-snap-" + req.task_id)

    def start(self, cert_pem, key_pem, port=0):
        api, router = self.api, self.router
        modal = grpc.method_handlers_generic_handler(
            "modal.client.ModalClient", {
                "AppGetOrCreate": grpc.unary_unary_rpc_method_handler(
                    self.app_get_or_create,
                    request_deserializer=api.AppGetOrCreateRequest.FromString,
                    response_serializer=(
                        api.AppGetOrCreateResponse.SerializeToString)),
                "ImageJoinStreaming": grpc.unary_stream_rpc_method_handler(
                    self.image_join_streaming,
                    request_deserializer=(
                        api.ImageJoinStreamingRequest.FromString),
                    response_serializer=(
                        api.ImageJoinStreamingResponse.SerializeToString)),
            })
        rt = grpc.method_handlers_generic_handler(
            "modal.task_command_router.TaskCommandRouter", {
                "TaskSnapshotFilesystem": grpc.unary_unary_rpc_method_handler(
                    self.snapshot,
                    request_deserializer=(
                        router.TaskSnapshotFilesystemRequest.FromString),
                    response_serializer=(
                        router.TaskSnapshotFilesystemResponse
                        .SerializeToString)),
            })
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        self.server.add_generic_rpc_handlers((modal, rt))
        creds = grpc.ssl_server_credentials([(key_pem, cert_pem)])
        self.port = self.server.add_secure_port("127.0.0.1:%d" % port, creds)
        self.server.start()
        return self.port

    def stop(self):
        if self.server:
            self.server.stop(grace=None)
            self.server = None


def main():
    cert = Path(sys.argv[1]).read_bytes()
    key = Path(sys.argv[2]).read_bytes()
    api, router = load_protos()
    fake = FakeGrpc(api, router)
    port = fake.start(cert, key)
    print("port %d" % port, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        fake.stop()


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    main()
