"""An MCP server built on the official Python SDK (`mcp`, installed by `make` into .venv),
for tests/tools_mcp_http.rs: the same tools over stdio or over Streamable HTTP.

    python mcp_sdk_server.py stdio
    python mcp_sdk_server.py http PORT

`slow`, `die` and `flood` are faults on purpose (a test double's behaviour on a real server).
`effect` is a tool with a side effect that honours idempotency keys, as a service should: it
appends every call it receives to `$AGENT_R1_TEST_EFFECTS.attempts` and each effect (a key not
seen before) to `$AGENT_R1_TEST_EFFECTS`, one JSON line each.
"""

import asyncio
import json
import os
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("agent-r1-test")


@server.tool()
def echo(text: str) -> str:
    """Returns its text."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@server.tool()
async def slow(seconds: float) -> str:
    """Answers after this many seconds."""
    await asyncio.sleep(seconds)
    return "late"


@server.tool()
def effect(note: str, ctx: Context) -> str:
    """Records a side effect once per idempotency key; answers with the key."""
    meta = ctx.request_context.meta or {}
    key = meta.get("agent-r1/idempotency-key")
    path = os.environ["AGENT_R1_TEST_EFFECTS"]
    line = json.dumps({"key": key, "note": note}) + "\n"
    with open(path + ".attempts", "a") as f:
        f.write(line)
    seen = set()
    if os.path.exists(path):
        with open(path) as f:
            seen = {json.loads(l)["key"] for l in f if l.strip()}
    if key is None or key not in seen:
        with open(path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    return f"done {note} under {key}"


@server.tool()
def die() -> str:
    """Ends the server process at once."""
    os._exit(3)


@server.tool()
def flood(megabytes: int) -> str:
    """Answers with this many MiB of text."""
    return "x" * (megabytes << 20)


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
