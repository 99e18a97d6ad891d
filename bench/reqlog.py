#!/usr/bin/env python3
"""A logging HTTP/1.1 pass-through proxy: which requests reach sbx-agent.

sbx-agent's own debug log (SBX_LOG=debug) names the method and the path of
each request, but not its query (which file) nor, for POST /v1/fs/batch,
which operations the batch carries.  This proxy sits between the client
(or the latency proxy) and the agent, forwards every byte unchanged and at
once, and parses both directions on the side to write one JSON line per
completed request/response pair:

    {"t0": start, "t1": end, "conn": N, "method": "GET",
     "path": "/v1/fs/read?path=...&offset=0&length=...",
     "ops": ["create", "write"],          (batch only)
     "status": 200, "req_bytes": N, "resp_bytes": N,
     "inflight": K,                       (requests outstanding on all
                                           connections when this one began,
                                           itself included; the watch
                                           stream is not counted)
     "stream": false}                     (true for the watch stream)

t0 is when the request head arrived, t1 when the last byte of the answer
left the agent (both time.monotonic()).  A request whose answer never ends
(the watch stream, an aborted read) is written when its connection closes,
with "t1": null.  Lines are flushed as they are written, so a reader that
notes the log's size before a workload and reads from there after it sees
exactly that workload's requests (plus anything the daemon does in the
background meanwhile: the watch stream is one long request and does not
show).

    python3 bench/reqlog.py --listen 127.0.0.1:0 --target 127.0.0.1:PORT \
        --log FILE

prints the listening port on the first line of stdout and runs until
SIGTERM/SIGINT.  Used by bench/roundtrips.sh.
"""

import argparse
import asyncio
import json
import signal
import sys
import time

KEEP_BODY = 1 << 20   # batch bodies are JSON; keep this much to name ops


class Side:
    """An incremental HTTP/1.1 message parser for one direction."""

    def __init__(self, is_request):
        self.is_request = is_request
        self.buf = bytearray()
        self.state = "head"
        self.remaining = 0          # body bytes left (length or chunk)
        self.body = bytearray()
        self.head = None
        self.nbytes = 0

    def feed(self, data, on_head, on_done):
        """Consume data; call on_head(head) and on_done(head, body, n)."""
        self.buf += data
        while True:
            if self.state == "head":
                i = self.buf.find(b"\r\n\r\n")
                if i < 0:
                    return
                raw = bytes(self.buf[:i]).decode("latin-1")
                del self.buf[:i + 4]
                self.nbytes = i + 4
                lines = raw.split("\r\n")
                hdrs = {}
                for ln in lines[1:]:
                    k, _, v = ln.partition(":")
                    hdrs[k.strip().lower()] = v.strip()
                self.head = (lines[0], hdrs)
                self.body = bytearray()
                on_head(self.head)
                first = lines[0].split(" ")
                status = None if self.is_request else int(first[1])
                if self.is_request:
                    method = first[0]
                    no_body = False
                else:
                    method = None
                    no_body = (status < 200 or status in (204, 304)
                               or getattr(self, "head_req", False))
                te = hdrs.get("transfer-encoding", "").lower()
                if no_body:
                    self._done(on_done)
                    continue
                if "chunked" in te:
                    self.state = "chunk-size"
                elif "content-length" in hdrs:
                    self.remaining = int(hdrs["content-length"])
                    self.state = "body"
                    if self.remaining == 0:
                        self._done(on_done)
                elif self.is_request or method:
                    self._done(on_done)
                else:
                    self.state = "until-close"
            elif self.state in ("body", "chunk"):
                n = min(self.remaining, len(self.buf))
                if n == 0:
                    return
                self._take(n)
                self.remaining -= n
                if self.remaining == 0 and self.state == "body":
                    self._done(on_done)
                elif self.remaining == 0:
                    self.state = "chunk-crlf"
            elif self.state == "chunk-size":
                i = self.buf.find(b"\r\n")
                if i < 0:
                    return
                size = int(bytes(self.buf[:i]).split(b";")[0], 16)
                del self.buf[:i + 2]
                self.nbytes += i + 2
                if size == 0:
                    self.state = "trailer"
                else:
                    self.remaining = size
                    self.state = "chunk"
            elif self.state == "chunk-crlf":
                if len(self.buf) < 2:
                    return
                del self.buf[:2]
                self.nbytes += 2
                self.state = "chunk-size"
            elif self.state == "trailer":
                i = self.buf.find(b"\r\n")
                if i < 0:
                    return
                del self.buf[:i + 2]
                self.nbytes += i + 2
                if i == 0:
                    self._done(on_done)
            elif self.state == "until-close":
                self.nbytes += len(self.buf)
                self.buf.clear()
                return

    def _done(self, on_done):
        """A whole message: report it, then expect the next head."""
        self.state = "head"
        on_done(self.head, self.body, self.nbytes)

    def _take(self, n):
        if len(self.body) < KEEP_BODY:
            self.body += self.buf[:min(n, KEEP_BODY - len(self.body))]
        del self.buf[:n]
        self.nbytes += n


