"""A trained agent loaded back from a run's workdir: the run's config (`<workdir>/config.json`), its policy checkpoint
(`<workdir>/policy`, else the warm-up checkpoint `<workdir>/warmup`), the policies and tokenizer rebuilt and
restored, and the reply back end (`load_model` -> `ChatModel`). The chat (`icml_jax.chat`), the evaluation
(`icml_jax.evaluate`) and the Memory API (`icml_jax.memory_api`) load their agent here; what cannot be loaded is
one `ChatError` that says what is missing and what to run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import ml_collections

from icml_jax.agents.agent import MemoryAgent
from icml_jax.checkpoint import META_FILE, load_warmup
from icml_jax.llm.types import MissingAPIKeyError
from icml_jax.run.builders import build_models
from icml_jax.run.runspec import RunSpec
from icml_jax.run.workdir import CONFIG_FILE, POLICY_DIR, WARMUP_DIR
from icml_jax.textcheck import TextLimits


class ChatError(RuntimeError):
    """A trained agent cannot be loaded, so the chat (or the evaluation) cannot start; the message says what is
    missing and what to run."""


def _train_command(workdir: Path) -> str:
    return f"python -m icml_jax.main --config=configs/demo.py --workdir={workdir}"


def _run_hint(workdir: Path) -> str:
    return f"train an agent first: {_train_command(workdir)}"


def load_run_config(workdir: Path) -> ml_collections.ConfigDict:
    """The run's config as the main job wrote it (`<workdir>/config.json`; lists stand where tuples were)."""
    path = workdir / CONFIG_FILE
    if not path.is_file():
        raise ChatError(f"{path} does not exist: {workdir} holds no finished run; {_run_hint(workdir)}")
    return ml_collections.ConfigDict(json.loads(path.read_text(encoding="utf-8")))


# What restoring a damaged checkpoint raises (truncated, garbage, missing or wrongly shaped files): OSError for
# missing files; ValueError for bad JSON, bad UTF-8 and TensorStore's DATA_LOSS / OUT_OF_RANGE / NOT_FOUND on
# array files; KeyError, TypeError and AttributeError from the metadata readers (ours and Orbax's) on JSON of the
# wrong shape. The message keeps the type, so a programming error caught here still shows what it was.
RESTORE_ERRORS: tuple[type[Exception], ...] = (OSError, ValueError, LookupError, TypeError, AttributeError)


def restore_failure(workdir: Path, checkpoint: Path, exc: Exception) -> str:
    """One line for a checkpoint that cannot be restored: which, why (first line of the error) and what to do."""
    first = (str(exc).strip().splitlines() or [""])[0]
    reason = f"{type(exc).__name__}: {first[:300]}{'...' if len(first) > 300 else ''}"
    warm = workdir / WARMUP_DIR
    fallback = (f", or move {checkpoint} away to chat with the warm-up checkpoint {warm}"
                if checkpoint != warm and warm.is_dir() else "")
    return (f"cannot restore the policy checkpoint {checkpoint} ({reason}); it is damaged or incomplete: restore it "
            f"from a backup or train again ({_train_command(workdir)}){fallback}")


def find_checkpoint(workdir: Path) -> tuple[Path, str]:
    """(checkpoint dir, note): the final policy, else the warm-up checkpoint with a note saying so."""
    policy, warm = workdir / POLICY_DIR, workdir / WARMUP_DIR
    if (policy / META_FILE).is_file():
        return policy, ""
    if (warm / META_FILE).is_file():
        return warm, f"note: {policy} does not exist; using the warm-up checkpoint {warm} (no online learning)"
    raise ChatError(f"no trained policy in {workdir}: neither {policy} nor a warm-up checkpoint {warm} exists; "
                    f"{_run_hint(workdir)}")


@dataclasses.dataclass
class ChatModel:
    """A trained agent's parts, loaded once from a workdir and shared by the chat sessions built on it."""

    workdir: Path
    checkpoint: Path
    note: str  # empty, or why a fallback checkpoint is used
    policies: Any
    tokenizer: Any
    generator: Any  # LLMBackend: replies and memory notes
    agent_config: Any  # AgentConfig (greedy)
    speakers: tuple[str, str]  # (user, assistant) labels of the history the policies were trained on
    limits: TextLimits = dataclasses.field(default_factory=TextLimits)  # the run's config.limits
    policy_version: str = "0"  # the loaded policy's (its metadata's, else the checkpoint dir's name)

    def agent(self, store: Any) -> Any:
        """A MemoryAgent on `store` (greedy: deterministic for a given policy and memory)."""
        return MemoryAgent(self.policies, self.tokenizer, store, self.generator, config=self.agent_config,
                           policy_version=self.policy_version)

    def close(self) -> None:
        """Releases the back end (e.g. Gemini's connection pool)."""
        self.generator.close()


def load_model(workdir: str | Path) -> ChatModel:
    """Rebuilds the run's policies and tokenizer, restores the trained state and builds the reply back end."""
    workdir = Path(workdir).expanduser().absolute()
    config = load_run_config(workdir)
    spec = RunSpec.from_config(config)
    checkpoint, note = find_checkpoint(workdir)
    try:
        generator = spec.make_backend("generator")
    except MissingAPIKeyError as exc:  # the key is read from the environment only; never printed
        raise ChatError(f"config.llm.generator of {workdir} is a Gemini back end: {exc}") from None
    try:
        policies, tokenizer = build_models(config, workdir, spec)
    except (OSError, ValueError) as exc:
        generator.close()
        raise ChatError(f"cannot build the policies of {workdir}: {exc}") from None
    try:
        meta = load_warmup(checkpoint, policies)
    except RESTORE_ERRORS as exc:
        generator.close()
        raise ChatError(restore_failure(workdir, checkpoint, exc)) from exc
    policies.eval()  # adapter dropout off
    try:  # the data's speakers label the chat's turns
        world = spec.world
    except (TypeError, ValueError) as exc:
        generator.close()
        raise ChatError(f"config.data of {workdir}/{CONFIG_FILE}: {exc}") from None
    agent_config = dataclasses.replace(  # the chat's own rules: the learned policies always decide
        spec.agent, planner_rule="policy", trigger_rule="policy", greedy=True)
    speakers = (world.user_speaker, world.assistant_speaker)
    try:  # a run written before config.limits existed gets the defaults
        limits = spec.limits
    except (TypeError, ValueError) as exc:
        generator.close()
        raise ChatError(f"config.limits of {workdir}/{CONFIG_FILE}: {exc}") from None
    return ChatModel(workdir, checkpoint, note, policies, tokenizer, generator, agent_config, speakers, limits,
                     policy_version=str(meta.get("policy_version", checkpoint.name)))
