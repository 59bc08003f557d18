#!/usr/bin/env python3
"""A minimal worker for the Motor worker pool (standard library only).

The protocol, all of it:
  1. listen on 127.0.0.1, any free port;
  2. print "MOTOR_NODE_READY port=<port>" on stdout (flushed) once you can serve;
  3. answer GET /health with 200 while you are fine;
  4. answer POST /invoke: a JSON body in, a JSON body out. The pool passes the instance
     id in the X-Motor-Instance-Id header (and MOTOR_POOL_INSTANCE_ID in the env);
  5. exit on SIGTERM (the pool sends it when it reaps you, SIGKILL after the grace).
Logs go to stderr: the pool keeps the last 200 lines for its admin API.

This one counts words. Try:
  motor worker-pool --port 8090 --manifests examples/pool/manifests &
  curl -s -XPOST localhost:8090/node-manager/pool/nodes/wordcount/invoke \\
       -d '{"input": {"text": "to be or not to be"}}'
"""

import json
import os
import sys
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the pool reuses its connections
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):
        sys.stderr.write("wordcount: " + (fmt % args) + "\n")

    def reply(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self.reply(200, {"status": "ok"})
        else:
            self.reply(404, {"detail": "not found"})

    def do_POST(self):
        if self.path != "/invoke":
            self.reply(404, {"detail": "not found"})
            return
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            text = json.loads(raw or b"{}").get("input", {}).get("text", "")
        except (ValueError, AttributeError):
            self.reply(400, {"status": "failed", "error": "body must be {\"input\": {\"text\": ...}}"})
            return
        words = text.split()
        self.reply(200, {
            "status": "succeeded",
            "output": {"words": len(words), "top": Counter(words).most_common(3)},
            "instance_id": self.headers.get("X-Motor-Instance-Id"),
        })


def main():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    lang = os.environ.get("WORDCOUNT_LANG", "en")
    sys.stderr.write(f"wordcount: ready (lang={lang})\n")
    print(f"MOTOR_NODE_READY port={srv.server_address[1]}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
