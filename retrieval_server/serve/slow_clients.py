"""Request heads that arrive too slowly (slowloris clients) or grow too large.

uvicorn closes idle keep-alive connections, but not a connection that opens and sends nothing, nor a
request whose headers start and stall: such a client holds its connection (a file descriptor, a
protocol object) for as long as it likes, and enough of them exhaust the server. Nor does its httptools
protocol limit the size of a request's head (request line and headers): the parser buffers a header
until it ends, so a client streaming a 200 MB header costs that much memory and keeps the connection
until the timeout. This is uvicorn's httptools protocol with two guards:

- a timer, armed when the connection opens and when a request's first byte arrives, cancelled when its
  headers are complete; if it fires, the connection is closed (there is no request to answer yet). A
  body that stalls after complete headers is answered 408 by the app (``app.read_body``), with the same
  ``timeout_s``.
- a byte budget of ``max_header_bytes`` for each request's head: bytes are counted as they arrive, from
  the end of the previous request (or the connection's start) to the end of the headers, and the parser is
  never fed past the budget. A head that does not end within it is answered 431 (Request Header Fields Too
  Large) and the connection is closed, as nginx and Node do; the limit is ``serve --max-header-bytes``. The
  close lingers (nginx's lingering close): the answer is followed by end-of-file and what the client still
  sends is read and dropped for ``LINGER_S``; closing at once, with its bytes unread, would reset the
  connection and lose the answer before the client reads it.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

LINGER_S = 1.0  # seconds a rejected client's further bytes are read and dropped before the connection is closed


def request_head_protocol(timeout_s: float, max_header_bytes: int) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, closing connections whose request head takes over ``timeout_s`` and answering
    431 (then closing) to one whose head is larger than ``max_header_bytes``."""

    class RequestHeadProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _head_budget: int | None = max_header_bytes  # bytes the current head may still take; None: head complete
        _rejected = False  # answered 431: the rest of the input is dropped until the connection closes

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.logger.info("closing a connection whose request headers took over %g s", timeout_s)
                self.transport.close()

        def _head_too_large(self) -> None:
            self._disarm()
            self.logger.info("answering 431 to a request whose head exceeds %d bytes", max_header_bytes)
            message = f"request line and headers exceed {max_header_bytes} bytes (the server's --max-header-bytes)"
            if self.cycle is not None and not self.cycle.response_complete:  # mid-response (pipelining): no answer
                self.transport.close()
                return
            self.transport.write(b"".join([
                STATUS_LINE[431], *(b"%s: %s\r\n" % header for header in self.server_state.default_headers),
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: %d\r\nconnection: close\r\n\r\n" % len(message), message.encode()]))
            self.transport.write_eof()
            self._rejected = True
            self.loop.call_later(LINGER_S, self.transport.close)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._rejected:
                return
            budget = self._head_budget
            if budget is None or len(data) <= budget:
                if budget is not None:
                    self._head_budget = budget - len(data)
                super().data_received(data)
                return
            self._head_budget = 0
            super().data_received(data[:budget])  # may complete the head (and reset the budget)
            if self.transport.is_closing():
                return
            if self._head_budget == 0:
                self._head_too_large()
            else:
                self.data_received(data[budget:])

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            self._head_budget = None
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._head_budget = max_header_bytes  # the next request's head on this connection
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return RequestHeadProtocol
