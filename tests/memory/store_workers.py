"""Process bodies for the multi-process store and chat tests (spawned: importable, light, no JAX).

Each worker waits on a shared barrier so that all of them open the database and write at the same moment, and
reports (name, result) or (name, "error: ...") on a queue instead of raising in the child.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import time
import traceback
from typing import Any

from icml_jax.memory import MemoryStore, NewFragment

CHAT_USER = "alice"


def _report(queue: Any, name: str, body: Any) -> None:
    try:
        queue.put((name, body()))
    except BaseException:  # the parent asserts on it; a child's traceback would otherwise be lost
        queue.put((name, "error: " + traceback.format_exc()))


def append_rows(path: str, writer: int, rows: int, barrier: Any, queue: Any) -> None:
    """Open the (maybe not yet existing) store with everyone else, then append `rows` rows, 1-2 per transaction."""

    def body() -> int:
        barrier.wait()
        with MemoryStore(path, timeout_s=20) as store:
            user, episode = f"user{writer % 2}", f"writer{writer}"  # two writers per user: one user index, shared
            turn = 0
            while turn < rows:
                batch = [NewFragment(episode, 0, t, f"w{writer} t{t}", f"w{writer} t{t}", "v")
                         for t in range(turn, min(turn + 1 + turn % 2, rows))]
                store.append_many(user, batch)
                store.count(user)  # a read between writes, as the chat does
                turn += len(batch)
        return rows

    _report(queue, f"writer{writer}", body)


def open_sessions(path: str, opener: int, sessions: int, barrier: Any, queue: Any) -> None:
    """Open the store with everyone else, then allocate `sessions` chat sessions of CHAT_USER."""

    def body() -> list[int]:
        barrier.wait()
        with MemoryStore(path, timeout_s=20) as store:
            return [store.open_session(CHAT_USER, "chat") for _ in range(sessions)]

    _report(queue, f"opener{opener}", body)


class _Receipt:
    """What the stub agent's step returns besides the reply (the chat keeps it for /why)."""

    def __init__(self, fragment: Any) -> None:
        self.fragment = fragment

    def summary(self) -> str:
        return f"saved this turn as {self.fragment.fragment_id}"


class SavingAgent:
    """A stand-in MemoryAgent that saves every turn verbatim and echoes it."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def step(self, user_id: str, text: str, *, history: Any, episode_id: str, session: int,
             turn: int) -> tuple[str, _Receipt]:
        fragment = self.store.append(user_id, NewFragment(episode_id, session, turn, text, text, "stub"))
        return f"noted: {text}", _Receipt(fragment)


class StubChatModel:
    """The parts of a ChatModel a ChatSession uses: `agent(store)`, `speakers`, `note`, `checkpoint`."""

    speakers = ("user", "assistant")
    note = ""
    checkpoint = "<stub policy>"

    def agent(self, store: MemoryStore) -> SavingAgent:
        return SavingAgent(store)

    def close(self) -> None:
        pass


def chat_turns(path: str, process: int, turns: int, barrier: Any, queue: Any) -> None:
    """One `python -m icml_jax.chat` of CHAT_USER: a session on the shared store, then `turns` turns.

    The barrier sits after the sessions start and before any turn is saved: the moment two chats of one user
    both begin.
    """
    from icml_jax import chat

    def body() -> int:
        with MemoryStore(path, timeout_s=20) as store:
            session = chat.ChatSession(StubChatModel(), store, CHAT_USER)  # type: ignore[arg-type]
            barrier.wait()
            for n in range(turns):
                session.send(f"process {process} says {n}")
            return session.session

    _report(queue, f"chat{process}", body)


def run_processes(targets: list[tuple[Any, tuple[Any, ...]]], timeout_s: float = 60) -> dict[str, Any]:
    """Run every (function, args) in its own spawned process behind one barrier; their reports by name.

    Fails naming the processes that raised (with their tracebacks) or never reported (with their exit codes).
    """
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(len(targets), timeout=timeout_s / 2), ctx.Queue()
    procs = [ctx.Process(target=fn, args=(*args, barrier, results)) for fn, args in targets]
    for p in procs:
        p.start()
    reports: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(reports) < len(procs) and time.monotonic() < deadline:
            try:
                name, report = results.get(timeout=0.5)
                reports[name] = report
            except queue_module.Empty:
                if not any(p.is_alive() for p in procs):  # all gone: take what is still in the pipe, then stop
                    deadline = min(deadline, time.monotonic() + 1.0)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert len(reports) == len(procs), (
        f"only {sorted(reports)} reported; exit codes {[p.exitcode for p in procs]}")
    errors = {name: r for name, r in reports.items() if isinstance(r, str) and r.startswith("error: ")}
    assert not errors, "\n".join(f"{name}: {r}" for name, r in errors.items())
    return reports
