"""JSON from files others may write, looked at within limits before it is decoded.

``json.loads`` recurses once per nested object or array, so a line of ten thousand ``[`` is a
RecursionError, not a JSONDecodeError. :func:`json_depth` counts the nesting without recursion, and
:func:`loads_bounded` checks a line's length and depth before decoding it.
"""

from __future__ import annotations

import json
from typing import Any


def json_depth(text: str) -> int:
    """How deep objects and arrays nest in JSON ``text``, counted outside strings, without recursion."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "}]":
            depth -= 1
    return deepest


def loads_bounded(raw: bytes, max_bytes: int, max_depth: int) -> Any | None:
    """JSON from a file others may write (the audit, a request log): None for a line that is too
    long, nests deeper than ``max_depth``, is not UTF-8 or not JSON. Never raises on bad input."""
    if len(raw) > max_bytes:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if json_depth(text) > max_depth:
        return None
    try:
        return json.loads(text)
    except ValueError:  # JSONDecodeError, and integers past Python's digit limit
        return None
