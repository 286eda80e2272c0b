"""An MCP server for keel's tests (docs/mcp.md), on the official Python SDK.

Over stdio by default, or streamable HTTP on $PORT with the argument
`http`. Everything it wants the test to know goes to the file $SLOW_LOG,
one line each: `pid N` at start, `started ID` and `cancelled ID` for a
`slow` call, so a test can wait for a call to be running and see that a
cancel reached the server.
"""

import asyncio
import os
import sys

from mcp.server.mcpserver import Context, MCPServer

LOG = os.environ.get("SLOW_LOG", os.devnull)
server = MCPServer("slow")


def note(line: str) -> None:
    with open(LOG, "a") as log:
        log.write(line + "\n")


@server.tool()
def echo(message: str) -> str:
    """Answer with the message."""
    return message


@server.tool()
async def slow(seconds: float, ctx: Context) -> str:
    """Sleep for `seconds`, reporting progress; note a cancel."""
    note(f"started {ctx.request_id}")
    steps = max(1, int(seconds * 10))
    try:
        for i in range(steps):
            await ctx.report_progress(i + 1, steps, f"step {i + 1}")
            await asyncio.sleep(0.1)
    except asyncio.CancelledError:
        note(f"cancelled {ctx.request_id}")
        raise
    return f"slept {seconds} s"


@server.tool()
async def add_tool(ctx: Context) -> str:
    """Add the tool `extra`, and tell the client its tool list changed."""

    @server.tool()
    def extra() -> str:
        """A tool added while the server runs."""
        return "extra"

    await ctx.session.send_tool_list_changed()
    return "added"


@server.tool()
async def whoami(ctx: Context) -> str:
    """The Authorization header of the request (streamable HTTP only)."""
    headers = ctx.headers or {}
    return headers.get("authorization", "no authorization header")


@server.tool(name="a_tool_whose_name_is_far_too_long_for_any_provider_to_take_in_a_tool_list")
def too_long() -> str:
    """Never offered: its full name passes the 64 characters providers take."""
    return "never"


@server.tool()
def write_file(path: str, text: str) -> str:
    """Write `text` to `path` (for the sandbox's tests); say why not."""
    try:
        with open(path, "w") as out:
            out.write(text)
    except OSError as error:
        return f"not written: {error}"
    return "written"


@server.tool()
def getenv(name: str) -> str:
    """The server's environment variable `name`, or `(unset)`."""
    return os.environ.get(name, "(unset)")


@server.tool()
def crash() -> str:
    """Exit at once, as a server that dies mid-call."""
    print("about to die: last words on stderr", file=sys.stderr, flush=True)
    os._exit(3)


if __name__ == "__main__":
    note(f"pid {os.getpid()}")
    if len(sys.argv) > 1 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(os.environ["PORT"]))
    else:
        server.run()
