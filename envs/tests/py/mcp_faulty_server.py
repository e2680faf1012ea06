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
"""
import json
import os
import sys
import time

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
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": msg["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "faulty", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": [{
            "name": "act", "description": "misbehaves on request",
            "inputSchema": {"type": "object", "properties": {
                "mode": {"type": "string"}, "padding": {"type": "string"}}}}]}})
    elif method == "tools/call":
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
            pass
        elif mode == "die":
            os._exit(3)
        elif mode == "env":
            result(rid, " ".join(sorted(os.environ)))
