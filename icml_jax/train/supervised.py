"""Supervised warm-up of both policies on the synthesized expert data (the cold start before PPO).

The Planner learns y_p with binary cross-entropy on its save logit; the Trigger learns y_t with cross-entropy
over {none} + candidates; both value heads regress (value_weight > 0) on the expert's discounted returns,
computed from the labels with the online reward formulas and the learner's gamma, so PPO starts with critics
on the right scale. Only the adapters and the four
heads train (`checkpoint.TRAINABLE`); the backbone stays frozen. Each agent gets `epochs` passes over its own
examples, the two agents' steps interleaved evenly and sharing one optimizer state (a shared backbone's
adapters see both losses). Inputs go through Grain (shuffled, reshuffled per epoch, batched); every example is
encoded once into one shape bucket per agent, so each agent's jitted step compiles once (cached across runs
with equal settings).
Held-out planner precision / recall / F1 and trigger accuracy are measured before and after; the trained
state is saved with Orbax (`icml_jax.checkpoint.policy_file`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import nnx
from tqdm.auto import tqdm

from icml_jax.configlib import known_fields
from icml_jax.agents import observation as obs
from icml_jax.agents.policy import MemoryPolicies, planner_forward, trainable_group, trigger_forward
from icml_jax.data.schema import Episode, TurnRef
from icml_jax.rl.advantages import discounted_returns
from icml_jax.rl.config import PPOConfig, RewardConfig
from icml_jax.rl.divergence import DivergenceConfig, DivergenceMonitor, check_window
from icml_jax.rl.optim import CRITIC, OptimizerSettings, guarded_apply, label_params, make_optimizer
from icml_jax.rl.rewards import planner_reward, planner_training_reward, trigger_reward, truth_reward
from icml_jax.synthesis.dataset import ExpertData, load_expert_data
from icml_jax.synthesis.examples import PlannerExample, TriggerExample, planner_examples
from icml_jax.checkpoint import TRAINABLE, save_warmup
from icml_jax.checkpoint.files import write_text_atomic

Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class WarmupConfig:
    """Warm-up knobs; defaults are the paper's (lr 2e-5, 3 epochs, batch 4).

    Attributes:
      learning_rate / epochs / batch_size: Adam(W) step size, passes over the larger example set (the smaller
        one cycles), planner and trigger examples per step (each).
      weight_decay / max_grad_norm: AdamW decay and global-norm clipping (None = off).
      planner_weight / trigger_weight / value_weight: loss weights (value_weight 0 leaves the critics alone).
      value_through_backbone: let the value loss train the adapters too (as the PPO loss does); off by default,
        since returns are not predictable from a turn's observation alone and their large regression gradients
        would crowd out the policies' (clipped) gradients.
      expert_quality: r_qual assumed for the expert's Trigger choices and for triggered saves (value targets).
      gamma: discount of the value targets (the online learner's PPO gamma).
      rewards: the online reward settings the value targets are computed with.
      seed: input order; eval_batch_size: rows per scoring call (the last batch is padded, not recompiled).
      observation: what the policies see (must match the online agent's).
      log_every: steps between logged losses (and between the divergence checks, which name the exact step).
      divergence: when the warm-up counts as diverged and what happens then (`rl.divergence`).
    """

    learning_rate: float = 2e-5
    epochs: int = 3
    batch_size: int = 4
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    planner_weight: float = 1.0
    trigger_weight: float = 1.0
    value_weight: float = 0.5
    value_through_backbone: bool = False
    expert_quality: float = 1.0
    gamma: float = PPOConfig.gamma
    rewards: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    seed: int = 0
    eval_batch_size: int = 32
    observation: obs.ObservationConfig = dataclasses.field(default_factory=obs.ObservationConfig)
    log_every: int = 50
    divergence: DivergenceConfig = dataclasses.field(default_factory=DivergenceConfig)

    def __post_init__(self) -> None:
        """Rejects settings that cannot train, naming the field."""
        for name in ("epochs", "batch_size", "eval_batch_size", "log_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"WarmupConfig.{name} must be a positive int, got {v!r}")
        for name in ("learning_rate", "weight_decay", "planner_weight", "trigger_weight", "value_weight",
                     "expert_quality"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"WarmupConfig.{name} must be a finite number >= 0, got {v!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"WarmupConfig.gamma must be in [0, 1], got {self.gamma}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"WarmupConfig.max_grad_norm must be > 0 or None, got {self.max_grad_norm}")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | ml_collections.ConfigDict | None = None,
                    **overrides: Any) -> WarmupConfig:
        """From a ConfigDict / mapping (e.g. `config.warmup`) plus overrides; unknown keys are an error."""
        d = known_fields(cls, cfg, **overrides)
        if isinstance(d.get("rewards"), (Mapping, ml_collections.ConfigDict)):
            d["rewards"] = RewardConfig.from_dict(dict(d["rewards"]))
        if isinstance(d.get("observation"), (Mapping, ml_collections.ConfigDict)):
            d["observation"] = obs.ObservationConfig(**dict(d["observation"]))
        if not isinstance(d.get("divergence", DivergenceConfig()), DivergenceConfig):
            d["divergence"] = DivergenceConfig.from_config(d["divergence"])
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict (checkpoint metadata)."""
        return dataclasses.asdict(self)


RUN_FIELDS = ("observation", "rewards")  # the run's own blocks (`config.observation`, `config.rl.reward`)


def default_config() -> ml_collections.ConfigDict:
    """The `warmup` config block with the paper's defaults (for configs/*.py), without `RUN_FIELDS`: a run's
    warm-up sees the run's observation and rewards (`icml_jax.run.runspec.RunSpec.warmup` passes them)."""
    d = {k: v for k, v in WarmupConfig().to_dict().items() if k not in RUN_FIELDS}
    cfg = ml_collections.ConfigDict(d)
    cfg.max_grad_norm = ml_collections.config_dict.placeholder(float)  # a float that may be set to None
    cfg.max_grad_norm = d["max_grad_norm"]
    return cfg


# ----------------------------------------------------------------------------------------------- encoding


Returns = dict[tuple[str, TurnRef], float]  # (episode id, user turn) -> the expert's discounted return


def planner_expert_rewards(examples: Sequence[PlannerExample], config: WarmupConfig) -> np.ndarray:
    """The expert's reward per Planner decision, with the online formulas: a save earns its gain (r_proxy) plus
    the truth bonus when a later turn needs it (r_qual of that use = expert_quality); a discard earns the miss
    penalty (0 below the high-value threshold, which the expert's discards are); on [0, 1] when
    `config.rewards.normalize`, as the online learner trains on them."""
    saved = np.array([e.label for e in examples], bool)
    gain = np.array([e.gain for e in examples], np.float32)
    needed = np.array([e.needed_later for e in examples], bool)
    base = planner_reward(saved, gain, config.rewards)
    truth = truth_reward(gain, np.full_like(gain, config.expert_quality), needed, config.rewards)
    return planner_training_reward(np.where(saved, truth, base), config.rewards).astype(np.float32)


def expert_returns(episodes: Sequence[Episode], user_speaker: str, config: WarmupConfig) -> tuple[Returns, Returns]:
    """(Planner, Trigger) value targets: the expert's discounted returns over each episode's user turns, as the
    online learner defines returns (one trajectory per episode and agent, gamma = config.gamma), computed by
    `rl.advantages.discounted_returns` over all episodes at once (padded rows masked). The Trigger's reward per
    turn is r_qual of the expert's choice, taken as expert_quality."""
    per_episode = [(ep, planner_examples([ep], user_speaker)) for ep in episodes]
    per_episode = [(ep, examples) for ep, examples in per_episode if examples]
    if not per_episode:
        return {}, {}
    width = max(len(examples) for _, examples in per_episode)
    rewards = np.zeros((2, len(per_episode), width), np.float32)  # [agent, episode, turn]
    mask = np.zeros((len(per_episode), width), bool)
    for i, (_, examples) in enumerate(per_episode):
        n = len(examples)
        rewards[0, i, :n] = planner_expert_rewards(examples, config)
        rewards[1, i, :n] = np.asarray(trigger_reward(np.full(n, config.expert_quality)))
        mask[i, :n] = True
    g_p, g_t = (np.asarray(discounted_returns(r, None, mask, None, config.gamma)) for r in rewards)
    planner, trigger = {}, {}
    for i, (ep, examples) in enumerate(per_episode):
        for t, e in enumerate(examples):
            planner[(ep.episode_id, e.ref)] = float(g_p[i, t])
            trigger[(ep.episode_id, e.ref)] = float(g_t[i, t])
    return planner, trigger


def encode_planner_examples(tokenizer, examples: Sequence[PlannerExample], returns: Returns,
                            config: WarmupConfig) -> Batch:
    """tokens/mask [N, L] (one bucket), label [N] and value target [N]."""
    texts = [obs.planner_text(e.history, e.utterance, config.observation, e.memories) for e in examples]
    tokens, mask = obs.encode_planner(tokenizer, texts, config.observation)
    return {"tokens": tokens, "mask": mask, "label": np.array([e.label for e in examples], np.float32),
            "value_target": np.array([returns[(e.episode_id, e.ref)] for e in examples], np.float32)}


def encode_trigger_examples(tokenizer, examples: Sequence[TriggerExample], returns: Returns,
                            config: WarmupConfig) -> Batch:
    """tokens/mask [N, C, L], cand_mask [N, C] (one bucket), target [N] and value target [N]."""
    options = [obs.trigger_texts(e.history, e.utterance, [c.text for c in e.candidates], config.observation)
               for e in examples]
    tokens, mask, cand_mask = obs.encode_trigger(tokenizer, options, config.observation)
    missing = [e.example_id for e in examples if (e.episode_id, e.query) not in returns]
    if missing:
        raise ValueError(f"trigger example(s) {missing[:3]} point at turns of episodes not in the data")
    return {"tokens": tokens, "mask": mask, "cand_mask": cand_mask,
            "target": np.array([e.target for e in examples], np.int32),
            "value_target": np.array([returns[(e.episode_id, e.query)] for e in examples], np.float32)}


def _take(batch: Batch, idx: slice | np.ndarray) -> Batch:
    return {k: v[idx] for k, v in batch.items()}


@dataclasses.dataclass(frozen=True)
class EncodedData:
    """Both agents' train and held-out arrays, each agent in a single shape bucket."""

    planner_train: Batch
    planner_heldout: Batch
    trigger_train: Batch
    trigger_heldout: Batch


def encode_data(tokenizer, data: ExpertData, config: WarmupConfig) -> EncodedData:
    """Encodes train and held-out together (same buckets, so training and scoring compile once per agent)."""
    k = config.observation.planner_memories  # the expert's memories in the Planner's observation, as online
    similar = config.observation.make_prefilter().similar if k else None  # ranked as the online agent ranks them
    p_train = planner_examples(data.train_episodes, data.user_speaker, memories=k, similar=similar)
    p_held = planner_examples(data.heldout_episodes, data.user_speaker, memories=k, similar=similar)
    t_train, t_held = list(data.train_trigger), list(data.heldout_trigger)
    if not p_train or not t_train:
        raise ValueError(f"warm-up needs planner and trigger training examples, got {len(p_train)} and "
                         f"{len(t_train)} (is the synthesis output empty?)")
    p_returns, t_returns = expert_returns(data.train_episodes + data.heldout_episodes, data.user_speaker, config)
    planner = encode_planner_examples(tokenizer, p_train + p_held, p_returns, config)
    trigger = encode_trigger_examples(tokenizer, t_train + t_held, t_returns, config)
    n_p, n_t = len(p_train), len(t_train)
    return EncodedData(_take(planner, slice(0, n_p)), _take(planner, slice(n_p, None)),
                       _take(trigger, slice(0, n_t)), _take(trigger, slice(n_t, None)))


def batches(arrays: Batch, batch_size: int, seed: int) -> Iterator[Batch]:
    """Endless Grain stream of shuffled batches (reshuffled every epoch) of `arrays`, read in the calling thread:
    the arrays are in memory, and Grain's default read-ahead (16 threads, 500 elements) of an endless stream
    held the GIL and 2 CPU cores while the steps compiled (docs/benchmarks.md: up to 4.4x the compile time)."""
    n = len(next(iter(arrays.values())))
    ds = (grain.MapDataset.range(n).shuffle(seed=seed).repeat(None)
          .map(lambda i: {k: v[i] for k, v in arrays.items()}).batch(batch_size, drop_remainder=True))
    return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))


