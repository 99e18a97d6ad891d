"""A scripted language model behind the OpenAI chat-completions API, so
that a real coding agent (opencode) can run the same task, step by step,
on a plain directory and on sbx mounts (bench/opencode.sh).

The real service cannot run here; this one speaks its wire format:
POST /v1/chat/completions with "stream": true answers
text/event-stream chunks (`data: {chat.completion.chunk}`), tool calls as
`delta.tool_calls` with the arguments as a JSON string, a last chunk with
`finish_reason` and `usage`, then `data: [DONE]`.  A non-streaming request
gets one chat.completion object.  GET /v1/models lists the model.

The script (--script FILE, JSON) is a list of steps; each is either
{"tool": NAME, "args": {...}} (one tool call) or {"text": "..."} (a final
answer).  Which step a request gets is decided by the request alone: the
number of tool results ("role": "tool" messages) already in its
conversation.  So a retried request gets the same step, and requests
without tools (opencode's title and summary calls) get a short text.

Every request is logged to --log with its time, the step served and how
many tool results came with it (what bench/opencode.sh reports).

    python3 fake_llm.py --script steps.json --port-file PORT [--log LOG]
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "scripted"


class Script:
    def __init__(self, steps, log):
        self.steps = steps
        self.log = log
        self.lock = threading.Lock()

    def step_for(self, body):
        """The step this conversation is at, or None (no tools: a side
        request such as a title)."""
        if not body.get("tools"):
            return None
        done = sum(1 for m in body.get("messages", [])
                   if m.get("role") == "tool")
        return min(done, len(self.steps) - 1)

    def note(self, msg):
        if self.log is None:
            return
        with self.lock:
            self.log.write(f"{time.time():.3f} {msg}\n")
            self.log.flush()


def chunk(cid, delta, finish=None, usage=None):
    c = {"id": cid, "object": "chat.completion.chunk",
         "created": int(time.time()), "model": MODEL,
         "choices": [{"index": 0, "delta": delta,
                      "finish_reason": finish}]}
    if usage is not None:
        c["usage"] = usage
    return c


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script = None  # set by main()
    counter = 0

    def log_message(self, fmt, *args):  # the script's log says enough
        pass

    def send_json(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, code, msg):
        self.send_json(code, {"error": {"message": msg,
                                        "type": "invalid_request_error",
                                        "code": None}})

    def do_GET(self):
        if self.path.rstrip("/") == "/v1/models":
            self.send_json(200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "owned_by": "sbx-bench"}]})
        else:
            self.error(404, f"no route GET {self.path}")

    def do_POST(self):
        if self.path.rstrip("/") != "/v1/chat/completions":
            self.error(404, f"no route POST {self.path}")
            return
        n = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(n) or b"{}")
        except ValueError as e:
            self.error(400, f"body is not JSON: {e}")
            return
        s = Handler.script
        idx = s.step_for(body)
        Handler.counter += 1
        cid = f"chatcmpl-{Handler.counter}"
        tools = sum(1 for m in body.get("messages", [])
                    if m.get("role") == "tool")
        if idx is None:
            step = {"text": "Scripted task"}
            s.note(f"side request (no tools) tool_results={tools}")
        else:
            step = s.steps[idx]
            s.note(f"step {idx} tool_results={tools} "
                   f"{step.get('tool', 'text')}")
        usage = {"prompt_tokens": 10, "completion_tokens": 5,
                 "total_tokens": 15}
        if not body.get("stream"):
            self.send_json(200, self.whole(cid, step, usage))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for c in self.chunks(cid, step, usage):
            self.wfile.write(b"data: " + json.dumps(c).encode() + b"\n\n")
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    @staticmethod
    def call(cid, step):
        return {"id": f"call_{cid}", "type": "function",
                "function": {"name": step["tool"],
                             "arguments": json.dumps(step["args"])}}

    def whole(self, cid, step, usage):
        msg = {"role": "assistant", "content": step.get("text")}
        finish = "stop"
        if "tool" in step:
            msg["tool_calls"] = [self.call(cid, step)]
            finish = "tool_calls"
        return {"id": cid, "object": "chat.completion",
                "created": int(time.time()), "model": MODEL,
                "choices": [{"index": 0, "message": msg,
                             "finish_reason": finish}],
                "usage": usage}

    def chunks(self, cid, step, usage):
        yield chunk(cid, {"role": "assistant", "content": ""})
        if "tool" in step:
            tc = dict(self.call(cid, step), index=0)
            yield chunk(cid, {"tool_calls": [tc]})
            yield chunk(cid, {}, "tool_calls", usage)
        else:
            yield chunk(cid, {"content": step["text"]})
            yield chunk(cid, {}, "stop", usage)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--script", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log")
    a = ap.parse_args()
    with open(a.script) as f:
        steps = json.load(f)
    if not isinstance(steps, list) or not steps:
        sys.exit(f"fake_llm: {a.script}: expected a non-empty JSON list")
    Handler.script = Script(steps, open(a.log, "a") if a.log else None)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    with open(a.port_file + ".tmp", "w") as f:
        f.write(f"{srv.server_address[1]}\n")
    os.replace(a.port_file + ".tmp", a.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
