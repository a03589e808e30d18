"""Request bodies off ASGI, bounded: 413 past the limit (declared or as read)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the API front reads bodies too and does not load FastAPI
    from fastapi import Request

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    """The client disconnected mid-body."""


async def receive_whole_body(headers: Iterable[tuple[bytes, bytes]], receive: Receive, limit: int) -> bytes:
    """The request body off an ASGI receive channel; BodyTooLarge past limit (declared or read),
    ClientGone if the client disconnects mid-body."""
    for name, value in headers:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def receive_body(headers: Iterable[tuple[bytes, bytes]], receive: Receive, limit: int) -> bytes:
    """receive_whole_body, except that a client that disconnects mid-body gets b"" (its answer
    goes nowhere anyway)."""
    try:
        return await receive_whole_body(headers, receive, limit)
    except ClientGone:
        return b""


async def read_body(request: Request, limit: int) -> bytes:
    return await receive_body(request.headers.raw, request.receive, limit)