# ----------------------------------------------------------------------------------------------- the step


AGENTS = ("planner", "trigger")


@dataclasses.dataclass(frozen=True)
class _StepSpec:
    """What a compiled step depends on besides array shapes (hashable, so steps are cached per spec)."""

    agent: str  # "planner" | "trigger"
    learning_rate: float
    weight_decay: float
    max_grad_norm: float | None
    weight: float  # the agent's loss weight
    value_weight: float
    value_through_backbone: bool

    @classmethod
    def of(cls, c: WarmupConfig, agent: str) -> _StepSpec:
        weight = c.planner_weight if agent == "planner" else c.trigger_weight
        return cls(agent, c.learning_rate, c.weight_decay, c.max_grad_norm, weight, c.value_weight,
                   c.value_through_backbone)

    def optimizer(self) -> optax.GradientTransformation:
        """The trainer core's optimizer with per-group clipping (value heads / everything else), one learning
        rate: separate clipping keeps the value regression's large gradients from shrinking the policies' steps."""
        settings = OptimizerSettings(self.learning_rate, self.learning_rate, self.weight_decay, self.max_grad_norm,
                                     clip="per_group")
        return make_optimizer(settings, param_groups)


def param_groups(params: Any) -> Any:
    """The trainer core's labels of the trainable state: 'critic' for the value heads' leaves, 'actor' for the
    rest (`agents.policy.trainable_group`, the rule the PPO update uses)."""
    return label_params(params, trainable_group)


def critic_only(params: nnx.State) -> nnx.State:
    """The same values, with gradients stopped everywhere except the value heads."""
    return jax.tree.map(lambda x, label: x if label == CRITIC else jax.lax.stop_gradient(x), params,
                        param_groups(params))


def planner_loss(policies: MemoryPolicies, critics: MemoryPolicies, batch: Batch, weight: float,
                 value_weight: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """weight * BCE(save logit, y_p) + value_weight * 0.5 * (value - expert return)^2 (value from `critics`)."""
    logit, value = planner_forward(policies, batch["tokens"], batch["mask"])
    if critics is not policies:
        _, value = planner_forward(critics, batch["tokens"], batch["mask"])
    bce = jnp.mean(optax.sigmoid_binary_cross_entropy(logit, batch["label"]))
    v_loss = 0.5 * jnp.mean((value - batch["value_target"]) ** 2)
    loss = weight * bce + value_weight * v_loss
    return loss, {"loss": loss, "policy_loss": bce, "value_loss": v_loss}


def trigger_loss(policies: MemoryPolicies, critics: MemoryPolicies, batch: Batch, weight: float,
                 value_weight: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """weight * CE(candidate logits, expert choice) + value_weight * 0.5 * (value - expert return)^2."""
    logits, value = trigger_forward(policies, batch["tokens"], batch["mask"], batch["cand_mask"])
    if critics is not policies:
        _, value = trigger_forward(critics, batch["tokens"], batch["mask"], batch["cand_mask"])
    ce = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["target"]))
    v_loss = 0.5 * jnp.mean((value - batch["value_target"]) ** 2)
    loss = weight * ce + value_weight * v_loss
    return loss, {"loss": loss, "policy_loss": ce, "value_loss": v_loss}


@functools.lru_cache(maxsize=8)
def train_step_for(spec: _StepSpec):
    """The jitted warm-up step of one agent (cached: runs with equal settings and shapes share one compilation).

    step(graphdef, trainable, rng_state, opt_state, frozen, batch, num_skipped)
      -> (trainable, rng_state, opt_state, num_skipped, metrics); trainable and opt_state are donated. Both
    agents' steps share one optimizer state (over all trainable parameters), so a shared backbone's adapters
    see both losses. Unless `value_through_backbone`, the value loss reaches only the value heads: the values
    come from a second copy of the model whose other parameters are gradient-stopped and whose dropout draws
    the same masks, so XLA computes the forward pass once.
    """
    tx = spec.optimizer()
    loss_of = planner_loss if spec.agent == "planner" else trigger_loss
    detach = spec.value_weight > 0 and not spec.value_through_backbone

    @functools.partial(jax.jit, static_argnums=0, donate_argnums=(1, 3))
    def step(graphdef, trainable, rng_state, opt_state, frozen, batch, num_skipped):
        def loss_fn(params):
            # Fresh Variables at this trace level: adapter dropout advances the RNG counts while differentiating.
            model = nnx.merge(graphdef, params, jax.tree.map(lambda x: x, rng_state), frozen)
            critics = (nnx.merge(graphdef, critic_only(params), jax.tree.map(lambda x: x, rng_state), frozen)
                       if detach else model)
            loss, metrics = loss_of(model, critics, batch, spec.weight, spec.value_weight)
            return loss, (metrics, nnx.state(model, nnx.RngState))

        (loss, (metrics, new_rng)), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
        guarded = guarded_apply(tx, loss, grads, trainable, opt_state, num_skipped)
        return guarded.params, new_rng, guarded.opt_state, guarded.num_skipped, {
            **metrics, "skipped": guarded.skipped, "param_norm": guarded.param_norm, "update_norm": guarded.update_norm}

    step.tx = tx
    return step


def schedule(n_planner: int, n_trigger: int, config: WarmupConfig) -> list[str]:
    """The agent of each step: `epochs` passes over each agent's examples, interleaved evenly."""
    steps = {a: max(1, math.ceil(config.epochs * n / config.batch_size)) if n else 0
             for a, n in (("planner", n_planner), ("trigger", n_trigger))}
    done = {a: 0 for a in AGENTS}
    order = []
    for _ in range(sum(steps.values())):
        agent = min((a for a in AGENTS if done[a] < steps[a]), key=lambda a: (done[a] + 1) / steps[a])
        done[agent] += 1
        order.append(agent)
    return order


def split_policies(policies: MemoryPolicies) -> tuple[Any, nnx.State, nnx.State, nnx.State]:
    """(graphdef, trainable params, RNG state, everything else) of the policies."""
    return nnx.split(policies, TRAINABLE, nnx.RngState, ...)


# ----------------------------------------------------------------------------------------------- evaluation


@functools.partial(jax.jit, static_argnums=0)
def _score_planner(graphdef, state, tokens, mask):
    logit, value = planner_forward(nnx.merge(graphdef, state), tokens, mask)
    return logit, value


@functools.partial(jax.jit, static_argnums=0)
def _score_trigger(graphdef, state, tokens, mask, cand_mask):
    logits, value = trigger_forward(nnx.merge(graphdef, state), tokens, mask, cand_mask)
    return logits, value


def _padded_batches(arrays: Batch, size: int) -> Iterator[tuple[Batch, int]]:
    """Fixed-size batches in order; the last one padded with empty rows (n real rows returned alongside)."""
    n = len(next(iter(arrays.values())))
    for start in range(0, n, size):
        chunk = _take(arrays, slice(start, start + size))
        real = len(next(iter(chunk.values())))
        if real < size:
            chunk = {k: np.concatenate([v, np.zeros((size - real, *v.shape[1:]), v.dtype)]) for k, v in chunk.items()}
        yield chunk, real


def evaluate(policies: MemoryPolicies, planner: Batch, trigger: Batch, batch_size: int) -> dict[str, float]:
    """Planner precision / recall / F1 (save iff p >= 0.5) and Trigger accuracy (argmax = expert's choice)."""
    graphdef, state = nnx.split(policies)
    p_logits, p_values, t_pred, t_values = [], [], [], []
    for chunk, real in _padded_batches(planner, batch_size):
        logit, value = _score_planner(graphdef, state, chunk["tokens"], chunk["mask"])
        p_logits.append(np.asarray(logit)[:real])
        p_values.append(np.asarray(value)[:real])
    for chunk, real in _padded_batches(trigger, batch_size):
        logits, value = _score_trigger(graphdef, state, chunk["tokens"], chunk["mask"], chunk["cand_mask"])
        t_pred.append(np.argmax(np.asarray(logits), -1)[:real])
        t_values.append(np.asarray(value)[:real])
    return metrics_from_scores(np.concatenate(p_logits), np.concatenate(p_values), planner,
                               np.concatenate(t_pred), np.concatenate(t_values), trigger)


def metrics_from_scores(p_logit: np.ndarray, p_value: np.ndarray, planner: Batch, t_pred: np.ndarray,
                        t_value: np.ndarray, trigger: Batch) -> dict[str, float]:
    """The held-out report from raw scores, with the trivial baselines (always save, always "none", chance)."""
    y = planner["label"] > 0.5
    pred = p_logit >= 0.0
    tp, fp, fn = int(np.sum(pred & y)), int(np.sum(pred & ~y)), int(np.sum(~pred & y))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    pos_rate = float(np.mean(y)) if len(y) else 0.0
    target = trigger["target"]
    correct = t_pred == target
    has_pos = target > 0
    n_options = trigger["cand_mask"].sum(-1)
    return {
        "planner/precision": precision,
        "planner/recall": recall,
        "planner/f1": f1,
        "planner/accuracy": float(np.mean(pred == y)) if len(y) else 0.0,
        "planner/positive_rate": pos_rate,
        "planner/always_save_f1": 2 * pos_rate / (1 + pos_rate) if pos_rate else 0.0,
        "planner/value_mae": float(np.mean(np.abs(p_value - planner["value_target"]))) if len(y) else 0.0,
        "trigger/accuracy": float(np.mean(correct)) if len(target) else 0.0,
        "trigger/accuracy_needed": float(np.mean(correct[has_pos])) if has_pos.any() else 0.0,
        "trigger/accuracy_none": float(np.mean(correct[~has_pos])) if (~has_pos).any() else 0.0,
        "trigger/always_none_accuracy": float(np.mean(~has_pos)) if len(target) else 0.0,
        "trigger/chance_accuracy": float(np.mean(1.0 / n_options)) if len(target) else 0.0,
        "trigger/value_mae": float(np.mean(np.abs(t_value - trigger["value_target"]))) if len(target) else 0.0,
        "planner/examples": float(len(y)),
        "trigger/examples": float(len(target)),
    }


# ----------------------------------------------------------------------------------------------- the loop


@dataclasses.dataclass(frozen=True)
class WarmupResult:
    """What a warm-up did: held-out metrics before/after, steps, logged losses, compilations, checkpoint."""

    before: dict[str, float]
    after: dict[str, float]
    steps: int
    skipped_steps: int
    history: tuple[dict[str, float], ...]
    compilations: dict[str, int]
    seconds: float
    checkpoint: str | None
    rollbacks: int = 0  # diverged windows rolled back (divergence.action='rollback')

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict."""
        return dataclasses.asdict(self)


def _cache_sizes(steps: Mapping[str, Any]) -> dict[str, int]:
    """Compiled programs per jitted function (each should be 1: one shape bucket per agent)."""
    return {**{f"{a}_step": f._cache_size() for a, f in steps.items()},
            "score_planner": _score_planner._cache_size(), "score_trigger": _score_trigger._cache_size()}


DIVERGENCE_HINT = ("Lower config.warmup.learning_rate, or set config.divergence (action='rollback' restores the "
                   "last good state and goes on)")


def warmup(
    config: WarmupConfig | ml_collections.ConfigDict | Mapping[str, Any],
    policies: MemoryPolicies,
    tokenizer,
    data: ExpertData | str | os.PathLike[str],
    workdir: str | os.PathLike[str] | None,
) -> WarmupResult:
    """Trains `policies` in place on the expert data (a synthesis directory or ExpertData); when `workdir` is
    given, saves the trained state to `<workdir>/warmup` (Orbax) with the metrics. Returns the report.
    A progress bar (stderr) counts the optimisation steps."""
    if not isinstance(config, WarmupConfig):
        config = WarmupConfig.from_config(config)
    if not isinstance(data, ExpertData):
        data = load_expert_data(data)
    start = time.perf_counter()
    enc = encode_data(tokenizer, data, config)
    has_heldout = len(enc.planner_heldout["label"]) > 0 and len(enc.trigger_heldout["target"]) > 0
    policies.eval()
    before = evaluate(policies, enc.planner_heldout, enc.trigger_heldout, config.eval_batch_size) if has_heldout else {}

    steps = {a: train_step_for(_StepSpec.of(config, a)) for a in AGENTS}
    policies.train()  # adapter dropout on
    graphdef, trainable, rng_state, frozen = split_policies(policies)
    trainable = jax.tree.map(jnp.copy, trainable)  # the steps donate it; keep `policies` intact until the end
    # One optimizer state over all trainable parameters; both agents' txs are identical but for the loss weight.
    opt_state = steps["planner"].tx.init(trainable)
    order = schedule(len(enc.planner_train["label"]), len(enc.trigger_train["target"]), config)
    streams = {"planner": batches(enc.planner_train, config.batch_size, config.seed),
               "trigger": batches(enc.trigger_train, config.batch_size, config.seed + 1)}
    skipped = jnp.zeros((), jnp.int32)
    history: list[dict[str, float]] = []
    last: dict[str, dict[str, float]] = {}
    monitor = DivergenceMonitor(config.divergence, "warm-up")
    copy = functools.partial(jax.tree.map, jnp.copy)  # the steps donate their inputs: keep copies apart
    # divergence.action 'rollback': the state after the last window that passed the checks
    good = copy((trainable, rng_state, opt_state, skipped)) if config.divergence.action == "rollback" else None
    window: list[tuple[str, dict[str, jax.Array]]] = []
    for i, agent in enumerate(tqdm(order, desc="warm-up steps", unit="step", leave=False)):
        trainable, rng_state, opt_state, skipped, metrics = steps[agent](
            graphdef, trainable, rng_state, opt_state, frozen, next(streams[agent]), skipped)
        window.append((agent, metrics))
        if (i + 1) % config.log_every == 0 or i + 1 == len(order):
            host = jax.device_get(window)  # one transfer per window; the checks name the exact step
            first = i + 1 - len(host)
            rolled_back = check_window(monitor, host, first, DIVERGENCE_HINT, f"the state after step {first}")
            if rolled_back:
                trainable, rng_state, opt_state, skipped = copy(good)
            elif good is not None:
                good = copy((trainable, rng_state, opt_state, skipped))
            last.update((a, m) for a, m in host)
            window = []
            row = {"step": float(i + 1), **{f"{a}/{k}": float(v) for a, m in last.items() for k, v in m.items()},
                   **({"rolled_back": 1.0} if rolled_back else {})}
            history.append(row)
            logging.info("warm-up step %d/%d: %s", i + 1, len(order), row)
    nnx.update(policies, trainable, rng_state)
    policies.eval()
    after = evaluate(policies, enc.planner_heldout, enc.trigger_heldout, config.eval_batch_size) if has_heldout else {}
    skipped_steps = int(skipped)
    if skipped_steps:
        logging.warning("warm-up: %d of %d steps had non-finite values and were skipped", skipped_steps, len(order))
    result = WarmupResult(before, after, len(order), skipped_steps, tuple(history), _cache_sizes(steps),
                          time.perf_counter() - start, None, monitor.rollbacks)
    if workdir is not None:
        path = Path(workdir) / "warmup"
        save_warmup(path, policies, {"config": config.to_dict(), "result": result.to_dict(),
                                     "data": {"manifest_files": data.manifest.get("files", {}),
                                              "backend": data.manifest.get("backend")}})
        result = dataclasses.replace(result, checkpoint=str(path))
        write_text_atomic(path / "metrics.json", json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n")
    return result
