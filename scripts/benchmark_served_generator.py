"""The evaluation's reply generator served by llama-cpp-python's OpenAI-compatible server against the local Flax
back end, side by side in one run: wall time, requests/s, output tokens/s and the share of targets whose greedy
replies are the same string (issue 54 item 6), so a CPU run can pick the faster generator knowingly.

The requests are the evaluation's own for the no-memory baseline: `icml_jax.evaluate.eval_episodes(config)`,
each episode's final-session targets (`final_session_targets`) with their gold histories (`gold_history`),
answered through `NoMemoryAgent.answer` -> `generate_replies` at `ReplySettings.from_config(config)` (temperature
= `eval.reply_temperature`, 0 in configs/gc_smollm2.py; max tokens = `learner.reply_max_tokens`), one back-end
call per episode's final session (7 targets in gc_smollm2) as the evaluation sends them. Both back ends get the
same `LLMRequest`s (checked: the run fails if any differs). The answer cache is left out: every request is sent.

Timing: the local back end first replays every batch once untimed (the warm-up pass: JIT compilation of each
(batch, length) bucket; its wall time is printed as the cold cost), the served one gets one short unrelated
request untimed. Then the batches are played interleaved, each batch on the local back end and then on the
server, so drift in the machine's load falls on both. The server answers one request at a time
(llama-cpp-python), so `--concurrency` above 1 only queues requests there; the two never run at once.

The local model is the same GGUF dequantized to float32 (`icml_jax.models.fetch`), but llama.cpp multiplies the
quantized weights with quantized activations, so greedy tokens may part ways: the identical share measures that.

    python scripts/benchmark_served_generator.py --config=configs/gc_smollm2.py --data_dir=/tmp/tfds --start_server
    python scripts/benchmark_served_generator.py --config=configs/gc_smollm2.py --data_dir=/tmp/tfds \
        --base_url=http://127.0.0.1:8000/v1 --model=smollm2-135m-instruct --targets 14

`--start_server` runs `python -m llama_cpp.server` (the test extra's pin) on a free loopback port with the
fetched GGUF (`python -m icml_jax.models.fetch smollm2-135m-instruct`) and stops it at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from icml_jax.baselines.common import ReplySettings, user_speaker_of
from icml_jax.baselines.no_memory import NoMemoryAgent
from icml_jax.data.protocol import Target, final_session_targets
from icml_jax.data.schema import Episode
from icml_jax.evaluation.protocol import gold_history
from icml_jax.llm.types import LLMBackend, LLMRequest, LLMResponse

MODEL = "smollm2-135m-instruct"  # the fetched model whose GGUF the server reads, and the alias it answers to
START_TIMEOUT_S = 180.0  # loading a 135M GGUF takes seconds; a loaded machine may need more
LOG_TAIL_LINES = 30


class ServerError(RuntimeError):
    """llama-cpp-python's server did not start or did not stay up; the message holds its log's tail."""


# -- the evaluation's reply requests ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Batch:
    """One back-end call of the evaluation's replies: an episode's final-session targets and their gold histories."""

    episode: Episode
    targets: tuple[Target, ...]
    histories: tuple[list[tuple[str, str]], ...]


def reply_batches(episodes: Sequence[Episode], targets: int | None = None) -> list[Batch]:
    """The evaluation's reply calls for `episodes` (one per episode's final session, as `protocol._answer_final`
    builds them), cut after the first `targets` targets (None: all)."""
    if targets is not None and targets < 1:
        raise ValueError(f"--targets must be >= 1, got {targets}")
    out: list[Batch] = []
    left = targets
    for episode in episodes:
        chosen = final_session_targets(episode)
        if left is not None:
            chosen = chosen[:left]
            left -= len(chosen)
        if chosen:
            histories = tuple(list(gold_history(episode, t.session, t.turn)) for t in chosen)
            out.append(Batch(episode, tuple(chosen), histories))
        if left == 0:
            break
    return out


class Recorder:
    """A back end passed through, keeping every request and answer, so both back ends' inputs can be compared and
    their raw (unstripped) answers read."""

    def __init__(self, backend: LLMBackend) -> None:
        self.backend = backend
        self.name = getattr(backend, "name", "?")
        self.requests: list[LLMRequest] = []
        self.responses: list[LLMResponse] = []

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        """The wrapped back end's answers, recorded."""
        answers = list(self.backend.generate(requests))
        self.requests.extend(requests)
        self.responses.extend(answers)
        return answers


