"""HTTP/1.1 to the upstream: a pool of kept-alive connections, responses, the TLS context, transport errors.

The upstream client (``mcpgateway.upstream.client``) speaks HTTP/1.1 itself so that it knows where
the first request byte was written: every failure before it is a ``RequestNotSent``.

The wire (``_Pool``, ``_Response``): HTTP/1.1 over ``http://`` and ``https://``
(certificates verified against the system trust store and certifi's, with SNI),
persistent connections bounded by ``max_connections``, bodies framed by
Content-Length, chunked transfer coding (extensions and trailers read and
ignored) or the end of the connection, ``Connection: close`` and HTTP/1.0
answers honoured. No proxy settings from the environment, no redirects followed,
no content codings (``Accept-Encoding: identity``).
"""

from __future__ import annotations

import base64
import contextlib
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote, unquote, urlsplit


class _InvalidReply(Exception):
    """The upstream answered completely, but not with a valid JSON-RPC response for our id."""


class _IncompleteReply(Exception):
    """The answer stopped (stream end, total timeout) before our response arrived."""


_TOTAL_TIMEOUT_REASON: Final = "total timeout passed before the response arrived"


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


# -- the wire: HTTP/1.1 over a pool of kept-alive sockets ----------------------------------------
#
# The exception classes name the failure in ``CallResult.reason`` (``_describe``). Every one
# raised before the first request byte is handed to the socket is a ``RequestNotSent``; that
# is the whole of the "not sent" judgement, so nothing else may subclass it.


class TransportError(Exception):
    """The HTTP exchange failed before a complete response; the class name opens the reported reason."""


class RequestNotSent(TransportError):
    """Raised only before the first byte of the request reached the socket: the upstream saw nothing."""


class UnsupportedProtocol(RequestNotSent):
    """The URL is not ``http://`` or ``https://`` with a host and a valid port."""


class ConnectError(RequestNotSent):
    """Name resolution, the TCP connect or the TLS handshake (certificate verification included) failed."""


class ConnectTimeout(RequestNotSent):
    """The TCP connect or the TLS handshake took longer than the connect timeout."""


class PoolTimeout(RequestNotSent):
    """Every connection stayed busy for the whole pool timeout."""


class ClientClosed(RequestNotSent):
    """The client had been closed."""


class WriteError(TransportError):
    """Writing the request failed; part of it may have reached the upstream."""


class WriteTimeout(TransportError):
    """Writing the request took longer than the write timeout; part of it may have reached the upstream."""


class ReadError(TransportError):
    """Reading the response failed (connection reset, TLS error)."""


class ReadTimeout(TransportError):
    """No response byte arrived within the read timeout."""


class RemoteProtocolError(TransportError):
    """The upstream closed the connection before a complete response, or broke HTTP/1.1 framing."""


_HEAD_END: Final = re.compile(rb"\n\r?\n")
_TOKEN: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE: Final = re.compile(r"[\t\x20-\x7e]*")
_CHUNK_SIZE: Final = re.compile(rb"[0-9A-Fa-f]{1,16}")
_MAX_HEAD_BYTES: Final = 64 * 1024
_MAX_LINE_BYTES: Final = 8 * 1024
_RECV_BYTES: Final = 64 * 1024
_DRAIN_GRACE: Final = 0.002
_DRAIN_BYTES: Final = 64 * 1024


def _check_value(value: str) -> str:
    """``value`` if it can be sent as a header value (printable ASCII and tabs), else ``ValueError``."""
    if not _HEADER_VALUE.fullmatch(value):
        raise ValueError("header value is not printable ASCII")
    return value


def _check_header(name: str, value: str) -> str:
    """The header line ``name: value`` (without CRLF), or ``ValueError`` if it cannot be sent."""
    if not _HEADER_NAME.fullmatch(name):
        raise ValueError(f"invalid header name {name!r}")
    return f"{name}: {_check_value(value)}"


def _tokens(value: str) -> set[str]:
    return {token.strip().lower() for token in value.split(",")}


