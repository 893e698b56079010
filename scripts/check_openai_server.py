"""Checks a live OpenAI-compatible server through this project's back end (kind=openai, `OpenAIBackend`): the
request kinds a run sends, one row each, with what works and what each failure says.

Rows: a plain answer; JSON with a schema under structured_output=auto (the answer must parse to the schema; the
row names the mode the back end settled on and why it left the ones above); `--concurrency` requests at once;
the answer cache (a second identical request must not reach the server); the token counts (each answer's and
the back end's totals). With `--context_tokens` (the server's window, e.g. llama-cpp-python's `--n_ctx`) also a
prompt just under the window (must be answered) and one over it (must fail at once, not retried, with the
server's reason); prompt sizes are measured with the server's own prompt-token counts. Prints a Markdown table;
exits 0 when no row failed, 1 otherwise.

    python scripts/check_openai_server.py http://127.0.0.1:8000/v1 smollm2-135m-instruct --context_tokens 1024
    python scripts/check_openai_server.py https://api.openai.com/v1 gpt-4o-mini --api_key_env OPENAI_API_KEY
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from icml_jax.llm.cache import CachedBackend, ResponseCache, answer_namespace  # noqa: E402
from icml_jax.llm.openai_compat import OpenAIBackend, structured_mode_of  # noqa: E402
from icml_jax.llm.registry import make_backend  # noqa: E402
from icml_jax.llm.types import BackendError, LLMRequest, LLMResponse  # noqa: E402

KINDS = ("plain", "json_schema", "concurrent", "near_context", "over_context", "cache", "token_counts")
# Small enough for a 135M model to fill within a short cap; closed, so a constrained decoder ends the object.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"capital": {"type": "string", "maxLength": 24}, "is_european": {"type": "boolean"}},
    "required": ["capital", "is_european"],
    "additionalProperties": False,
}
JSON_SYSTEM = 'Answer with one JSON object: {"capital": the city, "is_european": true or false}.'
JSON_PROMPT = "What is the capital of France?"
FILLER = " apple"  # one unit of a long prompt (one token in common BPE vocabularies; measured, not assumed)
CONTEXT_MARGIN = 24  # tokens kept free under the window: the chat template and a unit's tokens vary a little
OVER_BY = 64  # how far over the window the over-context prompt is meant to be
_DETAIL_CHARS = 240


@dataclasses.dataclass(frozen=True)
class Row:
    """One request kind's outcome: ok True / False, or None when skipped; `detail` says what was seen."""

    kind: str
    ok: bool | None
    detail: str

    @property
    def verdict(self) -> str:
        """The result cell: ok, FAIL or skipped."""
        return "skipped" if self.ok is None else ("ok" if self.ok else "FAIL")


def one_line(text: object, limit: int = _DETAIL_CHARS) -> str:
    """`text` on one line, cut to `limit` characters, with '|' escaped for a Markdown cell."""
    flat = " ".join(str(text).split()).replace("|", "\\|")
    return flat if len(flat) <= limit else flat[:limit] + "..."


def matches_schema(value: Any, schema: Mapping[str, Any]) -> bool:
    """Whether `value` fits `schema` (the keywords SCHEMA uses: type, properties, required,
    additionalProperties: False, maxLength); enough to check a server's constrained answer without jsonschema."""
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict) or any(k not in value for k in schema.get("required", ())):
            return False
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is False and set(value) - set(props):
            return False
        return all(matches_schema(value[k], sub) for k, sub in props.items() if k in value)
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value))
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return True


@contextlib.contextmanager
def structured_output_log() -> Iterator[list[str]]:
    """Collects what the back end logs when structured_output=auto settles (the mode and each rejection)."""
    seen: list[str] = []

    class Collect(logging.Handler):
        """Keeps the messages about the structured-output decision."""

        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if "structured output uses" in message:
                seen.append(message)

    log = logging.getLogger("icml_jax.llm.openai_compat")
    handler, level = Collect(logging.INFO), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield seen
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


