"""The typed `llm` block (icml_jax.llm.config.LLMConfig): built once from the config, every role's cache namespace,
options and context window exactly what the raw block gave before (the answer caches on disk and the results'
provenance are keyed by them)."""

from __future__ import annotations

import ml_collections
import pytest

from icml_jax.configlib import apply_overrides
from icml_jax.llm.cache import answer_namespace
from icml_jax.llm.config import LLM_ROLES, LLMConfig
from icml_jax.llm.offline import OfflineBackend
from icml_jax.llm.registry import check_backend, remote_context_tokens, set_options
from icml_jax.run.runspec import RunSpec
from tests.config_files import load_config

SERVED = {"kind": "openai", "base_url": "http://127.0.0.1:8000/v1", "model": "served", "api_key_env": ()}
CONFIGS = [(name, role, kind) for name in ("demo", "gc_smollm2", "base") for role in ("generator", "judge")
           for kind in (None, "openai")]


def _config(name: str, role: str, kind: str | None) -> ml_collections.ConfigDict:
    """configs/<name>.py, with `role` switched to a keyless OpenAI-compatible server as the command line does it
    (--config.llm.<role>.kind=openai --config.llm.<role>.base_url=... .model=... .api_key_env=()) when `kind`."""
    config = load_config(name)
    if kind:
        apply_overrides(config, {f"llm.{role}.{k}": v for k, v in SERVED.items()})
    return config


@pytest.mark.parametrize("name,role,kind", CONFIGS)
def test_every_role_keys_its_answers_and_provenance_as_the_raw_block_did(name, role, kind):
    config = _config(name, role, kind)
    llm = RunSpec.from_config(config).llm
    for r in LLM_ROLES:
        raw = config.llm[r]
        if raw is None:
            assert getattr(llm, r) is None
            continue
        assert llm.block(r) == raw.to_dict()
        assert llm.namespace(r) == answer_namespace(raw.to_dict())  # the cache key's namespace: unchanged
        assert llm.options(r) == set_options(raw)  # results.json's provenance: unchanged
        assert llm.check(r) == check_backend(raw, f"config.llm.{r}")
        assert llm.context_tokens(r) == remote_context_tokens(raw, f"config.llm.{r}")
        assert llm.kind(r) == raw.kind
    if kind:
        assert llm.kind(role) == "openai" and llm.namespace(role)["model"] == "served"
        assert "base_url" not in llm.namespace(role)  # a transport knob, as before


def test_the_spec_builds_the_block_once_and_the_roles_read_as_before():
    config = load_config("demo")
    spec = RunSpec.from_config(config)
    assert spec.llm is spec.llm
    assert spec.synthesis_role == "synthesizer" and spec.judge_is_generator
    assert spec.judge_is_generator == (set_options(config.llm.judge) == set_options(config.llm.generator))
    base = RunSpec.from_config(load_config("base"))
    assert base.llm.synthesizer is None and base.synthesis_role == "generator"
    assert base.generator_context_tokens == remote_context_tokens(base.config.llm.generator)
    backend = spec.make_backend("judge")
    try:
        assert isinstance(backend, OfflineBackend)
    finally:
        backend.close()


def test_the_blocks_are_read_only_copies():
    block = ml_collections.ConfigDict({"kind": "offline"})
    llm = LLMConfig.from_config({"generator": block, "judge": {"kind": "offline"}})
    block.kind = "gemini"
    assert llm.kind("generator") == "offline"
    with pytest.raises(TypeError):
        llm.generator["kind"] = "gemini"  # type: ignore[index]
    copy = llm.block("judge")
    copy["kind"] = "gemini"
    assert llm.kind("judge") == "offline"
    assert LLMConfig.from_config(None) == LLMConfig()


def test_errors_name_the_role():
    with pytest.raises(ValueError, match=r"config.llm: unknown role\(s\) \['judges'\]"):
        LLMConfig.from_config({"judges": {"kind": "offline"}})
    with pytest.raises(ValueError, match="config.llm.judge must be a back-end block"):
        LLMConfig(judge="offline")  # type: ignore[arg-type]
    llm = LLMConfig(generator={"kind": "offline"})
    with pytest.raises(ValueError, match="config.llm.synthesizer: no back end configured"):
        llm.make_backend("synthesizer")
    with pytest.raises(ValueError, match="config.llm has no role 'writer'"):
        llm.namespace("writer")
    with pytest.raises(ValueError, match=r"config.llm.judge: unknown LLM back end kind 'gpt'"):
        LLMConfig(judge={"kind": "gpt"}).check("judge")
