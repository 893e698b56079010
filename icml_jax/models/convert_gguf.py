"""`python -m icml_jax.models.convert_gguf FILE DIR`: a Llama / Qwen2 / Qwen3 / Gemma3 GGUF file -> HF directory."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from icml_jax.models import gguf_io


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: convert one GGUF file; exit status 1 with one error line on failure."""
    parser = argparse.ArgumentParser(prog="python -m icml_jax.models.convert_gguf", description=__doc__)
    parser.add_argument("file", type=Path, help="the .gguf file")
    parser.add_argument("dir", type=Path, help="output directory (created; existing files are overwritten)")
    parser.add_argument("--chat-template", type=Path,
                        help="a Jinja chat template file to use instead of the GGUF's (or where it has none)")
    parser.add_argument("--eos-token", action="append", default=[],
                        help="an extra end-of-sequence token such as a chat end-of-turn token (repeatable)")
    args = parser.parse_args(argv)
    try:
        template = args.chat_template.read_text() if args.chat_template else None
        out = gguf_io.convert(args.file, args.dir, chat_template=template, extra_eos_tokens=args.eos_token)
    except (gguf_io.GGUFError, OSError) as e:
        print(f"convert_gguf error: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