@dataclass(frozen=True)
class _Origin:
    """Where requests go, parsed once from the URL; ``error`` is set for a URL no request can use."""

    tls: bool = False
    host: str = ""
    port: int = 0
    target: str = "/"
    host_header: str = ""
    authorization: str = ""
    error: str | None = None

    @classmethod
    def parse(cls, url: str) -> _Origin:
        try:
            parts = urlsplit(url)
            port = parts.port
            scheme = parts.scheme.lower()
            if scheme not in ("http", "https"):
                return cls(error=f"Request URL has an unsupported protocol '{scheme}://'")
            host = parts.hostname
            if not host:
                return cls(error="Request URL is missing a host")
            tls = scheme == "https"
            default_port = 443 if tls else 80
            port = port or default_port
            host_header = f"[{host}]" if ":" in host else host.encode("idna").decode("ascii")
            if port != default_port:
                host_header += f":{port}"
        except ValueError as exc:  # UnicodeError included (a host IDNA cannot encode)
            return cls(error=f"invalid URL: {exc}")
        target = quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")
        if parts.query:
            target += "?" + quote(parts.query, safe="/?%:@!$&'()*+,;=-._~")
        authorization = ""
        if parts.username is not None:
            credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            authorization = "Basic " + base64.b64encode(credentials.encode()).decode("ascii")
        return cls(tls=tls, host=host, port=port, target=target, host_header=host_header, authorization=authorization)


_default_context: ssl.SSLContext | None = None
_default_context_lock = threading.Lock()


def _default_ssl_context() -> ssl.SSLContext:
    """The verifying client context: the system trust store plus certifi's bundle when installed.

    Built once per process (loading the bundles costs milliseconds); an ``SSLContext``
    may wrap sockets from several threads.
    """
    global _default_context
    with _default_context_lock:
        if _default_context is None:
            context = ssl.create_default_context()
            try:
                import certifi
            except ImportError:
                pass
            else:
                context.load_verify_locations(cafile=certifi.where())
            context.set_alpn_protocols(["http/1.1"])
            _default_context = context
        return _default_context


if hasattr(select, "poll"):

    def _readable(sock: socket.socket) -> bool:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))

else:  # pragma: no cover - platforms without poll(); select() is limited to low descriptors

    def _readable(sock: socket.socket) -> bool:
        return bool(select.select([sock], [], [], 0)[0])