def _answer(agent: NoMemoryAgent, batch: Batch) -> float:
    """One reply call of the evaluation's no-memory agent; returns its wall seconds."""
    start = time.perf_counter()
    agent.answer(batch.episode.episode_id, batch.episode, list(batch.targets), list(batch.histories))
    return time.perf_counter() - start


# -- the comparison --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Arm:
    """One back end's timed pass: wall seconds over `requests` replies in `calls` back-end calls, their tokens."""

    label: str
    requests: int
    calls: int
    wall_s: float
    prompt_tokens: int
    output_tokens: int
    retries: int = 0

    @property
    def requests_per_s(self) -> float:
        """Replies per wall second."""
        return self.requests / self.wall_s if self.wall_s > 0 else float("inf")

    @property
    def output_tokens_per_s(self) -> float:
        """Output tokens (as the back end counts them) per wall second."""
        return self.output_tokens / self.wall_s if self.wall_s > 0 else float("inf")


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Both back ends' passes, the local warm-up's, and how their replies compare target by target."""

    local: Arm
    served: Arm
    local_warmup_s: float | None  # None: no warm-up pass
    targets: list[dict[str, Any]]  # per target: its id, both raw replies and token counts

    @property
    def n(self) -> int:
        """Targets compared."""
        return len(self.targets)

    @property
    def identical(self) -> int:
        """Targets whose two raw replies are the same string."""
        return sum(t["local"] == t["served"] for t in self.targets)

    @property
    def identical_stripped(self) -> int:
        """Targets whose two replies are the same after whitespace strip (what the evaluation records)."""
        return sum(t["local"].strip() == t["served"].strip() for t in self.targets)

    @property
    def common_prefix(self) -> float:
        """The mean share of the local reply's words that both replies share before their first differing word (1:
        identical after whitespace is collapsed), so near misses read apart from unrelated replies."""
        shares = []
        for t in self.targets:
            a, b = t["local"].split(), t["served"].split()
            same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            shares.append(1.0 if a == b else same / max(len(a), 1))
        return sum(shares) / len(shares) if shares else 0.0

    @property
    def same_prompt_tokens(self) -> int:
        """Targets whose prompt both back ends counted as the same number of tokens (the chat templates agree)."""
        return sum(t["local_prompt_tokens"] == t["served_prompt_tokens"] for t in self.targets)


def _arm(label: str, recorder: Recorder, first: int, wall_s: float, calls: int) -> Arm:
    """The pass of `recorder`'s answers from index `first` on."""
    answers = recorder.responses[first:]
    usage = getattr(recorder.backend, "usage", None)
    return Arm(label, len(answers), calls, wall_s, sum(r.prompt_tokens for r in answers),
               sum(r.output_tokens for r in answers), int(getattr(usage, "retries", 0) or 0))


def _first_difference(a: Sequence[LLMRequest], b: Sequence[LLMRequest]) -> str | None:
    """Where two request lists differ (None: they are equal)."""
    if len(a) != len(b):
        return f"{len(a)} requests against {len(b)}"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            fields = [f.name for f in dataclasses.fields(x) if getattr(x, f.name) != getattr(y, f.name)]
            return f"request {i} differs in {fields}"
    return None


