#!/usr/bin/python3
"""sv_listener — a supervisord event listener that reports process deaths to a
Controller, the measured peer of "Death → controller informed" (bench/nm_death_latency.py).

    [eventlistener:reporter]
    command=/usr/bin/python3 bench/lib/sv_listener.py CONTROLLER_PORT TMPDIR
    events=PROCESS_STATE_EXITED

Speaks supervisord's listener protocol on stdin/stdout (READY, a header line with
`len:N`, N bytes of payload, `RESULT 2\\nOK`) and, for every unexpected exit, POSTs a
fault report shaped like the node manager's to http://127.0.0.1:PORT/controller/
report_software_fault over one kept-alive connection (reconnecting once when the
server closed it). stdout belongs to the protocol: diagnostics go to stderr.
TMPDIR is only there so the bench's sweep recognises the process as its own.
Standard library only.
"""

import http.client
import json
import sys


def fields(text: str) -> dict:
    out = {}
    for tok in text.split():
        k, _, v = tok.partition(":")
        out[k] = v
    return out


def main() -> int:
    port = int(sys.argv[1])
    conn = None
    rd, wr = sys.stdin.buffer, sys.stdout.buffer
    while True:
        wr.write(b"READY\n")
        wr.flush()
        line = rd.readline()
        if not line:
            return 0
        hdr = fields(line.decode())
        payload = fields(rd.read(int(hdr.get("len", "0"))).decode())
        if hdr.get("eventname") == "PROCESS_STATE_EXITED" and payload.get("expected") != "1":
            body = json.dumps({
                "engine_id": payload.get("processname", ""),
                "fault_type": "EngineDeadError", "engine_status": 1,
                "additional_info": {"source": "supervisord", "pid": int(payload.get("pid", 0)),
                                    "from_state": payload.get("from_state", "")}}).encode()
            for attempt in (0, 1):
                try:
                    if conn is None:
                        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                    conn.request("POST", "/controller/report_software_fault", body=body,
                                 headers={"Content-Type": "application/json"})
                    conn.getresponse().read()
                    break
                except (OSError, http.client.HTTPException) as e:
                    conn = None
                    if attempt:
                        print(f"sv_listener: report failed: {e}", file=sys.stderr, flush=True)
        wr.write(b"RESULT 2\nOK")
        wr.flush()


if __name__ == "__main__":
    sys.exit(main())
