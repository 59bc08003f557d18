#!/usr/bin/env python3
"""A worker for the worker-pool tests (and the example/bench): the protocol in miniature.

It binds 127.0.0.1 on a free port, prints ``MOTOR_NODE_READY port=N`` on stdout, and
serves ``GET /health`` and ``POST /invoke`` (JSON in, JSON out). Standard library only.

Startup knobs (environment):
  POOL_WORKER_STARTUP_DELAY  seconds to wait before listening/printing the ready line
  POOL_WORKER_NEVER_READY=1  never print the ready line (log to stderr, sleep)
  POOL_WORKER_HEALTH_FAILS=1 print the ready line but answer /health with 500
  POOL_WORKER_READY_TOKEN    the token to print (default MOTOR_NODE_READY; the seed's
                             WOV_NODE_READY works too)
  POOL_WORKER_IGNORE_TERM=1  ignore SIGTERM (the pool must SIGKILL after its grace)
  POOL_WORKER_LOG            append one JSON line per call here (who served what, when)
  POOL_WORKER_DELAY          seconds each invoke takes (default 0)
  POOL_WORKER_CRASH_ON_INVOKE=1  die (SIGKILL itself) in the middle of every invoke
  POOL_WORKER_NON_JSON=1     answer invokes with text/plain

Per-call knobs (fields of the invoke body): ``delay`` (seconds), ``crash`` (true: die
mid-call), ``non_json`` (true), ``bad_json`` (true: application/json that is not JSON),
``status`` (HTTP status to answer with), ``stream`` (N: answer N SSE events then
[DONE]), ``env_keys`` (list: echo these environment variables), ``call`` (any tag,
echoed and logged).

The answer: {"status": "succeeded", "output": {...}, "instance_id": <X-Motor-Instance-Id
header>, "env_instance_id": <MOTOR_POOL_INSTANCE_ID>, "pid": ..., "in_flight": calls
running at once on this worker when this one started, "call": ..., "env": {...}}.
"""

import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENV_INSTANCE = os.environ.get("MOTOR_POOL_INSTANCE_ID", "")
LOG_PATH = os.environ.get("POOL_WORKER_LOG")
_lock = threading.Lock()
_in_flight = 0


def flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "false")


def log_call(rec: dict) -> None:
    if not LOG_PATH:
        return
    line = json.dumps(rec) + "\n"
    with _lock:
        # O_APPEND: lines of concurrent workers never interleave (one short write each).
        fd = os.open(LOG_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without TCP_NODELAY the body waits for the
    # peer's delayed ACK (40 ms per call).
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):  # keep stderr for the interesting lines
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            if flag("POOL_WORKER_HEALTH_FAILS"):
                self._send(500, b'{"status":"unhealthy"}')
            else:
                self._send(200, b'{"status":"ok"}')
            return
        self._send(404, b'{"detail":"not found"}')

    def do_POST(self):
        global _in_flight
        if self.path != "/invoke":
            self._send(404, b'{"detail":"not found"}')
            return
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"_raw": raw.decode(errors="replace")}
        if not isinstance(body, dict):
            body = {"_value": body}
        with _lock:
            _in_flight += 1
            seen = _in_flight
        t_start = time.time()
        try:
            header_id = self.headers.get("X-Motor-Instance-Id", "")
            delay = float(body.get("delay", os.environ.get("POOL_WORKER_DELAY", 0)) or 0)
            if body.get("crash") or flag("POOL_WORKER_CRASH_ON_INVOKE"):
                sys.stderr.write(f"worker {ENV_INSTANCE}: crashing on purpose mid-call\n")
                sys.stderr.flush()
                time.sleep(min(delay, 0.2))
                os.kill(os.getpid(), signal.SIGKILL)
            if delay > 0:
                time.sleep(delay)
            if body.get("non_json") or flag("POOL_WORKER_NON_JSON"):
                self._send(200, b"<html>definitely not json</html>", "text/plain")
                return
            if body.get("bad_json"):
                self._send(200, b'{"status": "succeeded", "output": ', "application/json")
                return
            stream = int(body.get("stream") or 0)
            if stream > 0:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for k in range(stream):
                    data = f"data: {json.dumps({'index': k, 'instance_id': header_id})}\n\n"
                    chunk = data.encode()
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    self.wfile.flush()
                    time.sleep(float(body.get("interval", 0.01)))
                done = b"data: [DONE]\n\n"
                self.wfile.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
                self.wfile.flush()
                return
            out = {
                "status": "succeeded",
                "output": {"echo": body.get("input")},
                "instance_id": header_id,
                "env_instance_id": ENV_INSTANCE,
                "node_id": self.headers.get("X-Motor-Node-Id", ""),
                "pid": os.getpid(),
                "in_flight": seen,
                "call": body.get("call"),
                "env": {k: os.environ.get(k) for k in body.get("env_keys", [])},
                "argv0": sys.executable,
            }
            self._send(int(body.get("status", 200)), json.dumps(out).encode())
        finally:
            with _lock:
                _in_flight -= 1
            log_call({"instance_id": ENV_INSTANCE, "header_instance_id":
                      self.headers.get("X-Motor-Instance-Id", ""), "pid": os.getpid(),
                      "call": body.get("call"), "t_start": t_start, "t_end": time.time()})


def main() -> None:
    if flag("POOL_WORKER_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stderr.write(f"worker {ENV_INSTANCE} pid {os.getpid()}: starting\n")
    sys.stderr.flush()
    if flag("POOL_WORKER_NEVER_READY"):
        for k in range(3):
            sys.stderr.write(f"loading model shard {k}/3 ...\n")
        sys.stderr.write("stuck: waiting for a GPU that never frees\n")
        sys.stderr.flush()
        while True:
            time.sleep(3600)
    delay = float(os.environ.get("POOL_WORKER_STARTUP_DELAY", 0) or 0)
    if delay > 0:
        time.sleep(delay)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    port = srv.server_address[1]
    token = os.environ.get("POOL_WORKER_READY_TOKEN", "MOTOR_NODE_READY")
    print(f"{token} port={port}", flush=True)
    sys.stderr.write(f"worker {ENV_INSTANCE}: listening on {port}\n")
    sys.stderr.flush()
    srv.serve_forever()


if __name__ == "__main__":
    main()
