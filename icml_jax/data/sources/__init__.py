"""Pure parsers: one raw dataset file -> Episodes, with errors naming file and record, counts in a ParseReport."""

from icml_jax.data.sources.cc import parse_cc, parse_cc_style
from icml_jax.data.sources.gapchat import is_header_glitch, parse_gapchat
from icml_jax.data.sources.locomo import LocomoQuestion, parse_locomo
from icml_jax.data.sources.msc import parse_msc_cc_style, parse_msc_parlai

__all__ = [
    "LocomoQuestion",
    "is_header_glitch",
    "parse_cc",
    "parse_cc_style",
    "parse_gapchat",
    "parse_locomo",
    "parse_msc_cc_style",
    "parse_msc_parlai",
]