def compare(batches: Sequence[Batch], local: LLMBackend, served: LLMBackend, *, settings: ReplySettings,
            user_speaker: str | None, warmup: bool = True, served_warmup: bool = True,
            labels: tuple[str, str] = ("local", "served"),
            progress: Callable[[str], None] | None = None) -> Comparison:
    """Answers every batch with both back ends through the evaluation's no-memory agent (the local warm-up pass
    first, untimed), interleaved batch by batch, and compares the replies target by target."""
    if not batches:
        raise ValueError("no evaluation targets to answer")
    say = progress or (lambda _: None)
    local_rec, served_rec = Recorder(local), Recorder(served)
    local_agent = NoMemoryAgent(local_rec, user_speaker=user_speaker, reply=settings)
    served_agent = NoMemoryAgent(served_rec, user_speaker=user_speaker, reply=settings)
    warmup_s = None
    if warmup:
        start = time.perf_counter()
        for i, batch in enumerate(batches):
            say(f"warm-up {labels[0]}: batch {i + 1}/{len(batches)}")
            _answer(local_agent, batch)
        warmup_s = time.perf_counter() - start
    if served_warmup:
        say(f"warm-up {labels[1]}: one short request")
        served.generate([LLMRequest(prompt="Reply with one word.", max_output_tokens=4, temperature=0.0)])
    local_first, served_first = len(local_rec.responses), len(served_rec.responses)
    local_s = served_s = 0.0
    for i, batch in enumerate(batches):
        say(f"timed: batch {i + 1}/{len(batches)} ({len(batch.targets)} targets)")
        try:
            local_s += _answer(local_agent, batch)
        except Exception as exc:
            raise RuntimeError(f"the {labels[0]} back end failed on episode {batch.episode.episode_id}: {exc}") from exc
        try:
            served_s += _answer(served_agent, batch)
        except Exception as exc:
            raise RuntimeError(f"the {labels[1]} back end failed on episode {batch.episode.episode_id}: {exc}") from exc
    local_requests, served_requests = local_rec.requests[local_first:], served_rec.requests[served_first:]
    differ = _first_difference(local_requests, served_requests)
    if differ is not None:
        raise RuntimeError(f"the two back ends were sent different requests: {differ}")
    targets = [t for b in batches for t in b.targets]
    rows = [{"episode_id": t.episode_id, "session": t.session, "turn": t.turn,
             "local": a.text, "served": b.text, "local_output_tokens": a.output_tokens,
             "served_output_tokens": b.output_tokens, "local_prompt_tokens": a.prompt_tokens,
             "served_prompt_tokens": b.prompt_tokens}
            for t, a, b in zip(targets, local_rec.responses[local_first:], served_rec.responses[served_first:],
                               strict=True)]
    return Comparison(_arm(labels[0], local_rec, local_first, local_s, len(batches)),
                      _arm(labels[1], served_rec, served_first, served_s, len(batches)), warmup_s, rows)


# -- the machine and the record ----------------------------------------------------------------------------------


def cpu_model() -> str:
    """/proc/cpuinfo's first "model name" and the logical CPU count."""
    name = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} ({os.cpu_count()} logical CPUs)"


