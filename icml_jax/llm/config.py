"""The run config's `llm` block, typed: the back end of each role (generator, judge, synthesizer).
`LLMConfig.from_config` is the one place that reads the ml_collections block; every reader asks it for a role's
block, options, cache namespace or a new client.

Each role's block stays the plain mapping the config holds (`ConfigDict.to_dict()`, the switchable placeholders
included): the answer caches are keyed by `answer_namespace` of exactly that dict, and results.json records
`set_options` of it, so both read the same values as before the block was typed. `llm.registry` checks, resolves
and builds a block; nothing here builds or checks one before a caller asks (a tool that needs one role never fails
on another's)."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

import ml_collections

from icml_jax.llm.cache import answer_namespace
from icml_jax.llm.registry import check_backend, make_backend, remote_context_tokens, set_options
from icml_jax.llm.types import LLMBackend

GENERATOR = "generator"
JUDGE = "judge"
SYNTHESIZER = "synthesizer"
LLM_ROLES = (GENERATOR, JUDGE, SYNTHESIZER)  # the keys of `config.llm`


@dataclasses.dataclass(frozen=True)
class LLMConfig:
    """- `generator`: writes replies and memory notes (and the expert storylines without a synthesizer).
    - `judge`: rates the proxy value and the replies' quality.
    - `synthesizer`: writes the expert storylines; None: the generator does.
    Each is a back-end block (`kind` and that kind's options, read-only) or None: no back end, which validation
    refuses for a role the run's stages call."""

    generator: Mapping[str, Any] | None = None
    judge: Mapping[str, Any] | None = None
    synthesizer: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        """Refuse a role that is not a block, naming it; keep each block as a read-only copy."""
        for role in LLM_ROLES:
            block = getattr(self, role)
            if block is None:
                continue
            if hasattr(block, "to_dict"):  # a ConfigDict
                block = block.to_dict()
            if not isinstance(block, Mapping):
                raise ValueError(f"config.llm.{role} must be a back-end block (kind and its options) or None, "
                                 f"got {block!r}")
            object.__setattr__(self, role, types.MappingProxyType(dict(block)))

    @classmethod
    def from_config(cls, block: ml_collections.ConfigDict | Mapping[str, Any] | None) -> LLMConfig:
        """From the `llm` block (a ConfigDict, a mapping or None: no back ends); a role it leaves out is None, a
        key that is not a role is an error naming it."""
        values = dict(block.to_dict() if hasattr(block, "to_dict") else block or {})
        unknown = sorted(set(values) - set(LLM_ROLES))
        if unknown:
            raise ValueError(f"config.llm: unknown role(s) {unknown}; the roles are {list(LLM_ROLES)}")
        return cls(**values)

    def block(self, role: str) -> dict[str, Any]:
        """The role's block as a new plain dict, equal to `config.llm.<role>.to_dict()`; an error naming
        `config.llm.<role>` when the role is unknown or has no back end."""
        if role not in LLM_ROLES:
            raise ValueError(f"config.llm has no role {role!r}; the roles are {list(LLM_ROLES)}")
        block = getattr(self, role)
        if block is None:
            raise ValueError(f"config.llm.{role}: no back end configured")
        return dict(block)

    def configured(self) -> dict[str, Mapping[str, Any] | None]:
        """Every role and its block (None: not configured), in `LLM_ROLES` order."""
        return {role: getattr(self, role) for role in LLM_ROLES}

    def kind(self, role: str) -> str | None:
        """The role's `kind` as the block spells it (None when the block has none)."""
        return self.block(role).get("kind")

    def options(self, role: str) -> dict[str, Any]:
        """The role's block without the switchable knobs it holds as None (`registry.set_options`): what results
        record and the experiments compare."""
        return set_options(self.block(role))

    def namespace(self, role: str) -> dict[str, Any]:
        """The role's answer-cache namespace (`cache.answer_namespace` of its block): what keys its cached answers."""
        return answer_namespace(self.block(role))

    def check(self, role: str) -> dict[str, Any]:
        """The role's resolved options, checked without building anything; errors start with `config.llm.<role>`."""
        return check_backend(self.block(role), f"config.llm.{role}")

    def make_backend(self, role: str, **kwargs: Any) -> LLMBackend:
        """A new client of the role's back end (the caller closes it)."""
        return make_backend(self.block(role), **kwargs)

    def context_tokens(self, role: str) -> int | None:
        """The role's remote input window (its `context_tokens`, else its kind's default); None for a local kind."""
        return remote_context_tokens(self.block(role), f"config.llm.{role}")

    @property
    def synthesis_role(self) -> str:
        """The role that writes the expert data: `synthesizer` when set, else the generator."""
        return SYNTHESIZER if self.synthesizer is not None else GENERATOR

    @property
    def judge_is_generator(self) -> bool:
        """Whether the judge and the generator are one back end (then one client serves both roles)."""
        return set_options(self.judge) == set_options(self.generator)


__all__ = ["GENERATOR", "JUDGE", "LLMConfig", "LLM_ROLES", "SYNTHESIZER"]
