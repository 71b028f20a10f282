"""A request body, read within a size limit and parsed as strict JSON, or a clear error.

The body is refused with 413 (``BodyTooLargeError``) before it is read whole:
at once when its ``Content-Length`` says it is too large, and as soon as a
body sent without one (chunked) passes the limit. What is read must be UTF-8
(OpenAI's API and RFC 8259 say so) and JSON that Python can hold: nesting
deeper than ``MAX_DEPTH`` levels is refused before the parser recurses, and
so is a string holding a lone UTF-16 surrogate (``"\\udfff"`` is legal JSON
escaping but no Unicode character, so no tokenizer can take it). NaN and
Infinity are not JSON numbers and are refused too.

``excerpt`` is how every error message quotes what a client sent: a short
prefix, never the whole of a large value.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from specwire.errors import BodyTooLargeError, InvalidArgumentError

DEFAULT_MAX_BODY = 4 << 20  # bytes: a 128k-token prompt as text is well under 1 MB
MAX_DEPTH = 64  # an OpenAI request nests a few levels; a parser's recursion is not a resource to spend
EXCERPT_CHARS = 48


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)``, cut to ``limit`` characters with a note of how long it was."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


async def read_json(request: Request, max_bytes: int) -> Any:
    """The request's body as parsed JSON; ``BodyTooLargeError`` or ``InvalidArgumentError`` if not."""
    return parse_json(await read_body(request, max_bytes))


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The whole body, refused as soon as it is known to exceed ``max_bytes``."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidArgumentError(f"Content-Length {excerpt(declared)} is not a byte count")
        if int(declared) > max_bytes:
            raise BodyTooLargeError(_too_large(max_bytes, f"it declares {int(declared):,} bytes"))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLargeError(_too_large(max_bytes, "more than that arrived"))
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(data: bytes) -> Any:
    """Strict JSON from UTF-8 bytes (see the module docstring for what is refused)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidArgumentError(
            f"the request body is not valid UTF-8 (byte {data[err.start]:#04x} at offset {err.start})"
        ) from err
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except RecursionError as err:  # the parser's own bound, far past MAX_DEPTH
        raise InvalidArgumentError(_too_deep("more than the parser can hold")) from err
    except (json.JSONDecodeError, ValueError) as err:
        raise InvalidArgumentError(f"the request body is not valid JSON: {excerpt(str(err), 120)}") from err
    _check_values(body)
    return body


def _check_values(body: Any) -> None:
    """Refuse nesting past ``MAX_DEPTH`` and strings that hold a lone surrogate (keys included)."""
    if isinstance(body, str) and not _encodable(body):
        raise InvalidArgumentError(_surrogate("body"))
    stack: list[tuple[Any, str, int]] = [(body, "body", 0)]
    while stack:
        value, where, depth = stack.pop()
        if not isinstance(value, (list, dict)):
            continue
        if depth >= MAX_DEPTH:
            raise InvalidArgumentError(_too_deep(f"{depth + 1} or more levels"))
        items = enumerate(value) if isinstance(value, list) else value.items()
        for key, item in items:
            if isinstance(key, str) and not _encodable(key):
                raise InvalidArgumentError(_surrogate(f"a key of {where}"))
            if isinstance(item, str) and not _encodable(item):
                raise InvalidArgumentError(_surrogate(_path(where, key)))
            if isinstance(item, (list, dict)):
                stack.append((item, _path(where, key), depth + 1))


def _path(where: str, key: object) -> str:
    """How an error names a member: ``messages[0].content``."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    name = str(key) if str(key).isidentifier() else excerpt(key, 24)
    return name if where == "body" else f"{where}.{name}"


def _too_deep(detail: str) -> str:
    return f"the request body nests arrays and objects too deeply ({detail}; at most {MAX_DEPTH} levels)"


def _surrogate(where: str) -> str:
    return (
        f"{where} holds a lone UTF-16 surrogate (an escape such as \\udfff that is no character); "
        "send text as UTF-8"
    )


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def _too_large(max_bytes: int, why: str) -> str:
    return f"the request body is over the server's limit of {max_bytes:,} bytes ({why}); see --max-body"
