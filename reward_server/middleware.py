"""ASGI middleware: the access log, the API key, and reading the body (size and time limits, and the
client's going away).

They run before FastAPI reads a body, so a request without the key, or one that is too large, is
answered without its body being parsed (or, when Content-Length says so, even read).
"""

import hmac
import json
import logging
import time

import anyio
from starlette.datastructures import Headers
from starlette.responses import JSONResponse

access_log = logging.getLogger("reward_server.access")


class ErrorResponse(JSONResponse):
    # ASCII-escaped: an error message may quote request text with lone surrogates, which UTF-8 cannot encode.
    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


def error_response(status: int, detail, message: str, headers: dict | None = None) -> ErrorResponse:
    """Every route's error body: FastAPI's {"detail": ...} (a message, or validation's list of errors) and PaddleNLP's
    error_code (the HTTP status) and error_msg (one line), so a client reads the same fields whatever it called."""
    return ErrorResponse({"detail": detail, "error_code": status, "error_msg": message}, status_code=status, headers=headers)


CLIENT_GONE = 499  # logged, never sent: the client went away before its answer (nginx's convention)


class AccessLog:
    """One line per request: method, path, items, bytes, milliseconds, item errors, status."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        state = scope.setdefault("state", {})  # the endpoints record items and item_errors here
        status = 500  # what the client sees if the app fails before answering

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            if state.get("disconnected"):
                status = CLIENT_GONE
            access_log.info(
                "%s %s items=%s bytes=%s ms=%.1f item_errors=%s status=%s",
                scope["method"],
                scope["path"].encode("unicode_escape").decode("ascii"),  # a %0A in the path must not start a line
                state.get("items", 0),
                state.get("bytes", 0),
                (time.perf_counter() - started) * 1000,
                state.get("item_errors", 0),
                status,
            )


class RequireKey:
    """With a key, every path but the open ones answers 401 without `Authorization: Bearer KEY`."""

    def __init__(self, app, api_key: str | None, open_paths: frozenset[str]):
        self.app, self.open_paths = app, open_paths
        self.key = None if api_key is None else api_key.encode()

    async def __call__(self, scope, receive, send):
        if self.key is None or scope["type"] != "http" or scope["path"] in self.open_paths:
            return await self.app(scope, receive, send)
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        # Header values arrive as latin-1 text; back to the bytes the client sent. Constant-time compare.
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode("latin-1"), self.key):
            return await self.app(scope, receive, send)
        message = "missing or wrong API key: send the header 'Authorization: Bearer KEY'"
        response = error_response(401, message, message, {"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)


class ReadBody:
    """Reads the whole body (FastAPI would anyway) within `timeout` seconds (else 408) and up to max_bytes
    (else 413); then runs the app while watching the connection, and cancels the app, with the scoring
    it waits for, when the client goes away before its answer."""

    def __init__(self, app, max_bytes: int, timeout: float):
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})
        declared = Headers(scope=scope).get("content-length", "")
        too_large = declared.isdigit() and int(declared) > self.max_bytes  # refused unread
        body = bytearray()
        with anyio.move_on_after(self.timeout) as reading:
            more = not too_large
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    state |= {"disconnected": True, "bytes": len(body)}
                    return
                body += message.get("body", b"")
                more = message.get("more_body", False)
                too_large = len(body) > self.max_bytes
                more = more and not too_large
        state["bytes"] = int(declared) if too_large and declared.isdigit() else len(body)
        if too_large:
            message = f"request body is larger than the server's limit of {self.max_bytes} bytes (--max_body_bytes)"
            return await self._refuse(scope, receive, send, 413, message)
        if reading.cancelled_caught:
            message = f"request body not received within {self.timeout:g} s (--body_timeout)"
            return await self._refuse(scope, receive, send, 408, message)
        await self._run(scope, receive, send, bytes(body))

    async def _refuse(self, scope, receive, send, status: int, message: str):
        # Connection: close, since the rest of the body may never come (408) or is not worth reading (413).
        response = error_response(status, message, message, {"Connection": "close"})
        await response(scope, receive, send)

    async def _run(self, scope, receive, send, body: bytes):
        gone = anyio.Event()
        pending: bytes | None = body
        answered = False

        async def replay():
            nonlocal pending
            if pending is None:
                await gone.wait()  # after the body only the disconnect comes
                return {"type": "http.disconnect"}
            message, pending = {"type": "http.request", "body": pending, "more_body": False}, None
            return message

        async def send_noting(message):
            nonlocal answered
            answered = answered or (message["type"] == "http.response.body" and not message.get("more_body"))
            await send(message)

        error = None
        async with anyio.create_task_group() as tasks:

            async def watch():
                await receive()  # http.disconnect: the connection closed, or the answer was sent
                gone.set()
                if not answered:
                    scope["state"]["disconnected"] = True
                    tasks.cancel_scope.cancel()

            tasks.start_soon(watch)
            try:
                await self.app(scope, replay, send_noting)
            except Exception as exc:  # raised below as it is, not wrapped in the task group's ExceptionGroup
                error = exc
            tasks.cancel_scope.cancel()
        if error is not None:
            raise error
