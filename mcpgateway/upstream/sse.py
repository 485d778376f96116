"""Server-sent events from the upstream: the body in bounded chunks, split into lines and events."""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mcpgateway.upstream.http import _InvalidReply


def _ignore(chunk: bytes) -> None:
    """An ``on_chunk`` for bodies whose hash nobody keeps."""


def _bounded_chunks(chunks: Iterator[bytes], max_bytes: int, on_chunk: Callable[[bytes], None]) -> Iterator[bytes]:
    """The response body in chunks, each passed to ``on_chunk`` first; ``_InvalidReply`` past ``max_bytes``.

    The consumer stops pulling once it has its answer (an SSE event), so an answer
    that has arrived is never discarded; a JSON body counts as arrived when its end
    has been read. The total timeout is the wire's (``_Response``).
    """
    total = 0
    for chunk in chunks:
        on_chunk(chunk)
        total += len(chunk)
        if total > max_bytes:
            raise _InvalidReply(f"response larger than {max_bytes} bytes")
        yield chunk


@dataclass(frozen=True)
class _SSEEvent:
    event: str
    data: str


_LINE_END = re.compile(r"\r\n|\r|\n")


def _sse_lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """Split a UTF-8 byte stream into SSE lines (CRLF, CR or LF), across chunk boundaries."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending = ""
    for chunk in chunks:
        pending += decoder.decode(chunk)
        start = 0
        for match in _LINE_END.finditer(pending):
            if match.group() == "\r" and match.end() == len(pending):
                break  # maybe the first half of a CRLF split across chunks
            yield pending[start : match.start()]
            start = match.end()
        pending = pending[start:]
    pending += decoder.decode(b"", final=True)
    start = 0
    for match in _LINE_END.finditer(pending):
        yield pending[start : match.start()]
        start = match.end()
    if start < len(pending):
        yield pending[start:]


def _sse_events(chunks: Iterator[bytes]) -> Iterator[_SSEEvent]:
    """Dispatch SSE events (WHATWG rules for ``event`` and ``data``; ``id``/``retry``/comments ignored)."""
    event_type = ""
    data: list[str] = []
    for line in _sse_lines(chunks):
        if not line:
            if data:
                yield _SSEEvent(event=event_type or "message", data="\n".join(data))
            event_type, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event_type = value