class Checker:
    """Runs the request kinds against one back end; each check returns its Row and never raises."""

    def __init__(self, block: Mapping[str, Any], *, context_tokens: int | None, max_output_tokens: int,
                 concurrency: int, cache_dir: Path) -> None:
        self.block = dict(block)
        self.context_tokens = context_tokens
        self.cap = max_output_tokens
        self.concurrency = concurrency
        self.cache_dir = cache_dir
        self.backend: OpenAIBackend = make_backend(self.block)  # type: ignore[assignment]
        self._per_unit: tuple[float, float] | None = None  # (prompt tokens of no filler, tokens per unit)

    def close(self) -> None:
        """Closes the back end (threads, connections)."""
        self.backend.close()

    def ask(self, prompt: str, *, max_output_tokens: int | None = None, **fields: Any) -> LLMResponse:
        """One request through the back end (BackendError when it fails for good)."""
        (answer,) = self.backend.generate([LLMRequest(prompt=prompt, max_output_tokens=max_output_tokens or self.cap,
                                                      **fields)])
        return answer

    def run(self, kinds: Sequence[str] = KINDS) -> list[Row]:
        """The rows of `kinds`, in order; an unexpected exception becomes its kind's failed row."""
        rows = []
        for kind in kinds:
            check: Callable[[], Row] = getattr(self, f"check_{kind}")
            try:
                rows.append(check())
            except BackendError as exc:
                rows.append(Row(kind, False, one_line(exc.last_error)))
            except Exception as exc:  # a row reports any failure; the next rows still run
                rows.append(Row(kind, False, one_line(f"{type(exc).__name__}: {exc}")))
        return rows

    def check_plain(self) -> Row:
        """A plain answer: some text, its finish reason and latency."""
        answer = self.ask("Say hello in five words.")
        text = answer.text.strip()
        detail = f"{len(text)} chars, finish_reason {answer.finish_reason}, {answer.latency_s:.2f}s: {text[:60]!r}"
        return Row("plain", bool(text), one_line(detail if text else f"empty answer ({detail})"))

    def check_json_schema(self) -> Row:
        """JSON under structured_output as configured (auto by default): parses to SCHEMA; the settled mode."""
        with structured_output_log() as decided:
            answer = self.ask(JSON_PROMPT, system=JSON_SYSTEM, json_schema=SCHEMA, task="check",
                              max_output_tokens=max(self.cap, 48))
        mode = structured_mode_of(self.backend)
        why = ""
        if decided and "server rejected" in decided[0]:
            why = "; left: " + decided[0].split("server rejected", 1)[1].strip()
        ok = answer.ok_json and matches_schema(answer.parsed, SCHEMA)
        got = answer.parsed if answer.ok_json else f"unparsed ({answer.parse_error}): {answer.text[:80]!r}"
        shape = "" if ok or not answer.ok_json else " (not the schema's shape)"
        return Row("json_schema", ok, one_line(f"structured_output={mode}: {got}{shape}{why}"))

    def check_concurrent(self) -> Row:
        """`concurrency` distinct requests at once through the back end's pool: all answered."""
        requests = [LLMRequest(prompt=f"Name a colour. ({i})", max_output_tokens=self.cap)
                    for i in range(self.concurrency)]
        t0, retries = time.monotonic(), self.backend.usage.retries
        outcomes = self.backend.generate_each(requests)
        seconds, retries = time.monotonic() - t0, self.backend.usage.retries - retries
        errors = [o for o in outcomes if isinstance(o, BackendError)]
        answered = [o for o in outcomes if isinstance(o, LLMResponse) and o.text.strip()]
        detail = f"{len(answered)}/{len(requests)} answered in {seconds:.2f}s, {retries} retries"
        empty = len(outcomes) - len(errors) - len(answered)
        if empty:
            detail += f"; {empty} empty answer(s)"
        if errors:
            detail += f"; first failure: {errors[0].last_error}"
        return Row("concurrent", len(answered) == len(requests), one_line(detail))

    def _measure(self) -> tuple[float, float]:
        """(prompt tokens with no filler, prompt tokens per FILLER unit), from the server's counts of two
        prompts; a chat template's tokens are in the first."""
        if self._per_unit is None:
            small, large = 8, 72
            a = self.ask(_filled(small), max_output_tokens=1).prompt_tokens
            b = self.ask(_filled(large), max_output_tokens=1).prompt_tokens
            if b <= a:
                raise ValueError(f"the server counted {a} and {b} prompt tokens for {small} and {large} filler units")
            per = (b - a) / (large - small)
            self._per_unit = (a - per * small, per)
        return self._per_unit

    def _units_for(self, tokens: int) -> int:
        """Filler units whose prompt the server counts as about `tokens` tokens."""
        base, per = self._measure()
        return max(1, int((tokens - base) / per))

    def check_near_context(self) -> Row:
        """A prompt just under the window (with room for the answer): answered."""
        if self.context_tokens is None:
            return Row("near_context", None, "give --context_tokens (the server's window) to run it")
        target = self.context_tokens - self.cap - CONTEXT_MARGIN
        answer = self.ask(_filled(self._units_for(target)))
        used = answer.prompt_tokens + answer.output_tokens
        detail = (f"{answer.prompt_tokens} prompt + {answer.output_tokens} output tokens of {self.context_tokens} "
                  f"answered in {answer.latency_s:.2f}s (finish_reason {answer.finish_reason})")
        ok = used <= self.context_tokens and answer.prompt_tokens >= self.context_tokens - self.cap - 2 * CONTEXT_MARGIN
        if not ok:
            detail += " (not near the window: the prompt-size estimate missed)"
        return Row("near_context", ok, one_line(detail))

    def check_over_context(self) -> Row:
        """A prompt over the window: one attempt, not retried, the server's reason in the error."""
        if self.context_tokens is None:
            return Row("over_context", None, "give --context_tokens (the server's window) to run it")
        units = self._units_for(self.context_tokens + OVER_BY)
        try:
            answer = self.ask(_filled(units))
        except BackendError as exc:
            ok = exc.attempts == 1 and not exc.retryable
            how = "refused at once" if ok else f"failed after {exc.attempts} attempt(s) (retried)"
            return Row("over_context", ok, one_line(f"{how}: {exc.last_error}"))
        return Row("over_context", False, one_line(
            f"answered a prompt of about {self.context_tokens + OVER_BY} tokens ({answer.prompt_tokens} counted) "
            f"over a window of {self.context_tokens}: the server truncates, or --context_tokens is not its window"))

    def check_cache(self) -> Row:
        """The same request twice through the answer cache: the second is not sent to the server."""
        cache = ResponseCache(self.cache_dir / "cache.sqlite")
        try:
            cached = CachedBackend(self.backend, cache, answer_namespace(self.block), per_request=True)
            request = LLMRequest(prompt="Say one word.", max_output_tokens=self.cap, task="check_cache")
            (first,) = cached.generate([request])
            calls = self.backend.usage.calls
            (second,) = cached.generate([request])
            sent = self.backend.usage.calls - calls
        finally:
            cache.close()
        ok = second == first and sent == 0 and (cached.misses, cached.hits) == (1, 1)
        return Row("cache", ok, f"misses {cached.misses}, hits {cached.hits}, server calls for the repeat {sent}, "
                                f"same answer: {second == first}")

    def check_token_counts(self) -> Row:
        """Two prompts of different length: positive counts, the longer prompt counted longer, output within the
        cap, and the back end's totals grown by exactly the answers' counts."""
        before = self.backend.usage
        short, long = self.backend.generate([
            LLMRequest(prompt="Count to three.", max_output_tokens=self.cap),
            LLMRequest(prompt="Count to three. " + "Then say the alphabet backwards, slowly. " * 4,
                       max_output_tokens=self.cap)])
        after = self.backend.usage
        grew = (after.prompt_tokens - before.prompt_tokens, after.output_tokens - before.output_tokens)
        summed = (short.prompt_tokens + long.prompt_tokens, short.output_tokens + long.output_tokens)
        ok = (0 < short.prompt_tokens < long.prompt_tokens and all(0 < r.output_tokens <= self.cap
                                                                   for r in (short, long)) and grew == summed)
        return Row("token_counts", ok, f"prompt {short.prompt_tokens} / {long.prompt_tokens}, output "
                                       f"{short.output_tokens} / {long.output_tokens} (cap {self.cap}); totals grew "
                                       f"by {grew[0]} / {grew[1]}, the answers' sums {summed[0]} / {summed[1]}")