class _Connection:
    """One socket to the upstream and the bytes read from it but not yet consumed."""

    __slots__ = ("buffer", "idle_since", "sock", "timeout")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.idle_since = 0.0
        self.timeout = sock.gettimeout()

    def _set_timeout(self, timeout: float) -> None:
        if timeout != self.timeout:  # each settimeout() is a system call
            self.sock.settimeout(timeout)
            self.timeout = timeout

    def send(self, data: bytes, timeout: float) -> None:
        """Write all of ``data`` within ``timeout`` seconds (``sendall``'s timeout covers the whole write)."""
        try:
            self._set_timeout(timeout)
            self.sock.sendall(data)
        except TimeoutError as exc:
            raise WriteTimeout(str(exc) or "timed out") from exc
        except OSError as exc:
            raise WriteError(str(exc) or type(exc).__name__) from exc

    def recv(self, timeout: float) -> bytes:
        """The next bytes from the socket (``b""`` at the end of the stream), waiting at most ``timeout``."""
        try:
            self._set_timeout(timeout)
            return self.sock.recv(_RECV_BYTES)
        except TimeoutError as exc:
            raise ReadTimeout(str(exc) or "timed out") from exc
        except OSError as exc:
            raise ReadError(str(exc) or type(exc).__name__) from exc

    def reusable(self, now: float, expiry: float) -> bool:
        """Whether an idle connection can carry the next request.

        An idle socket that is readable has been closed by the peer (or holds bytes
        nobody asked for): a request written to it would be lost or misread, so it
        is not reused. Nor is one idle for longer than ``expiry``.
        """
        if self.buffer or now - self.idle_since > expiry:
            return False
        sock = self.sock
        try:
            if isinstance(sock, ssl.SSLSocket) and sock.pending():
                return False
            return not _readable(sock)
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class _Pool:
    """Kept-alive connections to one origin, shared by threads; at most ``max_connections`` open at once.

    A connection is held by one exchange at a time. Idle connections are reused
    newest first, after ``_Connection.reusable`` says yes.
    """

    def __init__(
        self,
        origin: _Origin,
        *,
        connect_timeout: float,
        read_timeout: float,
        write_timeout: float,
        pool_timeout: float,
        max_connections: int,
        keepalive_expiry: float,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.origin = origin
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self._connect_timeout = connect_timeout
        self._pool_timeout = pool_timeout
        self._max = max_connections
        self._keepalive_expiry = keepalive_expiry
        self._ssl_context = ssl_context
        self._cond = threading.Condition(threading.Lock())
        self._idle: list[_Connection] = []
        self._open = 0  # idle, busy and being opened
        self._closed = False

    def request(self, head: bytes, body: bytes, deadline: float | None, *, close: bool) -> _Response:
        """Send one request on a pooled or new connection and read the response head.

        Raises ``RequestNotSent`` when nothing was written (unusable URL, closed
        client, pool wait, connect), another ``TransportError`` once a byte may
        have left, and ``_IncompleteReply`` when ``deadline`` passes before the head
        arrived. Never resends, on any connection. The caller must ``close()`` the
        response. ``close`` says the request asked the server to close the connection.
        """
        if self.origin.error is not None:
            raise UnsupportedProtocol(self.origin.error)
        response = _Response(self, self._acquire(), deadline, keep_alive=not close)
        try:
            response.send(head + body)  # one write: the head and a small body leave in one segment
            response.read_head()
        except BaseException:
            response.discard()
            raise
        return response

    def _acquire(self) -> _Connection:
        stale: list[_Connection] = []
        try:
            with self._cond:
                deadline: float | None = None
                while True:
                    if self._closed:
                        raise ClientClosed("the upstream client is closed")
                    now = time.monotonic()
                    while self._idle:
                        conn = self._idle.pop()
                        if conn.reusable(now, self._keepalive_expiry):
                            return conn
                        stale.append(conn)
                        self._open -= 1
                    if self._open < self._max:
                        self._open += 1
                        break
                    if deadline is None:
                        deadline = now + self._pool_timeout
                    if now >= deadline:
                        raise PoolTimeout(f"no connection came free within {self._pool_timeout} s")
                    self._cond.wait(deadline - now)
        finally:
            for conn in stale:
                conn.close()
        try:
            return self._connect()
        except BaseException:
            self._forget_one()
            raise

    def _connect(self) -> _Connection:
        origin = self.origin
        try:
            sock = socket.create_connection((origin.host, origin.port), timeout=self._connect_timeout)
        except TimeoutError as exc:
            raise ConnectTimeout(str(exc) or "timed out") from exc
        except (OSError, ValueError) as exc:  # socket.gaierror is an OSError
            raise ConnectError(str(exc) or type(exc).__name__) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if origin.tls:
                context = self._ssl_context or _default_ssl_context()
                sock = context.wrap_socket(sock, server_hostname=origin.host)  # handshake, under the connect timeout
        except TimeoutError as exc:
            sock.close()
            raise ConnectTimeout(str(exc) or "timed out") from exc
        except (OSError, ValueError) as exc:  # ssl.SSLError (certificate verification too) is an OSError
            sock.close()
            raise ConnectError(str(exc) or type(exc).__name__) from exc
        return _Connection(sock)

    def release(self, conn: _Connection, reusable: bool) -> None:
        """Take back ``conn``: into the idle list when ``reusable`` (and the pool is open), else close it."""
        if reusable:
            conn.idle_since = time.monotonic()
            with self._cond:
                if not self._closed:
                    self._idle.append(conn)
                    self._cond.notify()
                    return
        conn.close()
        self._forget_one()

    def _forget_one(self) -> None:
        with self._cond:
            self._open -= 1
            self._cond.notify()

    def close(self) -> None:
        """Close the idle connections and refuse new requests; busy ones close when released."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            conn.close()

    def after_fork(self) -> None:
        """In a forked child: drop the parent's connections (closing only this process's descriptors)."""
        self._cond = threading.Condition(threading.Lock())
        idle, self._idle = self._idle, []
        self._open = 0
        for conn in idle:
            conn.close()


class _Response:
    """One exchange on a connection: the parsed response head, then the body as chunks.

    ``headers`` maps lower-case names to values (repeated fields joined with ", ").
    The body is framed by chunked transfer coding, Content-Length or the end of the
    connection (RFC 9112 section 6.3). ``close()`` returns the connection to the pool
    only when the body was read to its end, nothing followed it, neither side asked
    to close and the answer was HTTP/1.1; otherwise the socket is closed.
    """

    status: int
    headers: dict[str, str]

    def __init__(self, pool: _Pool, conn: _Connection, deadline: float | None, *, keep_alive: bool) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self._deadline = deadline
        self._grace: float | None = None
        self._keep_alive = keep_alive
        self._chunked = False
        self._length: int | None = None
        self._state = "head"  # head, ready, body, complete, broken
        self._body: Iterator[bytes] | None = None

    # -- reading ---------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        assert self._conn is not None
        self._conn.send(data, self._pool.write_timeout)

    def _recv(self) -> bytes:
        """One read, bounded by the read timeout, the total deadline (``_IncompleteReply``) and the drain grace."""
        assert self._conn is not None
        timeout, by_deadline = self._pool.read_timeout, False
        if self._deadline is not None or self._grace is not None:
            now = time.monotonic()
            if self._deadline is not None:
                left = self._deadline - now
                if left <= 0:
                    raise _IncompleteReply(_TOTAL_TIMEOUT_REASON)
                if left < timeout:
                    timeout, by_deadline = left, True
            if self._grace is not None:
                left = self._grace - now
                if left <= 0:
                    raise ReadTimeout("nothing more arrived")
                if left < timeout:
                    timeout, by_deadline = left, False
        try:
            return self._conn.recv(timeout)
        except ReadTimeout:
            if by_deadline:
                raise _IncompleteReply(_TOTAL_TIMEOUT_REASON) from None
            raise

    def read_head(self) -> None:
        """Read and parse the status line and header fields, skipping interim (1xx) responses."""
        assert self._conn is not None
        buf = self._conn.buffer
        while True:
            match = _HEAD_END.search(buf)
            while match is None:
                if len(buf) > _MAX_HEAD_BYTES:
                    raise RemoteProtocolError(f"response head larger than {_MAX_HEAD_BYTES} bytes")
                data = self._recv()
                if not data:
                    if buf:
                        raise RemoteProtocolError("Server disconnected in the middle of the response head.")
                    raise RemoteProtocolError("Server disconnected without sending a response.")
                searched = max(0, len(buf) - 2)
                buf += data
                match = _HEAD_END.search(buf, searched)
            lines = bytes(buf[: match.start()]).split(b"\n")
            del buf[: match.end()]
            status_line = lines[0].rstrip(b"\r")
            version, _, rest = status_line.partition(b" ")
            code = rest[:3]
            if (
                version not in (b"HTTP/1.1", b"HTTP/1.0")
                or len(code) != 3
                or not code.isdigit()
                or code < b"100"
                or rest[3:4] not in (b"", b" ")
            ):
                raise RemoteProtocolError(f"malformed status line {status_line[:100]!r}")
            status = int(code)
            if status >= 200:
                break
            if status == 101:
                raise RemoteProtocolError("unexpected 101 Switching Protocols")
        self.status = status
        self.headers = headers = _parse_fields(lines[1:])
        if version == b"HTTP/1.0" or ("connection" in headers and "close" in _tokens(headers["connection"])):
            self._keep_alive = False
        if status in (204, 304):
            self._length = 0
        elif "transfer-encoding" in headers:
            self._chunked = headers["transfer-encoding"].rsplit(",", 1)[-1].strip().lower() == "chunked"
            if not self._chunked or "content-length" in headers:
                self._keep_alive = False  # close-delimited, or framing a proxy could read otherwise
        elif "content-length" in headers:
            values = {value.strip() for value in headers["content-length"].split(",")}
            value = values.pop()
            if values or not (value.isascii() and value.isdigit()) or len(value) > 18:
                raise RemoteProtocolError(f"invalid Content-Length {headers['content-length'][:40]!r}")
            self._length = int(value)
        else:
            self._keep_alive = False  # the body ends when the server closes the connection
        self._state = "ready"

    def iter_chunks(self) -> Iterator[bytes]:
        """The body's bytes as they arrive (one iterator per response; stopping early is allowed)."""
        if self._body is None:
            self._body = self._read_body()
        return self._body

    def _read_body(self) -> Iterator[bytes]:
        self._state = "body"
        try:
            if self._chunked:
                yield from self._chunked_body()
            elif self._length is not None:
                yield from self._sized_body(self._length)
            else:
                yield from self._close_delimited_body()
        except BaseException:
            self._state = "broken"
            raise
        self._state = "complete"

    def _sized_body(self, length: int) -> Iterator[bytes]:
        assert self._conn is not None
        buf = self._conn.buffer
        remaining = length
        while remaining:
            if buf:
                if len(buf) <= remaining:
                    piece = bytes(buf)
                    buf.clear()
                else:
                    piece = bytes(buf[:remaining])
                    del buf[:remaining]
            else:
                piece = self._recv()
                if not piece:
                    raise RemoteProtocolError(
                        "peer closed connection without sending complete message body "
                        f"(received {length - remaining} of {length} bytes)"
                    )
                if len(piece) > remaining:
                    buf += piece[remaining:]  # more than was announced: kept, so the connection is not reused
                    piece = piece[:remaining]
            remaining -= len(piece)
            yield piece

    def _chunked_body(self) -> Iterator[bytes]:
        while True:
            line = self._line()
            size = line.split(b";", 1)[0].strip(b" \t")  # chunk extensions are ignored
            if not _CHUNK_SIZE.fullmatch(size):
                raise RemoteProtocolError(f"malformed chunk size line {line[:100]!r}")
            if size.strip(b"0") == b"":
                break
            yield from self._sized_body(int(size, 16))
            if self._line():
                raise RemoteProtocolError("chunk data not followed by CRLF")
        trailer_bytes = 0
        while line := self._line():  # trailer fields are read and ignored
            trailer_bytes += len(line)
            if trailer_bytes > _MAX_HEAD_BYTES:
                raise RemoteProtocolError(f"trailer fields larger than {_MAX_HEAD_BYTES} bytes")

    def _line(self) -> bytes:
        """One line of chunked framing (CRLF or LF), without its end."""
        assert self._conn is not None
        buf = self._conn.buffer
        searched = 0
        while (end := buf.find(b"\n", searched)) < 0:
            if len(buf) > _MAX_LINE_BYTES:
                raise RemoteProtocolError("chunked framing line too long")
            data = self._recv()
            if not data:
                raise RemoteProtocolError("peer closed connection without sending complete message body")
            searched = len(buf)
            buf += data
        line = bytes(buf[:end])
        del buf[: end + 1]
        return line[:-1] if line.endswith(b"\r") else line

    def _close_delimited_body(self) -> Iterator[bytes]:
        assert self._conn is not None
        buf = self._conn.buffer
        if buf:
            piece = bytes(buf)
            buf.clear()
            yield piece
        while data := self._recv():
            yield data

    # -- ending ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Give the connection back: to the pool if the exchange ended cleanly (see the class docstring)."""
        conn = self._conn
        if conn is None:
            return
        reusable = self._keep_alive and self._finish() and not conn.buffer
        self._conn = None
        self._pool.release(conn, reusable)

    def discard(self) -> None:
        """Close the connection whatever its state (the exchange failed)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.release(conn, False)

    def _finish(self) -> bool:
        """Whether the body has been read to its end, reading on briefly if the consumer stopped early.

        A consumer stops at our SSE event; the server usually ends the stream right
        after it, and reading that end (at most ``_DRAIN_BYTES`` within
        ``_DRAIN_GRACE`` seconds) keeps the connection for the next call.
        """
        if self._state in ("ready", "body"):
            self._grace = time.monotonic() + _DRAIN_GRACE
            drained = 0
            try:
                for piece in self.iter_chunks():
                    drained += len(piece)
                    if drained > _DRAIN_BYTES:
                        return False
            except Exception:
                return False
        return self._state == "complete"


def _parse_fields(lines: list[bytes]) -> dict[str, str]:
    """Header fields from the lines of a response head (CRLF or LF; obsolete line folding unfolded)."""
    headers: dict[str, str] = {}
    last: str | None = None
    for raw in lines:
        line = raw[:-1] if raw.endswith(b"\r") else raw
        if line[:1] in (b" ", b"\t"):
            if last is None:
                raise RemoteProtocolError("response head starts with a continuation line")
            headers[last] = headers[last] + " " + line.strip(b" \t").decode("latin-1")
            continue
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise RemoteProtocolError(f"malformed header line {line[:100]!r}")
        key = name.decode("ascii").lower()
        text = value.strip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
        last = key
    return headers
