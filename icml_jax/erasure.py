"""Erasure across a workdir: `python -m icml_jax.erasure --workdir=DIR --user=ID [--memory_id=M]`.

Removes a user's memories (or one memory) from everything a run keeps in its workdir: the chat's memory store
(rows, history, sessions; SQLite secure_delete, WAL truncated), every online checkpoint (the user's memory export
and pending-reward entries are cut out of each checkpoint's JSON state, rewritten in place so the run still
resumes), the evaluation's per-target rows, and the answer caches (dropped: their requests and answers may quote
the user, and a rerun only asks again). Checkpoints that failed to restore (`checkpoints.unrestorable/`) are
dropped. The trained weights (`policy/`, `warmup/`, checkpoint arrays) cannot be made to forget what they
learned from a user: erasure reaches the memories, never the adapters. Run it on a stopped workdir.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CACHE_FILES = ("cache.sqlite", "eval_cache.sqlite", "requests.sqlite")  # answer caches: dropped
TARGETS_FILE = "targets.jsonl"
CHAT_DB = Path("chat") / "memory.sqlite"


@dataclasses.dataclass
class ErasureReport:
    """What an erasure changed: files rewritten, files dropped, memories removed, and places it cannot reach."""

    user_id: str
    fragment_id: str | None
    rewritten: list[str] = dataclasses.field(default_factory=list)
    dropped: list[str] = dataclasses.field(default_factory=list)
    memories_removed: int = 0
    not_reached: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        """A few lines for the command line."""
        what = f"memory {self.fragment_id} of" if self.fragment_id else "everything about"
        lines = [f"erased {what} {self.user_id!r}: {self.memories_removed} stored memory record(s) removed, "
                 f"{len(self.rewritten)} file(s) rewritten, {len(self.dropped)} dropped"]
        lines += [f"  rewritten: {p}" for p in self.rewritten] + [f"  dropped: {p}" for p in self.dropped]
        lines += [f"  not reached: {p}" for p in self.not_reached]
        return "\n".join(lines)


def forget_user(workdir: str | os.PathLike[str], user_id: str, *,
                memory_dbs: Sequence[str | os.PathLike[str]] = ()) -> ErasureReport:
    """Erase everything about `user_id` in `workdir` (and in `memory_dbs`, other stores the chat used)."""
    return _erase(Path(workdir), user_id, None, memory_dbs)


def forget(workdir: str | os.PathLike[str], user_id: str, fragment_id: str, *,
           memory_dbs: Sequence[str | os.PathLike[str]] = ()) -> ErasureReport:
    """Erase one memory of `user_id` (its text, history and pending reward) everywhere in `workdir`."""
    if not fragment_id:
        raise ValueError("forget: fragment_id must name a memory (e.g. from the chat's /memories)")
    return _erase(Path(workdir), user_id, fragment_id, memory_dbs)


def _erase(root: Path, user_id: str, fragment_id: str | None,
           memory_dbs: Sequence[str | os.PathLike[str]]) -> ErasureReport:
    from icml_jax.memory.store import MemoryStore

    if not isinstance(user_id, str) or not user_id:
        raise ValueError(f"erasure: user_id must be a non-empty string, got {user_id!r}")
    root = root.expanduser().absolute()
    if not root.is_dir():
        raise FileNotFoundError(f"erasure: {root} is not a directory (the workdir of a run)")
    report = ErasureReport(user_id, fragment_id)
    for db in [root / CHAT_DB, *(Path(p).expanduser() for p in memory_dbs)]:
        if db.is_file():
            with MemoryStore(db) as store:
                removed = (int(store.delete(user_id, fragment_id)) if fragment_id
                           else store.delete_user(user_id))
            report.memories_removed += removed
            report.rewritten.append(str(db))
    checkpoints = root / "checkpoints"
    for state_file in sorted(checkpoints.glob("*/state/metadata")) if checkpoints.is_dir() else []:
        if _scrub_checkpoint(state_file, user_id, fragment_id, report):
            report.rewritten.append(str(state_file))
    entries = sorted(root.rglob("*"))  # one walk of the tree for the rest
    for aside in (p for p in entries if p.name == "checkpoints.unrestorable" and p.is_dir()):
        shutil.rmtree(aside)  # damaged checkpoints: not parsed, dropped
        report.dropped.append(str(aside))
    for path in (p for p in entries if p.is_file()):  # (what was just dropped is no longer a file)
        if path.name == TARGETS_FILE and _scrub_targets(path, user_id, fragment_id):
            report.rewritten.append(str(path))
        elif path.name in CACHE_FILES:
            for part in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                part.unlink(missing_ok=True)
            report.dropped.append(str(path))
    report.not_reached.append(f"trained weights ({root / 'policy'}, {root / 'warmup'}, checkpoint arrays): a "
                              "policy cannot be made to forget what it learned from a user")
    if (root / "synthesis" / "manifest.json").is_file():
        report.not_reached.append(f"{root / 'synthesis'}: expert storylines seeded from real users' first "
                                  "sessions (synthesis.seed_source=data) are not edited; delete the folder and "
                                  "rerun the synthesis to rebuild them without this user")
    return report


def _scrub_checkpoint(path: Path, user_id: str, fragment_id: str | None, report: ErasureReport) -> bool:
    """Cuts the user's memories (or one) and pending-reward entries out of one checkpoint's JSON state."""
    from icml_jax.memory.store import MemoryStore

    state = json.loads(path.read_text(encoding="utf-8"))
    changed = False
    memory = state.get("memory") or {}
    if user_id in memory:
        if fragment_id is None:
            del memory[user_id]
            changed = True
        else:  # through a store, so the export stays valid (history and supersede marks included)
            with MemoryStore() as store:
                store.import_jsonl(user_id, io.StringIO(memory[user_id]))
                if store.delete(user_id, fragment_id):
                    out = io.StringIO()
                    store.export_jsonl(user_id, out)
                    memory[user_id] = out.getvalue()
                    changed = True
    buffer = state.get("buffer") or {}
    entries = buffer.get("entries") or []
    kept = [e for e in entries if not (e.get("user_id") == user_id
                                       and (fragment_id is None or e.get("fragment_id") == fragment_id))]
    if len(kept) != len(entries):
        buffer["entries"] = kept
        changed = True
    if changed:
        _write_atomic(path, json.dumps(state))
    return changed


def _scrub_targets(path: Path, user_id: str, fragment_id: str | None) -> bool:
    """Drops the user's evaluation rows (the episode is the user), or blanks one memory's text in them."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[str] = []
    for line in lines:
        if not line.strip():
            continue
        row: dict[str, Any] = json.loads(line)
        if row.get("episode_id") == user_id:
            if fragment_id is None:
                continue
            if row.get("memory_id") == fragment_id:
                row["memory"] = None
                line = json.dumps(row, ensure_ascii=False)
        out.append(line)
    if out == [x for x in lines if x.strip()]:
        return False
    _write_atomic(path, "".join(x + "\n" for x in out))
    return True


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".erasure-tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    """`--workdir`, `--user`, optional `--memory_id` and `--memory_db` (repeatable); prints the report."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m icml_jax.erasure", description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--memory_id", default=None, help="erase one memory instead of the whole user")
    parser.add_argument("--memory_db", action="append", default=[], help="another chat store to erase from")
    args = parser.parse_args(argv)
    try:
        report = (forget(args.workdir, args.user, args.memory_id, memory_dbs=args.memory_db) if args.memory_id
                  else forget_user(args.workdir, args.user, memory_dbs=args.memory_db))
    except (OSError, ValueError) as exc:
        print(f"erasure error: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
