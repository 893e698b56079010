"""Lenient extraction of one JSON value from model text (code fences and chatter around it are tolerated)."""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)


def parse_json_text(text: str | None) -> tuple[Any | None, str | None]:
    """Return (value, None) for the first JSON object/array found in `text`, or (None, error message)."""
    if text is None or not text.strip():
        return None, "empty answer"
    candidates = [text.strip()]
    candidates += [m.strip() for m in _FENCE.findall(text)]
    for open_c, close_c in (("{", "}"), ("[", "]")):
        start, end = text.find(open_c), text.rfind(close_c)
        if 0 <= start < end:
            candidates.append(text[start : end + 1])
    first_error = None
    for cand in candidates:
        try:
            return json.loads(cand), None
        except json.JSONDecodeError as e:
            first_error = first_error or f"invalid JSON ({e.msg} at line {e.lineno} column {e.colno})"
    return None, first_error
