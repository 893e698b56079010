"""An on-disk cache of back-end answers, so a job that crashes or runs again never asks a back end the same thing
twice: the evaluation (`<workdir>/eval/cache.sqlite`) and the synthesis (`<synthesis dir>/requests.sqlite`).

`CachedBackend` wraps any `LLMBackend`. A request's key is the SHA-256 of everything that determines its answer:
the caller's `namespace` (the back end's config block, e.g. model and sampling settings; never an API key) and
every field of the request, metadata included (the offline back end answers from it). Answers live in one
SQLite file; misses go to the back end in chunks, and each chunk is committed as soon as it is answered, so a
crash loses at most the chunk in flight. Failures are not cached: a rerun asks them again.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from icml_jax.llm.generation import generate_each
from icml_jax.llm.registry import is_remote, kind_default, switchable_knobs
from icml_jax.llm.types import (
    BackendError,
    LLMBackend,
    LLMRequest,
    LLMResponse,
    LoglikRequest,
    LoglikResponse,
    ScoreRequest,
    ScoreResponse,
    TokenUsage,
    judge_mode_of,
)

_SCHEMA = "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, namespace TEXT NOT NULL, response TEXT NOT NULL)"
Outcome = LLMResponse | BackendError


# Back-end knobs that change how a request travels, not what it answers: left out of a cache namespace, so a
# rerun with other timeouts, retries or endpoint still replays the answers.
TRANSPORT_KNOBS = frozenset({"base_url", "timeout_s", "timeout_floor_s", "timeout_tokens_per_s", "max_concurrency",
                             "max_attempts", "initial_backoff_s", "max_backoff_s", "backoff_multiplier", "jitter",
                             "api_key_env"})


def answer_namespace(block: Mapping[str, Any]) -> dict[str, Any]:
    """A back-end config block without its transport knobs: what identifies the answers it gives. A
    structured_output left None is the kind's own mode, named as such, so a block that spells the default out
    and one that leaves it to the kind share their answers; the remote knobs a local or offline block holds as
    None (a block switchable on the command line) name nothing."""
    kind, knobs = block.get("kind"), switchable_knobs()
    namespace = {k: v for k, v in block.items() if k not in TRANSPORT_KNOBS
                 and (is_remote(kind) or v is not None or k not in knobs)}  # a local block's unused placeholders
    if "structured_output" in namespace and namespace["structured_output"] is None:
        namespace["structured_output"] = kind_default(namespace.get("kind"), "structured_output")
    return namespace


def request_key(namespace: str, request: LLMRequest) -> str:
    """The cache key of `request` under `namespace` (hex SHA-256 of a canonical JSON of both)."""
    fields = dataclasses.asdict(request)
    try:
        blob = json.dumps({"namespace": namespace, "request": fields}, sort_keys=True, ensure_ascii=False,
                          allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"response cache: request (task {request.task!r}) has a field that is not JSON: {exc}") \
            from None
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ResponseCache:
    """Key -> LLMResponse in a SQLite file; safe to share between threads of one process."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_SCHEMA)
        self._db.commit()

    def get_many(self, keys: Sequence[str]) -> dict[str, LLMResponse]:
        """The cached responses among `keys`."""
        out: dict[str, LLMResponse] = {}
        with self._lock:
            for start in range(0, len(keys), 500):
                chunk = list(keys[start:start + 500])
                rows = self._db.execute(f"SELECT key, response FROM answers WHERE key IN ({','.join('?' * len(chunk))})",
                                        chunk).fetchall()
                for key, blob in rows:
                    out[key] = LLMResponse(**json.loads(blob))
        return out

    def put_many(self, namespace: str, items: Mapping[str, LLMResponse]) -> None:
        """Stores `items` in one transaction (committed before returning)."""
        rows = [(k, namespace, json.dumps(dataclasses.asdict(r), ensure_ascii=False)) for k, r in items.items()]
        with self._lock, self._db:
            self._db.executemany("INSERT OR REPLACE INTO answers VALUES (?, ?, ?)", rows)

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM answers").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


