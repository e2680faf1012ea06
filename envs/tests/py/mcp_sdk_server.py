"""An MCP server built on the official Python SDK (`mcp`, installed by `make` into .venv),
for tests/tools_mcp_http.rs: the same tools over stdio or over Streamable HTTP.

    python mcp_sdk_server.py stdio
    python mcp_sdk_server.py http PORT

`slow`, `die` and `flood` are faults on purpose (a test double's behaviour on a real server).
"""

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer

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
