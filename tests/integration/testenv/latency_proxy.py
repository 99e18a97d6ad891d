"""A userspace TCP proxy that adds a fixed one-way delay in each direction.

The kernel here has no netem, so the remote tests and bench/remote.sh put
this between the client and sbx-agent (or sshd) to get a realistic round
trip time: --delay-ms 10 delays every byte by 10 ms each way, 20 ms RTT.

It delays bytes, it does not serialise packets: each chunk read from one
side is stamped with its arrival time and queued; the other side's writer
sends it when arrival + delay has passed.  Many chunks are in flight at
once, so bandwidth is limited only by Python copying (several hundred MB/s
on loopback), not by delay x packets.  At most MAX_INFLIGHT bytes are
queued per direction; past that the reader stops reading (TCP backpressure).

    cut()      drop every connection (RST) and refuse new ones (the port
               stops listening: connect() gets ECONNREFUSED)
    cut(mode="blackhole")
               keep every connection and accept new ones, but forward
               nothing in either direction (a partition: peers see
               timeouts, not errors)
    restore()  listen again on the same port / forward again

As a module (for shell scripts such as bench/remote.sh):

    python3 -m testenv.latency_proxy --listen 127.0.0.1:0 \
        --target 127.0.0.1:PORT --delay-ms 10

prints the chosen listening port on the first line of stdout, then runs
until SIGTERM/SIGINT.  SIGUSR1 cuts, SIGUSR2 restores.

With --control, it also reads commands from stdin, one per line, and
answers each with one line ("ok ..." or "err ..."): "cut", "cut blackhole",
"restore", "delay MS", "stats".  EOF on stdin ends it (so it never outlives
the process that controls it).

As a class (for fixtures):

    with ProxyProcess(("127.0.0.1", agent_port), delay_ms=10) as p:
        url = p.url
        ...
        p.cut(); ...; p.restore()

ProxyProcess runs the proxy in a child process (the module with --control).
Fixtures must use it, not LatencyProxy, which runs in a thread of the
calling process: a test process that starts a subprocess with its cwd in the
mount (subprocess.run(cwd=mnt)) holds the GIL across vfork() while the
child's chdir() waits for the FUSE daemon, which waits for the proxy thread,
which waits for the GIL -- a deadlock until the daemon's request timeout.
LatencyProxy (same interface) is fine where no FUSE mount is involved.
"""

import argparse
import asyncio
import collections
import contextlib
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

CHUNK = 256 * 1024
MAX_INFLIGHT = 32 * 1024 * 1024


def _parse_hostport(s):
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"want HOST:PORT, not {s!r}")
    return host.strip("[]"), int(port)


def _rst_close(writer):
    """Close a stream with an RST (SO_LINGER 0): the peer sees ECONNRESET."""
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                            struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        writer.transport.abort()
    except Exception:  # noqa: BLE001 - already gone
        pass


class _Pipe:
    """One direction of one connection: reader -> delayed queue -> writer."""

    def __init__(self, proxy, reader, writer):
        self.proxy = proxy
        self.reader = reader
        self.writer = writer
        self.queue = collections.deque()   # (release_time, bytes or None)
        self.inflight = 0
        self.have_data = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()

    async def pump_in(self):
        """Read chunks, stamp them, queue them (None marks EOF)."""
        try:
            while True:
                await self.room.wait()
                data = await self.reader.read(CHUNK)
                if self.proxy._blackhole:
                    if not data:
                        return "eof"  # not forwarded: keep it silent
                    continue    # a partition swallows the bytes
                self.queue.append((time.monotonic() + self.proxy.delay,
                                   data or None))
                self.have_data.set()
                if not data:
                    return "eof"
                self.inflight += len(data)
                self.proxy.bytes += len(data)
                if self.inflight >= MAX_INFLIGHT:
                    self.room.clear()
        except (ConnectionError, OSError):
            return "error"

    async def pump_out(self):
        """Release each chunk once its delay has passed."""
        try:
            while True:
                if not self.queue:
                    self.have_data.clear()
                    await self.have_data.wait()
                    continue
                release, data = self.queue[0]
                wait = release - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                self.queue.popleft()
                if data is None:
                    if self.writer.can_write_eof():
                        self.writer.write_eof()
                    return "eof"
                self.writer.write(data)
                self.inflight -= len(data)
                if self.inflight < MAX_INFLIGHT:
                    self.room.set()
                await self.writer.drain()
        except (ConnectionError, OSError):
            return "error"


