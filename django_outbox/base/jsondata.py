"""JSON given by callers (payloads, job arguments, results), checked in one place.

Whatever is accepted here can be stored on both databases, read back, shown in the
admin and replayed: strict JSON (no NaN or infinity), nested at most :data:`MAX_DEPTH`
levels (deeper values exhaust Python's recursion wherever they are read back), and
strings without NUL characters or lone surrogates (PostgreSQL cannot store them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

#: How deep lists and dicts may nest in one value (``[[1]]`` is two levels).
MAX_DEPTH = 100

#: A NUL escape (preceded by an even number of backslashes) or a lone surrogate in the
#: text ``json.dumps(..., ensure_ascii=False)`` writes.
_UNSTORABLE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000|[\ud800-\udfff]")
_UNSTORABLE_CHARACTER = re.compile("[\x00\ud800-\udfff]")


def dumps(value: Any, *, cls: type[json.JSONEncoder] | None = None) -> str:
    """Serialize *value* as JSON that every supported database stores and gives back.

    *cls* is a JSON encoder for types beyond JSON's own (a ``JSONField``'s encoder).
    Raise :class:`TypeError` or :class:`ValueError` saying what is wrong; callers turn
    it into their own library exception.
    """
    try:
        text = _encoder(cls).encode(value)
    except RecursionError as exc:
        raise ValueError(f"it nests lists and dicts deeper than {MAX_DEPTH} levels") from exc
    except ValueError as exc:
        if str(exc) == "Circular reference detected":
            raise ValueError("it contains itself") from exc
        raise
    # Nesting deeper than MAX_DEPTH needs more brackets than that (counted at C speed);
    # only then is the value walked.
    if text.count("[") + text.count("{") > MAX_DEPTH and _too_deep(value):
        raise ValueError(f"it nests lists and dicts deeper than {MAX_DEPTH} levels")
    # A NUL is written escaped, a lone surrogate as itself (not ASCII): only a text with
    # either can hold one.
    if (not text.isascii() or "\\u0000" in text) and _UNSTORABLE.search(text):
        raise ValueError(
            "a string in it holds a NUL character or a lone surrogate, which PostgreSQL "
            "cannot store"
        )
    return text


#: One encoder per class, reused: encoding keeps no state in it (a value that contains
#: itself is refused by the encoder's own check, per call).
_ENCODERS: dict[type[json.JSONEncoder] | None, json.JSONEncoder] = {}


def _encoder(cls: type[json.JSONEncoder] | None) -> json.JSONEncoder:
    encoder = _ENCODERS.get(cls)
    if encoder is None:
        encoder = _ENCODERS[cls] = (cls or json.JSONEncoder)(allow_nan=False, ensure_ascii=False)
    return encoder


def dumps_or(
    refuse: Callable[[Exception], Exception],
    value: Any,
    *,
    cls: type[json.JSONEncoder] | None = None,
) -> str:
    """:func:`dumps` *value* (with the encoder *cls*), or raise ``refuse(error)`` (a
    library exception) from it."""
    try:
        return dumps(value, cls=cls)
    except (TypeError, ValueError) as exc:
        raise refuse(exc) from exc


def storable_text(text: str) -> bool:
    """Whether PostgreSQL can store *text* (no NUL character, no lone surrogate)."""
    return _UNSTORABLE_CHARACTER.search(text) is None


def _too_deep(value: Any) -> bool:
    """Whether lists and dicts in *value* nest deeper than :data:`MAX_DEPTH` levels."""
    if not isinstance(value, (dict, list, tuple)):
        return False
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > MAX_DEPTH:
            return True
        stack.extend(
            (child, depth + 1) for child in children if isinstance(child, (dict, list, tuple))
        )
    return False