def load_average() -> str:
    """The 1, 5 and 15-minute load averages."""
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def markdown(result: Comparison, *, local_note: str, served_note: str, machine: str, load_start: str,
             load_end: str) -> str:
    """The result as a Markdown table and notes for docs/benchmarks.md."""
    lines = ["| generator | replies (calls) | wall time | replies/s | output tokens | output tokens/s | retries |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for arm, note in ((result.local, local_note), (result.served, served_note)):
        lines.append(f"| {arm.label}: {note} | {arm.requests} ({arm.calls}) | {arm.wall_s:.2f} s | "
                     f"{arm.requests_per_s:.3f} | {arm.output_tokens} | {arm.output_tokens_per_s:.2f} | "
                     f"{arm.retries} |")
    speed = result.local.wall_s / result.served.wall_s if result.served.wall_s > 0 else float("inf")
    lines.append(f"| served speed-up (local wall time / served) | | **{speed:.2f}x** | | | | |")
    n = result.n
    lines += ["",
              f"Identical greedy replies: {result.identical}/{n} ({100 * result.identical / n:.1f}%) as raw strings, "
              f"{result.identical_stripped}/{n} ({100 * result.identical_stripped / n:.1f}%) after whitespace strip "
              f"(what the evaluation records); before their first differing word they share "
              f"{100 * result.common_prefix:.1f}% of the local reply's words on average. Prompt token counts equal "
              f"(the chat templates agree): {result.same_prompt_tokens}/{n}."]
    if result.local_warmup_s is not None:
        lines.append(f"Local warm-up pass (every batch once, JIT compile included; not in the table): "
                     f"{result.local_warmup_s:.2f} s.")
    lines.append(f"Machine: {machine}; load average (1, 5, 15 min) {load_start} at start, {load_end} at the end.")
    return "\n".join(lines)


# -- llama-cpp-python's server -----------------------------------------------------------------------------------


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a server log."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def server_command(gguf: Path, port: int, *, alias: str, n_ctx: int, n_threads: int) -> list[str]:
    """`python -m llama_cpp.server` on 127.0.0.1:`port` serving `gguf` as `alias`."""
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", alias,
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(n_threads)]


