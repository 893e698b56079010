"""The one text validator (issue 31): valid text passes unchanged, a lone surrogate or invalid UTF-8 is one
TextError naming the method, the argument and the offset, over-long text is refused at the boundary."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from icml_jax.textcheck import TextError, TextLimits, check_text, excerpt

ANY_TEXT = st.text(st.characters(exclude_categories=()))  # surrogates included (hypothesis leaves them out)


@pytest.mark.parametrize("value, reason, offset, unit", [
    ("ab\ud800c", "holds a lone surrogate U+D800", 2, "character"),
    ("caf\udce9", "is not valid UTF-8 (byte 0xe9, or a lone surrogate U+DCE9)", 3, "character"),
    ("\udfff", "holds a lone surrogate U+DFFF", 0, "character"),
    (b"caf\xe9!", "is not valid UTF-8 (invalid continuation byte: byte 0xe9)", 3, "byte"),
    (b"\xff", "is not valid UTF-8 (invalid start byte: byte 0xff)", 0, "byte"),
])
def test_invalid_text_is_one_error_naming_method_argument_and_offset(value, reason, offset, unit):
    with pytest.raises(TextError) as err:
        check_text(value, "Memory.add", "messages[1].content")
    assert str(err.value).startswith(f"Memory.add: messages[1].content {reason}")
    assert str(err.value).endswith(f" at {unit} {offset}")
    assert (err.value.where, err.value.argument, err.value.offset) == ("Memory.add", "messages[1].content", offset)
    assert isinstance(err.value, ValueError)


def test_the_size_cap_is_inclusive_and_names_its_config_key():
    assert check_text("x" * 8, "f", "text", max_chars=8) == "x" * 8
    with pytest.raises(TextError, match=r"f: text is 9 characters long, over the limit of 8 \(config "
                                         r"limits.max_text_chars\) at character 8"):
        check_text("x" * 9, "f", "text", max_chars=8)
    with pytest.raises(TextError, match=r"config limits.max_metadata_chars"):
        check_text("x" * 9, "f", "metadata", max_chars=8, limit_key="limits.max_metadata_chars")


def test_bytes_are_decoded_empty_is_refused_on_demand_and_other_types_are_type_errors():
    assert check_text("héllo".encode(), "f", "a") == "héllo"
    assert check_text("", "f", "a") == ""
    with pytest.raises(TextError, match="f: a must be a non-empty string"):
        check_text("", "f", "a", nonempty=True)
    with pytest.raises(TypeError, match="f: a must be a string, got int"):
        check_text(3, "f", "a")


@given(ANY_TEXT)
def test_any_text_either_passes_unchanged_or_is_a_text_error(value):
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        with pytest.raises(TextError) as err:
            check_text(value, "f", "a")
        assert err.value.offset == e.start
    else:
        assert check_text(value, "f", "a") is value


def test_limits_defaults_keys_and_bad_values():
    assert TextLimits() == TextLimits.from_config(None) == TextLimits.from_config({})
    assert TextLimits().max_text_chars == 32_768 and TextLimits().source_excerpt_chars == 500
    assert TextLimits.from_config({"max_text_chars": 10}).max_text_chars == 10
    with pytest.raises(ValueError, match=r"TextLimits: unknown key\(s\) \['max_chars'\]"):
        TextLimits.from_config({"max_chars": 10})
    with pytest.raises(ValueError, match="TextLimits.max_text_chars must be a positive int, got 0"):
        TextLimits(max_text_chars=0)


def test_an_excerpt_is_bounded_and_says_it_was_cut():
    assert excerpt("short", 5) == "short"
    assert excerpt("longer text", 5) == "long…" and len(excerpt("x" * 10_000, 500)) == 500
