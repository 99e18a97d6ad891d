"""What the fake servers of tests/fakes/ (kube_apiserver.py, modal_server.py)
share: their log, a private CA with leaf certificates made by openssl, the
atomic writes of their state files (token, ready file), the thread that
starts every agent, and the watchdog that stops a fake whose parent died.

Only plumbing lives here: each fake's protocol (HTTP/JSON for Kubernetes,
gRPC for Modal) stays in its own module so it can be read against the real
service."""

import argparse
import os
import queue
import signal
import subprocess
import sys
import threading
import time


class Log:
    """A log line writer: to the fake's log file once open(), to stderr
    before.  `millis` adds milliseconds to the time stamp."""

    def __init__(self, millis=False):
        self.millis = millis
        self.file = None
        self.lock = threading.Lock()

    def open(self, path):
        self.file = open(path, "a")

    def __call__(self, msg):
        stamp = time.strftime("%H:%M:%S")
        if self.millis:
            stamp += f".{int(time.time() * 1000) % 1000:03d}"
        line = f"{stamp} {msg}\n"
        with self.lock:
            if self.file is not None:
                self.file.write(line)
                self.file.flush()
            else:
                sys.stderr.write(line)


def arg_parser(description):
    """The command line every fake takes: --dir (its state), --agent (the
    sbx-agent binary it runs for sandboxes), --listen (host:port)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--agent", required=True, help="the sbx-agent binary")
    ap.add_argument("--listen", default="127.0.0.1:0")
    return ap


def run_openssl(args, cwd):
    r = subprocess.run(["openssl"] + args, cwd=cwd, capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{r.stderr}")


def make_certs(d, ca_subject, leaves, suffix):
    """A CA ("ca" + suffix, "ca.key") and one certificate per leaf
    (who + suffix, who + ".key") signed by it, in directory d.  `leaves`
    is a list of (who, subject, extensions): the extension lines beyond
    basicConstraints and keyUsage.  EC P-256 keys, ten years; kept when all
    the files are already there (a fake restarted on its directory keeps
    its CA, so clients that trust it keep working)."""
    names = ["ca" + suffix, "ca.key"]
    for who, _, _ in leaves:
        names += [who + suffix, who + ".key"]
    if all(os.path.exists(os.path.join(d, n)) for n in names):
        return
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
          "-nodes"]
    run_openssl(["req", "-x509"] + ec + [
        "-keyout", "ca.key", "-out", "ca" + suffix, "-days", "3650",
        "-subj", ca_subject,
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"],
        d)
    for who, subj, ext in leaves:
        with open(os.path.join(d, who + ".ext"), "w") as f:
            f.write("basicConstraints=CA:FALSE\n"
                    "keyUsage=critical,digitalSignature,keyEncipherment\n"
                    + ext)
        run_openssl(["req", "-new"] + ec + [
            "-keyout", who + ".key", "-out", who + ".csr", "-subj", subj], d)
        run_openssl(["x509", "-req", "-in", who + ".csr", "-CA", "ca" + suffix,
                     "-CAkey", "ca.key", "-CAcreateserial", "-days", "3650",
                     "-out", who + suffix, "-extfile", who + ".ext"], d)
    for n in names:
        if n.endswith(".key"):
            os.chmod(os.path.join(d, n), 0o600)


def write_atomic(path, text, mode=0o644):
    """Write a whole file that readers never see half written."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def unlink_quiet(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def prepare_dir(d, subdirs, log, agent, prog):
    """The start of a fake's main(): its state directory with `subdirs`, no
    stale ready file, the log opened on d/fake.log.  Returns an error
    message when `agent` is not an executable, else None."""
    for s in subdirs:
        os.makedirs(os.path.join(d, s), exist_ok=True)
    unlink_quiet(os.path.join(d, "ready"))
    log.open(os.path.join(d, "fake.log"))
    if not os.access(agent, os.X_OK):
        return f"{prog}: --agent {agent} is not an executable\n"
    return None


def signal_group(proc, sig):
    """Send `sig` to the process group of `proc` (an agent runs in a
    session of its own, with its children), or to `proc` alone when that
    fails."""
    try:
        os.killpg(proc.pid, sig)
    except OSError:
        try:
            proc.send_signal(sig)
        except OSError:
            pass


def reap(proc, grace, final=None):
    """Wait `grace` seconds for `proc` to exit, then SIGKILL its group and
    wait `final` seconds more (None: until it exits)."""
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        try:
            proc.wait(final)
        except subprocess.TimeoutExpired:
            pass


# sbx-agent options that take a value, which the fakes rewrite to run the
# agent on the host (paths under the fake's sandbox root, a free port).
AGENT_VALUE_OPTS = ("--root", "--listen", "--token-file", "--tls-cert",
                    "--tls-key", "--token-env")


def agent_options(args):
    """Walk sbx-agent arguments: (opt, value) for each option of
    AGENT_VALUE_OPTS, given as `--opt VALUE` or `--opt=VALUE`; (arg, None)
    for every other argument, and for such an option left without its value
    at the end, which the caller passes on as it is."""
    i = 0
    while i < len(args):
        a = args[i]
        opt, val, has_eq = a, None, False
        if a.startswith("--") and "=" in a:
            opt, val = a.split("=", 1)
            has_eq = True
        takes = opt in AGENT_VALUE_OPTS
        if takes and not has_eq:
            if i + 1 >= len(args):
                yield a, None
                i += 1
                continue
            val = args[i + 1]
            i += 1
        i += 1
        if not takes:
            yield a, None
            continue
        yield opt, val


class Spawner:
    """Starts every agent from one long-lived thread: a parent-death signal
    (PR_SET_PDEATHSIG) fires when the *thread* that forked exits, so the
    forking thread must outlive the agents.  Subclasses say how the signal
    is set in start()."""

    def __init__(self):
        self.q = queue.Queue()
        threading.Thread(target=self._run, name="spawner", daemon=True).start()

    def start(self, argv, kw):
        return subprocess.Popen(argv, **kw)

    def _run(self):
        while True:
            argv, kw, box, done = self.q.get()
            try:
                box.append(self.start(argv, kw))
            except Exception as e:  # noqa: BLE001
                box.append(e)
            done.set()

    def popen(self, argv, **kw):
        box, done = [], threading.Event()
        self.q.put((argv, kw, box, done))
        done.wait(30)
        if not box:
            raise RuntimeError("spawner did not answer")
        if isinstance(box[0], Exception):
            raise box[0]
        return box[0]
