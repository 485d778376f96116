"""A small upstream MCP server for demos and tests, built on the official MCP SDK.

Served as Streamable HTTP with JSON responses at ``/mcp`` on 127.0.0.1::

    python -m mcpgateway.demo_upstream --port 8765
    python manage.py demo_upstream --port 8765

Tools:

- ``notes.append`` appends a note to an in-memory notebook. It honours the
  idempotency key the gateway forwards (``params._meta["io.tollgate/idempotency-key"]``,
  else the ``Idempotency-Key`` header): a repeated key returns the first result
  and appends nothing.
- ``notes.list`` lists the notebook.
- ``math.add`` adds two numbers.
- ``clock.now`` answers the server's UTC time.
- ``demo.stats`` answers the per-tool counters (also at ``GET /stats``).

``GET /stats`` reports how often each tool ran, how often each idempotency key
arrived, and where the key was seen (header, ``_meta``), so a test can assert
that the upstream saw a call at most once. State lives in process memory and
is lost on restart: this is a demo, not a store.
"""

from __future__ import annotations

import argparse
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypedDict

from mcp.server.mcpserver import Context, MCPServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

IDEMPOTENCY_META_KEY = "io.tollgate/idempotency-key"
IDEMPOTENCY_HEADER = "Idempotency-Key"


class NoteAppendResult(TypedDict):
    """Structured output of ``notes.append``."""

    note_id: int
    text: str
    notebook_size: int
    idempotency_key: str | None


class NotesListResult(TypedDict):
    """Structured output of ``notes.list``."""

    notes: list[str]


class SumResult(TypedDict):
    """Structured output of ``math.add``."""

    sum: float


class ClockResult(TypedDict):
    """Structured output of ``clock.now``."""

    utc: str


class StatsResult(TypedDict):
    """Structured output of ``demo.stats``."""

    tool_calls: dict[str, int]
    key_arrivals: dict[str, int]
    notebook_size: int


@dataclass
class KeySighting:
    """Where one ``tools/call`` carried its idempotency key."""

    tool: str
    header_key: str | None
    meta_key: str | None


@dataclass
class DemoState:
    """Process-memory state of the demo upstream; every access holds ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    notes: list[str] = field(default_factory=list)
    tool_calls: Counter[str] = field(default_factory=Counter)
    key_arrivals: Counter[str] = field(default_factory=Counter)
    append_results: dict[str, NoteAppendResult] = field(default_factory=dict)
    sightings: list[KeySighting] = field(default_factory=list)

    def record(self, tool: str, ctx: Context | None) -> str | None:
        """Count one run of ``tool`` and return the idempotency key it carried (``_meta`` first, then header)."""
        header_key, meta_key = _idempotency_keys(ctx)
        key = meta_key or header_key
        with self.lock:
            self.tool_calls[tool] += 1
            if key is not None:
                self.key_arrivals[key] += 1
            self.sightings.append(KeySighting(tool=tool, header_key=header_key, meta_key=meta_key))
        return key

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready copy of the counters, as ``GET /stats`` serves them."""
        with self.lock:
            return {
                "tool_calls": dict(self.tool_calls),
                "key_arrivals": dict(self.key_arrivals),
                "notebook_size": len(self.notes),
                "sightings": [
                    {"tool": s.tool, "header_key": s.header_key, "meta_key": s.meta_key} for s in self.sightings
                ],
            }


def _idempotency_keys(ctx: Context | None) -> tuple[str | None, str | None]:
    """The idempotency key from the HTTP header and from the request ``_meta``, each ``None`` when absent."""
    if ctx is None:
        return None, None
    headers = ctx.headers
    header_key = headers.get(IDEMPOTENCY_HEADER.lower()) if headers is not None else None
    meta = ctx.request_context.meta or {}
    raw = meta.get(IDEMPOTENCY_META_KEY)
    meta_key = raw if isinstance(raw, str) else None
    return header_key, meta_key


def build_server(state: DemoState) -> MCPServer:
    """Build the demo MCP server over ``state``; tools with a TypedDict return type advertise an outputSchema."""
    server: MCPServer = MCPServer(
        "tollgate-demo-upstream",
        version="1.0.0",
        instructions="Demo upstream for Tollgate: a notebook, a calculator and a clock.",
    )

    @server.tool(name="notes.append", description="Append a note to the notebook. Idempotent per idempotency key.")
    def notes_append(text: str, ctx: Context) -> NoteAppendResult:
        key = state.record("notes.append", ctx)
        with state.lock:
            if key is not None and key in state.append_results:
                return state.append_results[key]
            state.notes.append(text)
            result = NoteAppendResult(
                note_id=len(state.notes), text=text, notebook_size=len(state.notes), idempotency_key=key
            )
            if key is not None:
                state.append_results[key] = result
            return result

    @server.tool(name="notes.list", description="List the notes in the notebook.")
    def notes_list(ctx: Context) -> NotesListResult:
        state.record("notes.list", ctx)
        with state.lock:
            return NotesListResult(notes=list(state.notes))

    @server.tool(name="math.add", description="Add two numbers.")
    def math_add(a: float, b: float, ctx: Context) -> SumResult:
        state.record("math.add", ctx)
        return SumResult(sum=a + b)

    @server.tool(name="clock.now", description="The server's current UTC time (ISO 8601).")
    def clock_now(ctx: Context) -> ClockResult:
        state.record("clock.now", ctx)
        return ClockResult(utc=datetime.now(UTC).isoformat())

    @server.tool(name="demo.stats", description="Per-tool call counters of this demo upstream.")
    def demo_stats() -> StatsResult:
        snap = state.snapshot()
        return StatsResult(
            tool_calls=snap["tool_calls"], key_arrivals=snap["key_arrivals"], notebook_size=snap["notebook_size"]
        )

    @server.custom_route("/stats", methods=["GET"])
    async def stats(request: Request) -> Response:
        return JSONResponse(state.snapshot())

    return server


def build_app(state: DemoState, *, stateless: bool = False) -> Starlette:
    """The ASGI app: Streamable HTTP with JSON responses at ``/mcp`` (sessions unless ``stateless``), ``GET /stats``."""
    return build_server(state).streamable_http_app(
        streamable_http_path="/mcp", json_response=True, stateless_http=stateless, host="127.0.0.1"
    )


def serve(*, port: int, host: str = "127.0.0.1", stateless: bool = False, sock: socket.socket | None = None) -> None:
    """Serve the demo upstream with uvicorn until interrupted; binds ``host:port`` unless ``sock`` is given."""
    import uvicorn

    config = uvicorn.Config(build_app(DemoState(), stateless=stateless), host=host, port=port, log_level="warning")
    server = uvicorn.Server(config)
    server.run(sockets=[sock] if sock is not None else None)


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: ``python -m mcpgateway.demo_upstream --port 8765 [--stateless]``."""
    parser = argparse.ArgumentParser(description="Run the Tollgate demo upstream MCP server on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--stateless", action="store_true", help="no Mcp-Session-Id sessions")
    args = parser.parse_args(argv)
    serve(port=args.port, stateless=args.stateless)


if __name__ == "__main__":
    main()
