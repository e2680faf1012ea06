"""A fault-injecting MCP server over stdio, for envs/tests/tools_mcp_faults.rs (a test double:
the real-server tests use mcp-server-time).

One tool, `act`, whose `mode` argument picks the behaviour of that call:
  ok            answer with the text "ok <pid>"
  stop_reading  answer, then never read stdin again (the client's writes then block)
  flood         write one endless line without a newline (64 MiB)
  bad_utf8      answer with invalid UTF-8 bytes inside the text
  hang          never answer (keeps reading)
  die           exit at once without answering
  env           answer with the names of the environment variables the server got
  count         answer with "count N": the tools/call requests this process received
  cancelled     answer with the ids of the requests the client cancelled, space-separated
  detach_die    start `sleep` in a session of its own that keeps stdout open, write its
                pid to CONTROL/helper, then exit without answering

With MCP_FAULTY_CONTROL set to a directory, the server appends "start <pid>" and
"hang <id>" lines to CONTROL/log as it starts and as it takes a `hang` call, and while the
file CONTROL/hold_init exists, it holds each `initialize` until a line arrives on the FIFO
CONTROL/release: "fail" makes it exit, anything else lets it answer.
"""
import json
import os
import subprocess
import sys
import time

CONTROL = os.environ.get("MCP_FAULTY_CONTROL")
calls = 0
cancelled = []


def log(line):
    if CONTROL:
        with open(os.path.join(CONTROL, "log"), "a") as f:
            f.write(line + "\n")

out = sys.stdout.buffer


def send(obj):
    out.write(json.dumps(obj).encode() + b"\n")
    out.flush()


def result(rid, text):
    send({"jsonrpc": "2.0", "id": rid,
          "result": {"content": [{"type": "text", "text": text}], "isError": False}})


for raw in sys.stdin.buffer:
    msg = json.loads(raw)
    method, rid = msg.get("method"), msg.get("id")
    if method == "initialize":
        log(f"start {os.getpid()}")
        if CONTROL and os.path.exists(os.path.join(CONTROL, "hold_init")):
            with open(os.path.join(CONTROL, "release")) as release:
                if release.readline().strip() == "fail":
                    os._exit(5)
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": msg["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "faulty", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": [{
            "name": "act", "description": "misbehaves on request",
            "inputSchema": {"type": "object", "properties": {
                "mode": {"type": "string"}, "padding": {"type": "string"}}}}]}})
    elif method == "notifications/cancelled":
        cancelled.append(str(msg["params"]["requestId"]))
    elif method == "tools/call":
        calls += 1
        mode = msg["params"]["arguments"].get("mode", "ok")
        if mode == "ok":
            result(rid, f"ok {os.getpid()}")
        elif mode == "stop_reading":
            result(rid, "not reading any more")
            while True:
                time.sleep(3600)
        elif mode == "flood":
            chunk = b"x" * (1 << 20)
            for _ in range(64):
                out.write(chunk)
            out.flush()
            while True:
                time.sleep(3600)
        elif mode == "bad_utf8":
            body = json.dumps({"jsonrpc": "2.0", "id": rid, "result": {
                "content": [{"type": "text", "text": "before@after"}], "isError": False}})
            out.write(body.encode().replace(b"@", b"\xff\xfe") + b"\n")
            out.flush()
        elif mode == "hang":
            log(f"hang {rid}")
        elif mode == "die":
            os._exit(3)
        elif mode == "env":
            result(rid, " ".join(sorted(os.environ)))
        elif mode == "count":
            result(rid, f"count {calls}")
        elif mode == "cancelled":
            result(rid, " ".join(cancelled))
        elif mode == "detach_die":
            helper = subprocess.Popen(["sleep", "1000"], start_new_session=True)
            with open(os.path.join(CONTROL, "helper"), "w") as f:
                f.write(str(helper.pid))
            os._exit(3)
