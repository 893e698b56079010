"""One validator for untrusted text wherever it enters (the Memory API, the chat, MemoryStore's writers, the data
builders): lone surrogates, invalid UTF-8 and over-long text are refused with one `TextError` naming the method,
the argument and the offset, before anything is written.

Over-long input is refused, never truncated: a cut memory would lose what the user said without saying so. The
caps (`TextLimits`, config block `limits`) bound what one call can store or return; the defaults fit any turn a
person types or pastes (32 KiB of text) and keep a search result small (a 500-character source excerpt).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from icml_jax.configlib import known_fields

_UNDECODABLE = range(0xDC80, 0xDD00)  # where a decoder with errors="surrogateescape" puts a byte it cannot decode


@dataclasses.dataclass(frozen=True)
class TextLimits:
    """Size caps on untrusted text (config block `limits`): longer input is refused with a TextError."""

    max_text_chars: int = 32_768  # a turn, a message, a memory's new text, a search query, a chat line
    source_excerpt_chars: int = 500  # a search result's `source` (the turn a memory came from), cut with "…"
    max_metadata_chars: int = 32_768  # Memory.add's metadata, as JSON

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TextLimits.{field.name} must be a positive int, got {value!r}")

    @classmethod
    def from_config(cls, block: Mapping[str, Any] | Any | None) -> TextLimits:
        """The limits of a config block (`config.limits`, a dict from config.json, or None: the defaults)."""
        return cls(**known_fields(cls, block))


class TextError(ValueError):
    """Text refused where it entered: `where` (the method), `argument`, `reason` and `offset` (None: no offset)."""

    def __init__(self, where: str, argument: str, reason: str, offset: int | None = None, *,
                 unit: str = "character", byte: int | None = None) -> None:
        self.where, self.argument, self.reason, self.offset, self.unit = where, argument, reason, offset, unit
        self.byte = byte  # the undecodable byte, when the text held one
        at = "" if offset is None else f" at {unit} {offset}"
        super().__init__(f"{where}: {argument} {reason}{at}")


def check_text(value: Any, where: str, argument: str, *, max_chars: int | None = None,
               limit_key: str = "limits.max_text_chars", nonempty: bool = False) -> str:
    """`value` as a str when it is valid Unicode (bytes: strict UTF-8) within `max_chars` (the config key
    `limit_key` sets it) and, with `nonempty`, not empty; TextError otherwise.

    TypeError when `value` is neither str nor bytes (the caller's argument is of the wrong kind, not bad text).
    """
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise TextError(where, argument, f"is not valid UTF-8 ({e.reason}: byte 0x{value[e.start]:02x})",
                            e.start, unit="byte", byte=value[e.start]) from None
    if not isinstance(value, str):
        raise TypeError(f"{where}: {argument} must be a string, got {type(value).__name__}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            code = ord(value[e.start])
            if code in _UNDECODABLE:
                raise TextError(where, argument, f"is not valid UTF-8 (byte 0x{code - 0xDC00:02x}, or a lone "
                                f"surrogate U+{code:04X})", e.start, byte=code - 0xDC00) from None
            raise TextError(where, argument, f"holds a lone surrogate U+{code:04X} (not valid Unicode text)",
                            e.start) from None
    if max_chars is not None and len(value) > max_chars:
        raise TextError(where, argument, f"is {len(value)} characters long, over the limit of {max_chars} "
                        f"(config {limit_key})", max_chars)
    if nonempty and not value:
        raise TextError(where, argument, "must be a non-empty string")
    return value


def excerpt(text: str, max_chars: int) -> str:
    """`text` cut to at most `max_chars` characters, ending in "…" when it was cut."""
    return text if len(text) <= max_chars else text[: max(0, max_chars - 1)] + "…"
