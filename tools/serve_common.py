"""Shared by the server's tests, tools/serve_load.py and tools/serve_bench.py (standard library only):
start and stop `k3c serve` on a free loopback port, plain HTTP requests, and an asyncio client for SSE
streams that can be cut off at any point."""

import asyncio
import http.client
import json
import os
import signal
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The model the tests and tools serve unless told otherwise: the trained model k3c embeds, from its files in
# the tree (named explicitly, whatever the CLI's default), served under its directory's name.
MODEL_DIR = os.path.join(ROOT, "models", "k3-fortune")
MODEL_NAME = "k3-fortune"


class Server:
    """`k3c serve --port 0` with the given options (--model MODEL_DIR unless they name a model or a preset); the port
    comes back through --port-file. Used as a context manager: started on enter (ready once /health answers
    200), stopped by SIGTERM on exit."""

    def __init__(self, k3c=None, args=(), env=None, ready_timeout=120, log=None):
        self.k3c = k3c or os.path.join(ROOT, "build", "k3c")
        self.args = list(args) if "--model" in args or "--preset" in args else ["--model", MODEL_DIR] + list(args)
        self.env = env
        self.ready_timeout = ready_timeout
        self.log_path = log
        self.proc = None
        self.port = None
        self.returncode = None

    def start(self):
        self.tmp = tempfile.mkdtemp(prefix="k3c-serve-")
        port_file = os.path.join(self.tmp, "port")
        if self.log_path is None:
            self.log_path = os.path.join(self.tmp, "server.log")
        self.log = open(self.log_path, "w")
        env = dict(os.environ)
        env.update(self.env or {})
        self.proc = subprocess.Popen([self.k3c, "serve", "--port", "0", "--port-file", port_file] + self.args,
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        end = time.time() + self.ready_timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("k3c serve exited with %d before it was ready:\n%s" % (self.proc.returncode, self.log_text()))
            if self.port is None and os.path.exists(port_file):
                self.port = int(open(port_file).read())
            if self.port is not None:
                try:
                    status, _ = self.request("GET", "/health", timeout=2)
                    if status == 200:
                        return self
                except OSError:
                    pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("k3c serve was not ready within %d s:\n%s" % (self.ready_timeout, self.log_text()))

    def log_text(self):
        try:
            if not self.log.closed:
                self.log.flush()
            return open(self.log_path).read()
        except OSError:
            return ""

    def stop(self, timeout=60):
        """SIGTERM, then the exit status (SIGKILL after timeout: a hang is a failure the caller sees)."""
        if self.proc is None:
            return self.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.returncode = self.proc.returncode
        self.proc = None
        self.log.close()
        return self.returncode

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def base(self):
        return "http://127.0.0.1:%d" % self.port

    def request(self, method, path, body=None, headers=None, timeout=120, raw=None):
        """(status, decoded JSON or text). body: an object sent as JSON; raw: bytes sent as they are."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
            h = {"Content-Type": "application/json"}
            h.update(headers or {})
            conn.request(method, path, body=data, headers=h)
            r = conn.getresponse()
            text = r.read().decode("utf-8")
            try:
                return r.status, json.loads(text)
            except ValueError:
                return r.status, text
        finally:
            conn.close()

    def metrics(self):
        """The /metrics samples as {name: value}, the model_name and engine labels left out (samples with
        other labels keyed with them)."""
        status, text = self.request("GET", "/metrics")
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name, value = line.rsplit(" ", 1)
            if "{" in name:
                base, labels = name.split("{", 1)
                labels = ",".join(l for l in labels.rstrip("}").split(",")
                                  if not l.startswith("model_name=") and not l.startswith("engine="))
                name = base + ("{" + labels + "}" if labels else "")
            out[name] = float(value)
        return out


def wait_for(pred, timeout, step=0.05):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


async def stream(port, path, body, cut_after=None, timeout=300, on_event=None):
    """POSTs body with stream true over one raw connection and reads the SSE events. cut_after: close the
    socket after that many data events (a client that leaves). Returns (status, [event JSON...], done,
    times) where done says whether [DONE] came and times[i] is when event i arrived (time.monotonic)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    data = json.dumps(body).encode()
    writer.write(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                 b"Connection: close\r\n\r\n" % (path.encode(), len(data)) + data)
    await writer.drain()
    events, times, done = [], [], False
    status = 0
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        status = int(head.split(b" ", 2)[1])
        chunked = b"chunked" in head.lower()
        buf = b""
        end = time.monotonic() + timeout

        async def more():
            if not chunked:
                return await asyncio.wait_for(reader.read(65536), end - time.monotonic())
            size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), end - time.monotonic())
            n = int(size_line.strip().split(b";")[0], 16)
            if n == 0:
                return b""
            chunk = await asyncio.wait_for(reader.readexactly(n + 2), end - time.monotonic())
            return chunk[:-2]

        while True:
            piece = await more()
            if not piece:
                break
            buf += piece
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if ev.startswith(b":"):
                    continue
                if not ev.startswith(b"data: "):
                    continue
                payload = ev[6:]
                if payload == b"[DONE]":
                    done = True
                    continue
                obj = json.loads(payload)
                events.append(obj)
                times.append(time.monotonic())
                if on_event:
                    on_event(obj)
                if cut_after is not None and len(events) >= cut_after:
                    return status, events, False, times
            if status != 200 and not chunked:
                break
        if status != 200:
            try:
                events.append(json.loads(buf or b"{}"))
            except ValueError:
                pass
        return status, events, done, times
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass


def joined_text(events, index=0):
    """The text of choice `index` from completion or chat chunks (content only for chat)."""
    out = []
    for e in events:
        for c in e.get("choices", []):
            if c.get("index") != index:
                continue
            if "text" in c:
                out.append(c["text"])
            elif c.get("delta", {}).get("content"):
                out.append(c["delta"]["content"])
    return "".join(out)


def finish_reason(events, index=0):
    for e in events:
        for c in e.get("choices", []):
            if c.get("index") == index and c.get("finish_reason"):
                return c["finish_reason"]
    return None