class _Endpoint:
    """What both proxies (in this process, or in a child) share: a context
    manager that starts the proxy once, and its address.  Subclasses have
    start(), close() and _started()."""

    def __init__(self, target, listen=("127.0.0.1", 0), delay_ms=10.0):
        self.target = (target[0], int(target[1]))
        self.listen_addr = (listen[0], int(listen[1]))
        self.delay = delay_ms / 1000.0
        self.port = None

    def __enter__(self):
        return self if self._started() else self.start()

    def __exit__(self, *exc):
        self.close()

    @property
    def address(self):
        return (self.listen_addr[0], self.port)

    @property
    def url(self):
        return f"http://{self.listen_addr[0]}:{self.port}"


class LatencyProxy(_Endpoint):
    """A TCP proxy adding `delay_ms` each way; runs in a background thread."""

    def __init__(self, target, listen=("127.0.0.1", 0), delay_ms=10.0):
        super().__init__(target, listen, delay_ms)
        self.connections = 0      # accepted so far
        self.bytes = 0            # forwarded so far (both directions)
        self._conns = set()       # (client_writer, server_writer)
        self._tasks = set()
        self._handlers = set()
        self._server = None
        self._cut = False
        self._blackhole = False
        self._loop = None
        self._thread = None

    # -- life cycle (thread mode) ------------------------------------------

    def start(self):
        ready = threading.Event()
        err = []

        def run():
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._listen())
            except Exception as e:  # noqa: BLE001 - reported to start()
                err.append(e)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._shutdown())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="latency-proxy",
                                        daemon=True)
        self._thread.start()
        ready.wait(10)
        if err:
            raise err[0]
        if self.port is None:
            raise RuntimeError("latency proxy did not start")
        return self

    def close(self):
        if self._loop and self._thread and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def _started(self):
        return self._thread is not None

    def _call(self, coro_fn, *args):
        """Run coro_fn(*args) on the proxy's loop and wait for it."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("call from outside the proxy thread")
        fut = asyncio.run_coroutine_threadsafe(coro_fn(*args), self._loop)
        return fut.result(10)

    # -- controls ----------------------------------------------------------

    def cut(self, mode="refuse"):
        """Drop every connection and refuse new ones (mode="refuse"), or
        forward nothing while keeping connections (mode="blackhole")."""
        if mode not in ("refuse", "blackhole"):
            raise ValueError(mode)
        self._call(self._do_cut, mode)

    def restore(self):
        """Undo cut(): listen again on the same port, forward again."""
        self._call(self._do_restore)

    def set_delay(self, delay_ms):
        self.delay = delay_ms / 1000.0

    @property
    def is_cut(self):
        return self._cut or self._blackhole

    # -- the loop side -----------------------------------------------------

    async def _listen(self):
        host, port = self.listen_addr
        if self.port is not None:
            port = self.port
        self._server = await asyncio.start_server(
            self._handle, host, port, reuse_address=True, backlog=512)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _do_cut(self, mode):
        if mode == "blackhole":
            self._blackhole = True
            return
        self._cut = True
        if self._server is not None:
            # Not wait_closed(): since 3.11.x (Debian's 3.11.2 too) it waits
            # for every connection to end, and we are the ones ending them.
            self._server.close()
            self._server = None
        self._drop_all()

    def _drop_all(self):
        for c, s in list(self._conns):
            _rst_close(c)
            if s is not None:
                _rst_close(s)
        self._conns.clear()
        for t in list(self._tasks):
            t.cancel()

    async def _do_restore(self):
        if self._blackhole:
            # Connections that lived through a partition have lost bytes:
            # they are unusable.  Reset them so that peers reconnect.
            self._blackhole = False
            self._drop_all()
        if self._cut:
            self._cut = False
            for _ in range(50):
                try:
                    await self._listen()
                    break
                except OSError:
                    await asyncio.sleep(0.1)
            else:
                raise RuntimeError(f"cannot listen on port {self.port} again")

    async def _shutdown(self):
        if self._server is not None:
            self._server.close()
        self._drop_all()
        for h in list(self._handlers):
            h.cancel()
        await asyncio.gather(*self._handlers, *self._tasks,
                             return_exceptions=True)

    async def _handle(self, creader, cwriter):
        me = asyncio.current_task()
        self._handlers.add(me)
        try:
            await self._serve(creader, cwriter)
        except asyncio.CancelledError:
            _rst_close(cwriter)
        finally:
            self._handlers.discard(me)

    async def _serve(self, creader, cwriter):
        if self._cut:
            _rst_close(cwriter)
            return
        self.connections += 1
        pending_pair = (cwriter, None)
        self._conns.add(pending_pair)
        try:
            sreader, swriter = await asyncio.open_connection(*self.target)
        except OSError:
            # The target refuses: the client sees a reset, as it would
            # without the proxy (after the delay a real network adds).
            await asyncio.sleep(self.delay * 2)
            _rst_close(cwriter)
            return
        finally:
            self._conns.discard(pending_pair)
        if self._cut:
            _rst_close(cwriter)
            _rst_close(swriter)
            return
        for w in (cwriter, swriter):
            sock = w.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
        pair = (cwriter, swriter)
        self._conns.add(pair)
        up = _Pipe(self, creader, swriter)
        down = _Pipe(self, sreader, cwriter)
        tasks = [asyncio.ensure_future(f()) for f in
                 (up.pump_in, up.pump_out, down.pump_in, down.pump_out)]
        self._tasks.update(tasks)
        broken = False
        try:
            # Done when both directions have delivered their EOF; a reset
            # or write error on either side resets the other side too.
            pending, outs_done = set(tasks), 0
            while pending and outs_done < 2 and not broken:
                done, pending = await asyncio.wait(
                    pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t.cancelled() or t.exception() or \
                            t.result() == "error":
                        broken = True
                    elif t in (tasks[1], tasks[3]):
                        outs_done += 1
        except asyncio.CancelledError:
            broken = True
        finally:
            for t in tasks:
                t.cancel()
                self._tasks.discard(t)
            self._conns.discard(pair)
            for w in (cwriter, swriter):
                if broken:
                    _rst_close(w)
                else:
                    try:
                        w.close()
                    except Exception:  # noqa: BLE001
                        pass


class ProxyProcess(_Endpoint):
    """The proxy in a child process, controlled through its stdin."""

    def __init__(self, target, listen=("127.0.0.1", 0), delay_ms=10.0):
        super().__init__(target, listen, delay_ms)
        self.proc = None

    def start(self, timeout=10):
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "testenv.latency_proxy", "--control",
             "--listen", f"{self.listen_addr[0]}:{self.listen_addr[1]}",
             "--target", f"{self.target[0]}:{self.target[1]}",
             "--delay-ms", str(self.delay * 1000)],
            cwd=here, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, bufsize=1)
        line = self._readline(timeout)
        if not line.strip().isdigit():
            self.close()
            raise RuntimeError(f"latency proxy did not start: {line!r}")
        self.port = int(line)
        return self

    def _readline(self, timeout):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise RuntimeError("latency proxy does not answer")
        return self.proc.stdout.readline()

    def command(self, line, timeout=10):
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError("latency proxy is not running")
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self._readline(timeout).strip()
        if not answer.startswith("ok"):
            raise RuntimeError(f"latency proxy: {line!r}: {answer!r}")
        return answer[2:].strip()

    def cut(self, mode="refuse"):
        self.command(f"cut {mode}")

    def restore(self):
        self.command("restore")

    def set_delay(self, delay_ms):
        self.command(f"delay {delay_ms}")
        self.delay = delay_ms / 1000.0

    def stats(self):
        conns, nbytes = self.command("stats").split()
        return int(conns), int(nbytes)

    def close(self):
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        if self.proc.stdout:
            self.proc.stdout.close()

    def _started(self):
        return self.proc is not None


@contextlib.contextmanager
def proxied_session(env, agent, repo, delay_ms, name="t1"):
    """A remote session `name` reaching `agent` through a ProxyProcess
    (delay_ms each way); afterwards the session is downed (--force) and the
    proxy closed.  In a child process: an in-process proxy thread
    deadlocks with subprocess(cwd=mount)."""
    from .agent import up_remote
    proxy = ProxyProcess(agent.address, delay_ms=delay_ms).start()
    try:
        sb = up_remote(env, name, agent, proxy, repo=repo)
        yield sb
        env.sbx("down", name, "--force", timeout=60)
    finally:
        proxy.close()


async def _control(proxy, stop):
    """Serve --control commands from stdin until EOF."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                 sys.stdin)
    while True:
        line = (await reader.readline()).decode()
        if not line:
            break
        words = line.split()
        try:
            if words[:1] == ["cut"]:
                await proxy._do_cut(words[1] if len(words) > 1 else "refuse")
                answer = "ok"
            elif words == ["restore"]:
                await proxy._do_restore()
                answer = "ok"
            elif words[:1] == ["delay"] and len(words) == 2:
                proxy.set_delay(float(words[1]))
                answer = "ok"
            elif words == ["stats"]:
                answer = f"ok {proxy.connections} {proxy.bytes}"
            else:
                answer = f"err unknown command {line.strip()!r}"
        except Exception as e:  # noqa: BLE001 - reported to the controller
            answer = f"err {e}"
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()
    stop()


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python3 -m testenv.latency_proxy",
        description="TCP proxy adding a fixed delay each way. Prints the "
                    "listening port; SIGUSR1 cuts, SIGUSR2 restores.")
    ap.add_argument("--listen", type=_parse_hostport,
                    default=("127.0.0.1", 0), help="HOST:PORT (port 0: any)")
    ap.add_argument("--target", type=_parse_hostport, required=True,
                    help="HOST:PORT to forward to")
    ap.add_argument("--delay-ms", type=float, default=10.0,
                    help="one-way delay in ms (RTT is twice that)")
    ap.add_argument("--control", action="store_true",
                    help="read commands from stdin; exit at its EOF")
    a = ap.parse_args(argv)

    proxy = LatencyProxy(a.target, a.listen, a.delay_ms)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    proxy._loop = loop
    loop.run_until_complete(proxy._listen())
    print(proxy.port, flush=True)
    stop = loop.stop
    loop.add_signal_handler(signal.SIGTERM, stop)
    loop.add_signal_handler(signal.SIGINT, stop)
    loop.add_signal_handler(signal.SIGUSR1,
                            lambda: loop.create_task(proxy._do_cut("refuse")))
    loop.add_signal_handler(signal.SIGUSR2,
                            lambda: loop.create_task(proxy._do_restore()))
    if a.control:
        # A strong reference: the loop keeps tasks only weakly, and the
        # stdin reader is referenced only from the task's frame, so an
        # unreferenced task is garbage collected in the middle of a wait.
        proxy._control_task = loop.create_task(_control(proxy, stop))
    try:
        loop.run_forever()
    finally:
        loop.run_until_complete(proxy._shutdown())
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
