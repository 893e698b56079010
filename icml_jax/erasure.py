"""Erasure across a workdir: `python -m icml_jax.erasure --workdir=DIR --user=ID [--memory_id=M]`.

Removes a user's memories (or one memory) from everything a run keeps in its workdir: the chat's memory store
(rows, history, sessions; SQLite secure_delete, WAL truncated), every online checkpoint (the user's memory export
and pending-reward entries are cut out of each checkpoint's JSON state, rewritten in place so the run still
resumes), the evaluation's per-target rows, and the answer caches (dropped: their requests and answers may quote
the user, and a rerun only asks again). Checkpoints that failed to restore (`checkpoints.unrestorable/`) are
dropped. The report counts what went where (store rows, checkpoint memory records and pending rewards, evaluation
rows, caches). A memory id that matches nothing (unknown, or another user's) changes nothing and exits with status
1; a user with no record exits 1 too, after dropping the caches (they cannot be searched); an empty `--memory_id`
is an error (status 2), never a whole-user erasure. The trained weights (`policy/`, `warmup/`, checkpoint arrays) cannot be made to forget what they
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

from icml_jax.memory.store import MemoryStore
from icml_jax.textcheck import check_text

CACHE_FILES = ("cache.sqlite", "eval_cache.sqlite", "requests.sqlite")  # answer caches: dropped
TARGETS_FILE = "targets.jsonl"
CHAT_DB = Path("chat") / "memory.sqlite"


@dataclasses.dataclass
class ErasureReport:
    """What an erasure removed where (store rows, checkpoint entries, evaluation rows, caches), the files it
    rewrote or dropped, and the places it cannot reach."""

    user_id: str
    fragment_id: str | None
    rewritten: list[str] = dataclasses.field(default_factory=list)
    dropped: list[str] = dataclasses.field(default_factory=list)
    memories_removed: int = 0  # memory rows deleted from the chat's (and the other given) SQLite stores
    sessions_removed: int = 0  # session records of the user deleted from those stores (whole-user erasure)
    checkpoint_memories_removed: int = 0  # memory records cut out of checkpoints' memory exports (all checkpoints)
    pending_removed: int = 0  # pending-reward entries cut out of checkpoints
    checkpoints_rewritten: int = 0
    eval_rows_removed: int = 0  # evaluation rows of the user dropped (whole-user erasure)
    eval_rows_blanked: int = 0  # evaluation rows whose memory text was blanked (one-memory erasure)
    caches_dropped: int = 0  # answer caches deleted (they may quote the user; a rerun asks again)
    unrestorable_dropped: int = 0  # `checkpoints.unrestorable/` folders deleted (not parsed)
    searched: list[str] = dataclasses.field(default_factory=list)  # where it looked (for a report of no match)
    not_reached: list[str] = dataclasses.field(default_factory=list)

    @property
    def found(self) -> bool:
        """Whether any record of the user (or of the memory) was found and removed."""
        return bool(self.memories_removed or self.sessions_removed or self.checkpoint_memories_removed
                    or self.pending_removed or self.eval_rows_removed or self.eval_rows_blanked)

    def _what(self) -> str:
        return f"memory {self.fragment_id} of {self.user_id!r}" if self.fragment_id else repr(self.user_id)

    def summary(self) -> str:
        """A few lines for the command line: the counts per place, the files, what it could not reach."""
        if not self.found:
            where = ", ".join(self.searched) or "the workdir"
            lines = [f"found no record of {self._what()} in {where}: nothing was changed" if not self.dropped else
                     f"found no record of {self._what()} in {where}; {self.caches_dropped} answer cache(s) and "
                     f"{self.unrestorable_dropped} unrestorable checkpoint folder(s), which cannot be searched, were "
                     "dropped all the same"]
        else:
            what = f"memory {self.fragment_id} of" if self.fragment_id else "everything about"
            lines = [f"erased {what} {self.user_id!r}: memory stores {self.memories_removed} memory row(s), "
                     f"{self.sessions_removed} session record(s); checkpoints {self.checkpoint_memories_removed} "
                     f"memory record(s), {self.pending_removed} pending reward(s) in {self.checkpoints_rewritten} "
                     f"file(s); evaluation {self.eval_rows_removed} row(s) removed, {self.eval_rows_blanked} blanked; "
                     f"dropped {self.caches_dropped} answer cache(s), {self.unrestorable_dropped} unrestorable "
                     f"checkpoint folder(s)"]
        lines += [f"  rewritten: {p}" for p in self.rewritten] + [f"  dropped: {p}" for p in self.dropped]
        lines += [f"  not reached: {p}" for p in self.not_reached if self.found or self.dropped]
        return "\n".join(lines)


def forget_user(workdir: str | os.PathLike[str], user_id: str, *,
                memory_dbs: Sequence[str | os.PathLike[str]] = ()) -> ErasureReport:
    """Erase everything about `user_id` in `workdir` (and in `memory_dbs`, other stores the chat used). The answer
    caches and unrestorable checkpoints are dropped even when no record of the user is found (they cannot be
    searched); `report.found` says whether one was."""
    return _erase(Path(workdir), user_id, None, memory_dbs)


def forget(workdir: str | os.PathLike[str], user_id: str, fragment_id: str, *,
           memory_dbs: Sequence[str | os.PathLike[str]] = ()) -> ErasureReport:
    """Erase one memory of `user_id` (its text, history and pending reward) everywhere in `workdir`. When no
    place holds it (an unknown id, or another user's), nothing at all is changed and `report.found` is False."""
    if not isinstance(fragment_id, str) or not fragment_id:
        raise ValueError(f"forget: fragment_id must name a memory (e.g. from the chat's /memories), got "
                         f"{fragment_id!r}")
    return _erase(Path(workdir), user_id, fragment_id, memory_dbs)


def _erase(root: Path, user_id: str, fragment_id: str | None,
           memory_dbs: Sequence[str | os.PathLike[str]]) -> ErasureReport:
    if not isinstance(user_id, str) or not user_id:
        raise ValueError(f"erasure: user_id must be a non-empty string, got {user_id!r}")
    check_text(user_id, "erasure", "user_id")
    if fragment_id is not None:
        check_text(fragment_id, "erasure", "memory_id")
    root = root.expanduser().absolute()
    if not root.is_dir():
        raise FileNotFoundError(f"erasure: {root} is not a directory (the workdir of a run)")
    report = ErasureReport(user_id, fragment_id)
    stores = [db for db in [root / CHAT_DB, *(Path(p).expanduser() for p in memory_dbs)] if db.is_file()]
    report.searched.append(f"{len(stores)} memory store(s)")
    for db in stores:
        with MemoryStore(db) as store:
            sessions = 0 if fragment_id else store.session_count(user_id)
            removed = int(store.delete(user_id, fragment_id)) if fragment_id else store.delete_user(user_id)
        report.memories_removed += removed
        report.sessions_removed += sessions
        if removed or sessions:
            report.rewritten.append(str(db))
    checkpoints = root / "checkpoints"
    state_files = sorted(checkpoints.glob("*/state/metadata")) if checkpoints.is_dir() else []
    report.searched.append(f"{len(state_files)} checkpoint(s)")
    for state_file in state_files:
        if _scrub_checkpoint(state_file, user_id, fragment_id, report):
            report.rewritten.append(str(state_file))
            report.checkpoints_rewritten += 1
    entries = sorted(root.rglob("*"))  # one walk of the tree for the rest
    targets = [p for p in entries if p.name == TARGETS_FILE and p.is_file()]
    report.searched.append(f"{len(targets)} evaluation file(s)")
    for path in targets:
        if _scrub_targets(path, user_id, fragment_id, report):
            report.rewritten.append(str(path))
    asides = [p for p in entries if p.name == "checkpoints.unrestorable" and p.is_dir()]
    caches = [p for p in entries if p.name in CACHE_FILES and p.is_file()
              and not any(a in p.parents for a in asides)]
    if fragment_id is None or report.found:  # one memory that is nowhere: nothing is changed at all
        for aside in asides:
            shutil.rmtree(aside)  # damaged checkpoints: not parsed, dropped
            report.dropped.append(str(aside))
            report.unrestorable_dropped += 1
        for path in caches:
            for part in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                part.unlink(missing_ok=True)
            report.dropped.append(str(path))
            report.caches_dropped += 1
    else:
        report.not_reached += [f"{p}: not parsed, kept (nothing matched)" for p in asides]
    report.not_reached.append(f"trained weights ({root / 'policy'}, {root / 'warmup'}, checkpoint arrays): a "
                              "policy cannot be made to forget what it learned from a user")
    if (root / "synthesis" / "manifest.json").is_file():
        report.not_reached.append(f"{root / 'synthesis'}: expert storylines seeded from real users' first "
                                  "sessions (synthesis.seed_source=data) are not edited; delete the folder and "
                                  "rerun the synthesis to rebuild them without this user")
    return report


def _scrub_checkpoint(path: Path, user_id: str, fragment_id: str | None, report: ErasureReport) -> bool:
    """Cuts the user's memories (or one) and pending-reward entries out of one checkpoint's JSON state, counting
    them in `report`."""
    state = json.loads(path.read_text(encoding="utf-8"))
    changed = False
    memory = state.get("memory") or {}
    if user_id in memory:
        if fragment_id is None:
            report.checkpoint_memories_removed += sum(1 for line in memory[user_id].splitlines() if line.strip())
            del memory[user_id]
            changed = True
        else:  # through a store, so the export stays valid (history and supersede marks included)
            with MemoryStore() as store:
                store.import_jsonl(user_id, io.StringIO(memory[user_id]))
                if store.delete(user_id, fragment_id):
                    out = io.StringIO()
                    store.export_jsonl(user_id, out)
                    memory[user_id] = out.getvalue()
                    report.checkpoint_memories_removed += 1
                    changed = True
    buffer = state.get("buffer") or {}
    entries = buffer.get("entries") or []
    kept = [e for e in entries if not (e.get("user_id") == user_id
                                       and (fragment_id is None or e.get("fragment_id") == fragment_id))]
    if len(kept) != len(entries):
        report.pending_removed += len(entries) - len(kept)
        buffer["entries"] = kept
        changed = True
    if changed:
        _write_atomic(path, json.dumps(state))
    return changed


def _scrub_targets(path: Path, user_id: str, fragment_id: str | None, report: ErasureReport) -> bool:
    """Drops the user's evaluation rows (the episode is the user), or blanks one memory's text in them, counting
    them in `report`."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[str] = []
    changed = False
    for line in lines:
        if not line.strip():
            continue
        row: dict[str, Any] = json.loads(line)
        if row.get("episode_id") == user_id:
            if fragment_id is None:
                report.eval_rows_removed += 1
                changed = True
                continue
            if row.get("memory_id") == fragment_id:
                row["memory"] = None
                line = json.dumps(row, ensure_ascii=False)
                report.eval_rows_blanked += 1
                changed = True
        out.append(line)
    if not changed:
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
    """`--workdir`, `--user`, optional `--memory_id` and `--memory_db` (repeatable); prints the report. Status 0:
    erased; 1: no record of the user (or of the memory) found; 2: a usage error (an empty --memory_id, no workdir),
    nothing removed."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m icml_jax.erasure", description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--memory_id", default=None, help="erase one memory instead of the whole user")
    parser.add_argument("--memory_db", action="append", default=[], help="another chat store to erase from")
    args = parser.parse_args(argv)
    try:
        report = (forget(args.workdir, args.user, args.memory_id, memory_dbs=args.memory_db)
                  if args.memory_id is not None  # given, even empty: never falls through to the whole user
                  else forget_user(args.workdir, args.user, memory_dbs=args.memory_db))
    except (OSError, ValueError) as exc:
        print(f"erasure error: {exc}", file=sys.stderr)
        return 2
    print(report.summary(), file=sys.stdout if report.found else sys.stderr)
    return 0 if report.found else 1


if __name__ == "__main__":
    sys.exit(main())