class Proxy:
    def __init__(self, target, log):
        self.target = target
        self.log = log
        self.nconn = 0
        self.outstanding = 0

    def finish(self, rec):
        """Log a request whose answer ended (or whose connection closed)."""
        if not rec["stream"]:
            self.outstanding -= 1
        self.log.write(json.dumps(rec) + "\n")
        self.log.flush()

    async def handle(self, creader, cwriter):
        self.nconn += 1
        conn = self.nconn
        try:
            sreader, swriter = await asyncio.open_connection(*self.target)
        except OSError:
            cwriter.close()
            return
        pending = []                # records waiting for their answer
        req = Side(True)
        resp = Side(False)

        def req_head(head):
            line = head[0].split(" ")
            rec = {"t0": time.monotonic(), "t1": None, "conn": conn,
                   "method": line[0], "path": line[1] if len(line) > 1
                   else "", "status": None, "req_bytes": 0,
                   "resp_bytes": 0}
            # the watch stream is always out: not counted
            rec["stream"] = rec["path"].startswith("/v1/watch")
            if not rec["stream"]:
                self.outstanding += 1
            rec["inflight"] = self.outstanding
            pending.append(rec)
            req.cur = rec

        def req_done(head, body, n):
            rec = req.cur
            rec["req_bytes"] = n
            if rec["path"].startswith("/v1/fs/batch") or \
                    rec["path"].endswith("/v1/fs/batch"):
                try:
                    ops = json.loads(bytes(body))["ops"]
                    rec["ops"] = [o.get("op", "?") for o in ops]
                    rec["op_paths"] = [o.get("path", "") for o in ops]
                except (ValueError, KeyError, TypeError):
                    rec["ops"] = ["?"]
            elif rec["method"] == "POST" and "/v1/exec" in rec["path"]:
                try:
                    rec["argv"] = json.loads(bytes(body)).get("argv")
                except (ValueError, AttributeError):
                    pass

        def resp_head(head):
            resp.head_req = bool(pending) and pending[0]["method"] == "HEAD"

        def resp_done(head, body, n):
            if not pending:
                return
            rec = pending.pop(0)
            rec["t1"] = time.monotonic()
            rec["status"] = int(head[0].split(" ")[1])
            rec["resp_bytes"] = n
            self.finish(rec)

        async def pump(src, dst, side, on_head, on_done):
            try:
                while True:
                    data = await src.read(256 * 1024)
                    if not data:
                        break
                    dst.write(data)
                    try:
                        side.feed(data, on_head, on_done)
                    except (ValueError, IndexError):
                        side.state = "until-close"   # give up parsing
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                try:
                    if dst.can_write_eof():
                        dst.write_eof()
                except (OSError, RuntimeError):
                    pass

        await asyncio.gather(
            pump(creader, swriter, req, req_head, req_done),
            pump(sreader, cwriter, resp, resp_head, resp_done))
        for rec in pending:
            self.finish(rec)
        for w in (cwriter, swriter):
            try:
                w.close()
            except OSError:
                pass


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", default="127.0.0.1:0")
    ap.add_argument("--target", required=True)
    ap.add_argument("--log", required=True)
    a = ap.parse_args()
    lh, _, lp = a.listen.rpartition(":")
    th, _, tp = a.target.rpartition(":")
    log = open(a.log, "a", buffering=1)
    p = Proxy((th, int(tp)), log)
    srv = await asyncio.start_server(p.handle, lh, int(lp))
    print(srv.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    await stop.wait()
    srv.close()
    log.close()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
