"""Closing connections whose request headers do not arrive in time (slowloris clients).

uvicorn closes idle keep-alive connections, but not a connection that opens and sends nothing, nor a
request whose headers start and stall: such a client holds its connection (a file descriptor, a
protocol object) for as long as it likes, and enough of them exhaust the server. This is uvicorn's
httptools protocol with one timer: armed when the connection opens and when a request's first byte
arrives, cancelled when its headers are complete; if it fires, the connection is closed (there is
no request to answer yet). A body that stalls after complete headers is answered 408 by the app
(``app.read_body``), with the same ``timeout_s``.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def header_timeout_protocol(timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, closing connections whose request headers take over ``timeout_s``."""

    class HeaderTimeoutProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None

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

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimeoutProtocol
