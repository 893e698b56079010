"""The run's models: the Planner and Trigger policies with their tokenizer, built from the typed `config.model`
(`RunSpec.model`) and `config.policy` (`RunSpec.policy`): a tiny random backbone over the worlds' words, or a local
Hugging Face checkpoint with LoRA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_collections

from icml_jax import parallel
from icml_jax.agents import tiny
from icml_jax.agents.build import build_policies, policies_on
from icml_jax.models.backbone import TINY
from icml_jax.models.decoder import Decoder
from icml_jax.models.lora import apply_lora
from icml_jax.models.tokenizer import load_tokenizer
from icml_jax.run.runspec import RunSpec


def build_tiny_tokenizer(config: ml_collections.ConfigDict, workdir: Path, spec: RunSpec | None = None):
    """The tiny backbone's word tokenizer over the run's worlds (the data's and the synthesis'), saved under
    `<workdir>/tokenizer`: the same words whatever stages run, so a run that starts online from another run's
    warm-up (`online.init_from`) has the same vocabulary and the same random backbone. `spec`: the run's typed
    configs when the caller holds them (else built from `config`)."""
    import tempfile

    spec = spec if spec is not None else RunSpec.from_config(config)
    words = set(tiny.world_vocabulary(spec.world, spec.observation))
    words |= set(tiny.world_vocabulary(spec.synthesis.world, spec.observation))
    # the other processes of a run build the same tokenizer where they do not race the first one's files
    where = Path(workdir) / "tokenizer" if parallel.is_primary() else Path(tempfile.mkdtemp(prefix="icml_tokenizer_"))
    return tiny.build_tokenizer(where, sorted(words))


def build_models(config: ml_collections.ConfigDict, workdir: Path, spec: RunSpec | None = None) -> tuple[Any, Any]:
    """Policies and tokenizer: `tiny` as in the persona-world experiment (tokenizer from the world's words,
    saved under `<workdir>/tokenizer`), `pretrained` from config.model.path with LoRA on the configured mesh."""
    from flax import nnx

    spec = spec if spec is not None else RunSpec.from_config(config)
    model = spec.model
    _, local_mesh = parallel.process_meshes(dict(spec.parallel.mesh))
    if model.kind == TINY:
        tokenizer = build_tiny_tokenizer(config, workdir, spec)
        policy = spec.policy
        seed = policy.seed
        backbone = Decoder(tiny.tiny_model_config(len(tokenizer), model.hidden, model.layers), rngs=nnx.Rngs(seed))
        if model.tiny_lora:
            backbone = apply_lora(backbone, spec.lora, seed=seed)
        trigger = None  # model.trigger_hidden: a Trigger backbone of another width (the size grid, Figure 6)
        width = model.trigger_hidden
        if width is not None and width != model.hidden:
            trigger = Decoder(tiny.tiny_model_config(len(tokenizer), width, model.layers), rngs=nnx.Rngs(seed + 2))
            if model.tiny_lora:
                trigger = apply_lora(trigger, spec.lora, seed=seed + 2)
        for decoder in (backbone, trigger):
            if decoder is not None:
                decoder.remat = policy.remat
        policies = policies_on(backbone, trigger, policy, rngs=nnx.Rngs(seed + 1))
        if local_mesh.size > 1:  # several devices: the policies live on them (replicated), as a real model does
            parallel.shard_model(policies, local_mesh, spec.parallel.rules)
        return policies, tokenizer

    # each process holds its own copy on its devices (with one process: the whole mesh)
    policies = build_policies(spec.policy, spec.lora, mesh=local_mesh, rules=spec.parallel.rules)
    return policies, load_tokenizer(model.path)