class CachedBackend:
    """`backend` behind a `ResponseCache`: cached answers come from disk, the rest from the back end, `chunk`
    requests per call, each chunk stored before the next is sent. `per_request=True` (remote back ends, e.g.
    Gemini) sends every request on its own from up to `in_flight` threads and stores each answer as it arrives,
    so a failure loses no answer that already came back (batching is for local models). `misses` counts the
    requests sent, `hits` the others (hits + misses = requests answered or failed), `failures` the requests
    that failed for good (through `generate_each`; `generate` raises the first)."""

    def __init__(self, backend: LLMBackend, cache: ResponseCache, namespace: str | Mapping[str, Any], *,
                 chunk: int = 64, per_request: bool = False, in_flight: int = 16) -> None:
        if chunk < 1 or in_flight < 1:
            raise ValueError(f"CachedBackend: chunk and in_flight must be >= 1, got {chunk} and {in_flight}")
        self.backend, self.cache, self.chunk = backend, cache, chunk
        self.per_request, self.in_flight = per_request, in_flight
        self.namespace = namespace if isinstance(namespace, str) else json.dumps(namespace, sort_keys=True)
        self.name = backend.name
        self.hits = self.misses = self.failures = 0
        # what the answers cost, cached or not: the job's own LLM calls and tokens, rerun or not
        self.answered = {"calls": 0, "prompt_tokens": 0, "output_tokens": 0}
        self._count_lock = threading.Lock()

    def _lookup(self, requests: Sequence[LLMRequest]) -> tuple[list[str], dict[str, Outcome],
                                                                 list[tuple[str, LLMRequest]]]:
        """(keys, cached answers, distinct (key, request) pairs to send), counting hits and misses."""
        keys = [request_key(self.namespace, r) for r in requests]
        found: dict[str, Outcome] = dict(self.cache.get_many(list(dict.fromkeys(keys))))
        todo = {k: r for k, r in zip(keys, requests, strict=True) if k not in found}
        with self._count_lock:
            self.hits += len(keys) - len(todo)  # every request not sent: cached, or a repeat within this call
            self.misses += len(todo)
        return keys, found, list(todo.items())

    def _handed_out(self, out: Sequence[Outcome]) -> None:
        """Counts what the answers handed out cost (cached ones too) and the failures."""
        with self._count_lock:
            for r in out:
                if isinstance(r, BackendError):
                    continue
                self.answered["calls"] += 1
                self.answered["prompt_tokens"] += r.prompt_tokens
                self.answered["output_tokens"] += r.output_tokens

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        """Answers in order; identical requests in one call are asked once. The first failure is raised (after
        storing every answer that came back in per-request mode)."""
        keys, found, pending = self._lookup(requests)
        if self.per_request:
            found.update(self._one_by_one(pending, stop_on_error=True))
            pending = []
        for start in range(0, len(pending), self.chunk):
            part = pending[start:start + self.chunk]
            answers = self.backend.generate([r for _, r in part])
            if len(answers) != len(part):
                raise RuntimeError(f"{self.backend.name} back end answered {len(answers)} of {len(part)} requests")
            new = {k: a for (k, _), a in zip(part, answers, strict=True)}
            self.cache.put_many(self.namespace, new)
            found.update(new)
        out = [found[k] for k in keys]
        self._handed_out(out)
        return out  # type: ignore[return-value]  # no failure gets this far

    def generate_each(self, requests: Sequence[LLMRequest]) -> list[Outcome]:
        """Every request's outcome in order (see `icml_jax.llm.generation.generate_each`): answers are stored as
        they arrive, a request that fails for good comes back as its BackendError (not stored, so a rerun asks
        it again) and stops nothing else."""
        keys, found, pending = self._lookup(requests)
        if self.per_request:
            found.update(self._one_by_one(pending, stop_on_error=False))
        else:
            for start in range(0, len(pending), self.chunk):
                part = pending[start:start + self.chunk]
                outcomes = dict(zip((k for k, _ in part), generate_each(self.backend, [r for _, r in part]),
                                    strict=True))
                self._store(outcomes)
                found.update(outcomes)
        out = [found[k] for k in keys]
        self._handed_out(out)
        return out

    def _store(self, outcomes: Mapping[str, Outcome]) -> None:
        """Stores the answers among `outcomes` (one transaction) and counts the failures."""
        answers = {k: a for k, a in outcomes.items() if not isinstance(a, BackendError)}
        if answers:
            self.cache.put_many(self.namespace, answers)
        with self._count_lock:
            self.failures += len(outcomes) - len(answers)

    def _one_by_one(self, pending: list[tuple[str, LLMRequest]], *, stop_on_error: bool) -> dict[str, Outcome]:
        """Each request on its own, `in_flight` at a time, each answer stored on arrival. `stop_on_error`: the
        first failure is raised after the requests already running have finished (and been stored), and no
        request is started after it; else failures come back in place."""
        def one(key: str, request: LLMRequest) -> Outcome:
            if stop_on_error:
                (answer,) = self.backend.generate([request])
            else:
                (answer,) = generate_each(self.backend, [request])
            self._store({key: answer})
            return answer

        out: dict[str, Outcome] = {}
        first_error: BaseException | None = None
        with cf.ThreadPoolExecutor(max_workers=self.in_flight, thread_name_prefix="cached") as pool:
            futures = {pool.submit(one, k, r): k for k, r in pending}
            for fut in cf.as_completed(futures):
                if fut.cancelled():
                    continue
                if fut.exception() is not None:
                    if first_error is None:
                        first_error = fut.exception()
                        for other in futures:  # start nothing new once one request failed for good
                            other.cancel()
                    continue
                out[futures[fut]] = fut.result()
        if first_error is not None:
            raise first_error
        return out

    @property
    def judge_mode(self) -> str:
        """The wrapped back end's judge mode, so a cached local judge still judges by score tokens."""
        return judge_mode_of(self.backend)

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResponse]:
        """Score-token verdicts straight from the wrapped back end: not cached (one deterministic forward pass
        each, cheap next to the generation this cache exists for)."""
        if not callable(getattr(self.backend, "score", None)):
            raise TypeError(f"CachedBackend: the wrapped {self.backend.name} back end cannot score")
        return self.backend.score(requests)

    def loglik(self, requests: Sequence[LoglikRequest]) -> list[LoglikResponse]:
        """Teacher-forced likelihoods straight from the wrapped back end (not cached: one deterministic forward
        pass each)."""
        if not callable(getattr(self.backend, "loglik", None)):
            raise TypeError(f"CachedBackend: the wrapped {self.backend.name} back end cannot score a continuation")
        return self.backend.loglik(requests)

    @property
    def usage(self) -> TokenUsage:
        """What the wrapped back end spent (cache hits cost nothing)."""
        return self.backend.usage

    def close(self) -> None:
        """Closes the wrapped back end; the cache is closed by its owner."""
        self.backend.close()


__all__ = ["CachedBackend", "ResponseCache", "request_key"]