@contextlib.contextmanager
def running_server(command: Sequence[str], base_url: str, log_path: Path, *,
                   timeout_s: float = START_TIMEOUT_S) -> Iterator[str]:
    """Starts `command`, waits until `base_url`/models answers 200, yields `base_url`, and stops the process;
    ServerError with the log's tail when it exits or stays silent before that."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise ServerError(f"the server ({' '.join(command[:3])}) exited with {proc.returncode} before "
                                  f"answering {base_url}/models; its log ({log_path}) ends:\n{log_tail(log_path)}")
            try:
                with urllib.request.urlopen(f"{base_url}/models", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ServerError(f"the server did not answer {base_url}/models within {timeout_s:g} s; its log "
                                  f"({log_path}) ends:\n{log_tail(log_path)}")
            time.sleep(0.2)
        yield base_url
        if proc.poll() is not None:
            raise ServerError(f"the server exited with {proc.returncode} while serving; its log ({log_path}) "
                              f"ends:\n{log_tail(log_path)}")
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def served_block(base_url: str, model: str, *, concurrency: int, n_ctx: int | None) -> dict[str, Any]:
    """The OpenAI-compatible back-end block of a keyless local server (a minute per attempt: the server answers
    one request at a time, so the last of a batch waits for the others)."""
    block: dict[str, Any] = {"kind": "openai", "base_url": base_url, "model": model, "api_key_env": (),
                             "timeout_s": 120.0, "timeout_floor_s": 60.0, "max_concurrency": concurrency}
    if n_ctx is not None:
        block["context_tokens"] = n_ctx
    return block


def _version(package: str) -> str:
    """An installed package's version, or "not installed"."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# -- the command line --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="e.g. configs/gc_smollm2.py (its llm.generator: local)")
    parser.add_argument("--data_dir", required=True, help="the built TFDS data (config.data.data_dir)")
    parser.add_argument("--targets", type=int, default=None,
                        help="the first N evaluation targets (default: all of the config's, 91 in gc_smollm2)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--base_url", help="the /v1 root of a running OpenAI-compatible server")
    where.add_argument("--start_server", action="store_true",
                       help="start llama-cpp-python's server on a free loopback port with the fetched GGUF")
    parser.add_argument("--model", default=MODEL, help=f"the model name the server answers to (default {MODEL})")
    parser.add_argument("--n_ctx", type=int, default=2048,
                        help="the started server's context window (GapChat reply prompts: ~330-430 tokens + 32)")
    parser.add_argument("--n_threads", type=int, default=os.cpu_count() or 1,
                        help="the started server's threads (default: every logical CPU)")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="requests in flight to the server (the back end's max_concurrency; default 8)")
    parser.add_argument("--no_warmup", action="store_true", help="time the local back end's first (compiling) pass")
    parser.add_argument("--json", type=Path, default=None, help="also write every target's replies here")
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.n_ctx < 1 or args.n_threads < 1:
        parser.error("--concurrency, --n_ctx and --n_threads must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Builds the requests, starts (or reaches) the server, runs both passes and prints the record."""
    args = parse_args(argv)
    from icml_jax.configlib import load_config
    from icml_jax.evaluate import eval_episodes
    from icml_jax.llm import make_backend
    from icml_jax.models import fetch

    machine, load_start = cpu_model(), load_average()
    print(f"machine: {machine}; load average at start: {load_start}", flush=True)
    config = load_config(args.config, {"data.data_dir": args.data_dir})
    settings = ReplySettings.from_config(config)
    if settings.temperature != 0.0:
        raise SystemExit(f"{args.config}: the target replies are sampled at temperature {settings.temperature:g}; "
                         "the identical share needs greedy replies (eval.reply_temperature=0)")
    generator = config.llm.generator
    if generator.kind != "local":
        raise SystemExit(f"{args.config}: llm.generator.kind is {generator.kind!r}; the comparison's local arm needs "
                         "the local Flax back end")
    batches = reply_batches(eval_episodes(config), args.targets)
    n = sum(len(b.targets) for b in batches)
    print(f"{n} targets in {len(batches)} reply calls; greedy, max {settings.max_tokens} output tokens", flush=True)

    with contextlib.ExitStack() as stack:
        if args.start_server:
            gguf = fetch.gguf_path(fetch.model_dir(MODEL), MODEL)
            if not gguf.is_file():
                raise SystemExit(f"{gguf} is missing; run `{fetch.fetch_command(MODEL)}`")
            port = free_port()
            log_path = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llama_cpp_server_"))) / "log"
            start = time.perf_counter()
            base_url = stack.enter_context(running_server(
                server_command(gguf, port, alias=args.model, n_ctx=args.n_ctx, n_threads=args.n_threads),
                f"http://127.0.0.1:{port}/v1", log_path))
            print(f"server up at {base_url} in {time.perf_counter() - start:.1f} s ({gguf.name}, n_ctx {args.n_ctx}, "
                  f"{args.n_threads} threads)", flush=True)
            served_note = (f"llama-cpp-python {_version('llama_cpp_python')} server, {gguf.name}, n_ctx {args.n_ctx}, "
                           f"{args.n_threads} threads, concurrency {args.concurrency}")
        else:
            base_url = args.base_url
            served_note = f"OpenAI-compatible server at {base_url} ({args.model}), concurrency {args.concurrency}"
        served = stack.enter_context(make_backend(served_block(base_url, args.model, concurrency=args.concurrency,
                                                               n_ctx=args.n_ctx if args.start_server else None)))
        start = time.perf_counter()
        local = make_backend(generator)
        stack.callback(getattr(local, "close", lambda: None))
        print(f"local back end loaded in {time.perf_counter() - start:.1f} s", flush=True)
        local_note = (f"Flax `local` back end ({Path(str(generator.model_dir)).name}, {generator.get('dtype')}), "
                      f"one call per episode")
        result = compare(batches, local, served, settings=settings, user_speaker=user_speaker_of(config),
                         warmup=not args.no_warmup, labels=("local", "served"),
                         progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    table = markdown(result, local_note=local_note, served_note=served_note, machine=machine,
                     load_start=load_start, load_end=load_average())
    command = " ".join(["python scripts/benchmark_served_generator.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"\nCommand: `{command}`\n\n{table}")
    if args.json is not None:
        args.json.write_text(json.dumps({"local": dataclasses.asdict(result.local),
                                         "served": dataclasses.asdict(result.served),
                                         "local_warmup_s": result.local_warmup_s, "targets": result.targets},
                                        indent=1))
        print(f"\nreplies: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