def _filled(units: int) -> str:
    """A long prompt: `units` FILLER units and a one-word task."""
    return "Reply with one word." + FILLER * units


def format_table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table (kind | result | detail)."""
    lines = ["| kind | result | detail |", "|---|---|---|"]
    lines += [f"| {r.kind} | {r.verdict} | {r.detail} |" for r in rows]
    return "\n".join(lines)


def check_server(base_url: str, model: str, *, api_key_env: Sequence[str] = (), context_tokens: int | None = None,
                 max_output_tokens: int = 16, concurrency: int = 8, timeout_s: float = 120.0, max_attempts: int = 2,
                 kinds: Sequence[str] = KINDS) -> list[Row]:
    """The rows of `kinds` against the server at `base_url` serving `model`, through a back end configured as a
    user would (kind=openai, structured_output=auto); the answer cache lives in a temporary directory. Every
    attempt may take `timeout_s` (a server that answers one request at a time keeps the last of a burst waiting)."""
    block = {"kind": "openai", "base_url": base_url, "model": model, "api_key_env": tuple(api_key_env),
             "timeout_s": timeout_s, "timeout_tokens_per_s": None, "max_concurrency": concurrency,
             "max_attempts": max_attempts, "initial_backoff_s": 1.0, "max_backoff_s": 4.0}
    with tempfile.TemporaryDirectory(prefix="check_openai_server_") as tmp:
        checker = Checker(block, context_tokens=context_tokens, max_output_tokens=max_output_tokens,
                          concurrency=concurrency, cache_dir=Path(tmp))
        try:
            return checker.run(kinds)
        finally:
            checker.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Parses the command line, prints the table; 0 when no row failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base_url", help="the server's /v1 root, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("model", help="the model name requests carry (the server's served / alias name)")
    parser.add_argument("--api_key_env", nargs="*", default=[],
                        help="environment variables holding the key, first set wins (default: none, a keyless server)")
    parser.add_argument("--context_tokens", type=int, default=None,
                        help="the server's context window in tokens (runs the near / over context rows)")
    parser.add_argument("--max_output_tokens", type=int, default=16, help="the answers' length cap")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight in the concurrent row")
    parser.add_argument("--timeout_s", type=float, default=120.0, help="the longest one HTTP attempt may take")
    parser.add_argument("--max_attempts", type=int, default=2, help="attempts per request (transient faults)")
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS, help="the rows to run")
    parser.add_argument("-v", "--verbose", action="store_true", help="the back end's log lines on stderr")
    args = parser.parse_args(argv)
    handler = logging.StreamHandler()  # quiet unless -v: every failure is in the table already
    handler.setLevel(logging.INFO if args.verbose else logging.CRITICAL + 1)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler],
                        format="%(levelname)s %(name)s: %(message)s")
    t0 = time.monotonic()
    rows = check_server(args.base_url, args.model, api_key_env=args.api_key_env, context_tokens=args.context_tokens,
                        max_output_tokens=args.max_output_tokens, concurrency=args.concurrency,
                        timeout_s=args.timeout_s, max_attempts=args.max_attempts, kinds=args.kinds)
    print(f"{args.model} at {args.base_url} ({time.monotonic() - t0:.1f}s)\n")
    print(format_table(rows))
    return 1 if any(r.ok is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
