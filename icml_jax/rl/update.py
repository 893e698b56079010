"""The joint PPO update of the Planner and the Trigger: one jitted step per minibatch, several epochs.

A minibatch holds `minibatch_size` turn slots; each slot carries one Planner and one Trigger decision, each
with its own `valid` flag (a judge failure masks one agent's decision only; padding slots mask both). Token
arrays are re-padded to the largest bucket of the slot members (extra *left* padding changes nothing: positions
come from the mask), and a short last minibatch is filled with invalid slots, so step shapes stay on the
observation buckets and the number of compilations is small and countable (`ppo_step._cache_size()`).

Old log-probabilities and values (`PPOConfig.old_logp`): by default ("rollout") they are the numbers recorded
when each action was sampled, i.e. the behaviour policy's: a save whose truth reward arrived episodes later
was made by an older policy, and every minibatch after the first is trained on by a policy that already moved,
so the ratio can leave [1 - eps, 1 + eps] in epoch 0 and clipping engages. Rollouts score with LoRA dropout
off, and so does the update's forward unless `PPOConfig.update_dropout`, so with no policy change the ratio is
1 up to float noise. The option "recompute" anchors each minibatch on its own first-epoch forward instead: in
epoch 0 each step uses `old = stop_gradient(new)` (ratio exactly 1, clip fraction exactly 0, bit for bit, even
with dropout) and later epochs feed those numbers back. The minibatch partition is fixed for the whole update.
`rollout_logp_gap` in the metrics is the largest |epoch-0 forward - rollout| log-probability (float noise plus
the drift of the policy within epoch 0, plus dropout when it is on).

The step: `params` (the TRAINABLE state: adapters and heads), `frozen` (backbone weights, passed in, never
closed over) and `rest` (RNG state of LoRA dropout) go in; the optimizer state is donated; a non-finite loss or
gradient leaves parameters and optimizer state untouched and is counted (`rl.optim.guarded_apply`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from icml_jax import parallel
from icml_jax.agents.observation import left_pad
from icml_jax.checkpoint.arrays import check_compatible, leaves_index
from icml_jax.agents.policy import TRAINABLE, MemoryPolicies, planner_evaluate, trainable_group, trigger_evaluate
from icml_jax.rl.config import PPOConfig
from icml_jax.rl.divergence import DivergenceConfig, DivergenceMonitor, check_window
from icml_jax.rl.losses import combine_agent_losses, masked_mean, ppo_loss
from icml_jax.rl.optim import guarded_apply, label_params, make_optimizer

Array = jax.Array
AGENTS = ("planner", "trigger")
DIVERGENCE_HINT = ("Lower config.rl.ppo.actor_lr / critic_lr, or set config.divergence (action='rollback' discards "
                   "a diverged update and goes on)")
PER_STEP_ONLY = ("skipped",)  # step figures not averaged into the epoch metrics (skipped_steps counts them)


class PlannerBatch(NamedTuple):
    """Planner rows of a minibatch: observation tokens/mask [M, L], action (1 = save), targets, validity."""

    tokens: Array  # [M, L] int32
    mask: Array  # [M, L] bool
    actions: Array  # [M] int32
    advantages: Array  # [M] float32
    returns: Array  # [M] float32
    valid: Array  # [M] bool


class TriggerBatch(NamedTuple):
    """Trigger rows of a minibatch: option tokens/mask [M, C, L], cand_mask [M, C], chosen option, targets."""

    tokens: Array  # [M, C, L] int32
    mask: Array  # [M, C, L] bool
    cand_mask: Array  # [M, C] bool
    actions: Array  # [M] int32
    advantages: Array  # [M] float32
    returns: Array  # [M] float32
    valid: Array  # [M] bool


class Minibatch(NamedTuple):
    """One joint minibatch: M slots of (Planner decision, Trigger decision)."""

    planner: PlannerBatch
    trigger: TriggerBatch


class OldStats(NamedTuple):
    """Log-probabilities and values of the taken actions under the anchoring policy, per agent, [M] each."""

    planner_logp: Array
    planner_value: Array
    trigger_logp: Array
    trigger_value: Array

    @staticmethod
    def zeros(size: int) -> OldStats:
        """Placeholders for epoch 0 (where the step computes the real ones), on device like the step's outputs."""
        z = jnp.zeros((size,), jnp.float32)
        return OldStats(z, z, z, z)


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Static description of the step (hashable): the train-mode graph of the policies and the PPO settings.

    Equal specs (same architecture, same config) share compiled programs, e.g. across seeds in one process.
    """

    graphdef: Any  # nnx.GraphDef of MemoryPolicies in train mode (LoRA dropout on)
    config: PPOConfig


def step_config(config: PPOConfig) -> PPOConfig:
    """The config with the fields the step never reads (GAE, whitening, epochs, minibatch size, where the old
    statistics come from, dropout: the graph carries it) at their defaults, so that runs differing only in those
    share one compiled step."""
    d = PPOConfig()
    return dataclasses.replace(config, gamma=d.gamma, gae_lambda=d.gae_lambda, whiten=d.whiten, epochs=1,
                               minibatch_size=1, old_logp=d.old_logp, update_dropout=d.update_dropout)


@functools.lru_cache(maxsize=None)
def joint_optimizer(config: PPOConfig) -> optax.GradientTransformation:
    """The optimizer of the TRAINABLE state: actor lr for adapters and policy heads, critic lr for value heads.

    Cached per config so that equal configs give the identical transformation (and one compiled step).
    """
    return make_optimizer(config, lambda params: label_params(params, trainable_group))


def joint_loss(
    policies: MemoryPolicies, batch: Minibatch, old: OldStats, first_epoch: Array, config: PPOConfig
) -> tuple[Array, tuple[dict[str, Array], OldStats]]:
    """Planner + Trigger PPO loss of one minibatch, its metrics, and this forward's statistics (stop-gradient).

    With `first_epoch` true the old statistics are the (stop-gradient) new ones, so the ratio is exactly 1.
    """
    p, t = batch.planner, batch.trigger
    ps = planner_evaluate(policies, p.tokens, p.mask, p.actions)
    ts = trigger_evaluate(policies, t.tokens, t.mask, t.cand_mask, t.actions)
    sg = jax.lax.stop_gradient
    pick = lambda new, given: jnp.where(first_epoch, sg(new), given)  # noqa: E731
    anchor = OldStats(pick(ps.logp, old.planner_logp), pick(ps.value, old.planner_value),
                      pick(ts.logp, old.trigger_logp), pick(ts.value, old.trigger_value))
    current = OldStats(sg(ps.logp), sg(ps.value), sg(ts.logp), sg(ts.value))
    per_agent = {
        "planner": ppo_loss(ps.logp, anchor.planner_logp, p.advantages, p.returns, ps.value, anchor.planner_value,
                            ps.entropy, p.valid, config),
        "trigger": ppo_loss(ts.logp, anchor.trigger_logp, t.advantages, t.returns, ts.value, anchor.trigger_value,
                            ts.entropy, t.valid, config),
    }
    loss, metrics = combine_agent_losses(per_agent)
    for agent, new_logp, old_logp, valid in (("planner", ps.logp, anchor.planner_logp, p.valid),
                                             ("trigger", ts.logp, anchor.trigger_logp, t.valid)):
        dev = jnp.where(valid, jnp.abs(jnp.exp(sg(new_logp) - old_logp) - 1.0), 0.0)
        metrics[f"{agent}/ratio_max_dev"] = jnp.max(dev)
    metrics["trigger/memory_prob"] = masked_mean(1.0 - sg(ts.probs[:, 0]), t.valid)  # p(use some memory)
    metrics["planner/save_prob"] = masked_mean(sg(ps.probs), p.valid)
    return loss, (metrics, current)


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("opt_state",))
def ppo_step(
    spec: StepSpec,
    params: nnx.State,
    frozen: nnx.State,
    rest: nnx.State,
    opt_state: optax.OptState,
    num_skipped: Array,
    batch: Minibatch,
    old: OldStats,
    first_epoch: Array,
) -> tuple[nnx.State, optax.OptState, nnx.State, Array, OldStats, dict[str, Array]]:
    """One guarded optimizer step on one minibatch; returns (params, opt_state, rest, num_skipped, current,
    metrics), `current` being this forward's log-probabilities and values of the taken actions."""

    def loss_fn(trainable):
        # Fresh Variables for the RNG state at this trace level: LoRA dropout advances its counter in place,
        # and flax forbids mutating a Variable created at the outer (jit) level from inside the grad trace.
        local_rest = jax.tree.map(lambda x: x, rest)
        model = nnx.merge(spec.graphdef, trainable, frozen, local_rest)
        loss, (metrics, current) = joint_loss(model, batch, old, first_epoch, spec.config)
        return loss, (metrics, current, nnx.state(model, nnx.Not(nnx.Param)))

    (loss, (metrics, current, new_rest)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    step = guarded_apply(joint_optimizer(spec.config), loss, grads, params, opt_state, num_skipped)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads), param_norm=step.param_norm,
                   update_norm=step.update_norm, skipped=step.skipped.astype(jnp.float32))
    return step.params, step.opt_state, new_rest, step.num_skipped, current, metrics


STEPS_PER_CALL = 8  # minibatches of one shape that `ppo_steps` trains on in one dispatch


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("opt_state",))
def ppo_steps(
    spec: StepSpec,
    params: nnx.State,
    frozen: nnx.State,
    rest: nnx.State,
    opt_state: optax.OptState,
    num_skipped: Array,
    batches: Minibatch,
    olds: OldStats,
    first_epoch: Array,
) -> tuple[nnx.State, optax.OptState, nnx.State, Array, OldStats, dict[str, Array]]:
    """`ppo_step` on each minibatch of `batches` / `olds` (stacked on a leading axis) in turn, under one
    `lax.scan`: the same steps in one dispatch instead of one each (small steps are dispatch-bound); `current`
    and `metrics` come back stacked per step."""

    def body(carry, xs):
        params, opt_state, rest, num_skipped = carry
        batch, old = xs
        params, opt_state, rest, num_skipped, current, metrics = ppo_step(  # inlined into this program
            spec, params, frozen, rest, opt_state, num_skipped, batch, old, first_epoch)
        return (params, opt_state, rest, num_skipped), (current, metrics)

    (params, opt_state, rest, num_skipped), (current, metrics) = jax.lax.scan(
        body, (params, opt_state, rest, num_skipped), (batches, olds))
    return params, opt_state, rest, num_skipped, current, metrics


def _stack(trees: Sequence[Any]) -> Any:
    """Host pytrees (NumPy leaves) stacked on a new leading axis."""
    return jax.tree.map(lambda *xs: np.stack(xs), *trees)


def _unstack(tree: Any, n: int) -> list[Any]:
    """The inverse of `_stack` on host data: n pytrees."""
    return [jax.tree.map(lambda x: x[i], tree) for i in range(n)]


# ----------------------------------------------------------------------------------------------- host side


@dataclasses.dataclass(frozen=True)
class PlannerItem:
    """One Planner decision ready for training (arrays exactly as scored in the rollout)."""

    tokens: np.ndarray  # [L]
    mask: np.ndarray  # [L]
    action: int
    advantage: float
    ret: float
    rollout_logp: float  # log-probability of `action` when it was sampled (the behaviour policy)
    rollout_value: float = 0.0  # the value head's estimate then


@dataclasses.dataclass(frozen=True)
class TriggerItem:
    """One Trigger decision ready for training."""

    tokens: np.ndarray  # [C, L]
    mask: np.ndarray  # [C, L]
    cand_mask: np.ndarray  # [C]
    action: int
    advantage: float
    ret: float
    rollout_logp: float
    rollout_value: float = 0.0


@dataclasses.dataclass(frozen=True)
class Slot:
    """One turn slot of a joint minibatch; either decision may be absent (masked out)."""

    planner: PlannerItem | None
    trigger: TriggerItem | None


def _dummy_row(shape: tuple[int, ...], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens/mask of an invalid row: one real (pad) token at the end, so every computation stays finite."""
    tokens = np.full(shape, pad_id, np.int32)
    mask = np.zeros(shape, bool)
    mask[..., -1] = True
    return tokens, mask


def collate(slots: Sequence[Slot], size: int, pad_id: int = 0) -> Minibatch:
    """Stacks up to `size` slots into one Minibatch, re-padding to the largest member bucket; short = invalid rows."""
    if not 0 < len(slots) <= size:
        raise ValueError(f"collate: need 1..{size} slots, got {len(slots)}")
    p_items = [s.planner for s in slots if s.planner is not None]
    t_items = [s.trigger for s in slots if s.trigger is not None]
    lp = max((it.tokens.shape[-1] for it in p_items), default=1)
    ct = max((it.tokens.shape[0] for it in t_items), default=1)
    lt = max((it.tokens.shape[-1] for it in t_items), default=1)

    p_tok, p_mask = _dummy_row((size, lp), pad_id)
    p_act, p_adv, p_ret = np.zeros(size, np.int32), np.zeros(size, np.float32), np.zeros(size, np.float32)
    p_valid = np.zeros(size, bool)
    t_tok, t_mask = _dummy_row((size, ct, lt), pad_id)
    t_cand = np.zeros((size, ct), bool)
    t_cand[:, 0] = True
    t_act, t_adv, t_ret = np.zeros(size, np.int32), np.zeros(size, np.float32), np.zeros(size, np.float32)
    t_valid = np.zeros(size, bool)
    for i, slot in enumerate(slots):
        if (it := slot.planner) is not None:
            p_tok[i] = left_pad(it.tokens, lp, pad_id)
            p_mask[i] = left_pad(it.mask, lp, False)
            p_act[i], p_adv[i], p_ret[i], p_valid[i] = it.action, it.advantage, it.ret, True
        if (it := slot.trigger) is not None:
            c = it.tokens.shape[0]
            t_tok[i, :c] = left_pad(it.tokens, lt, pad_id)
            t_mask[i, :c] = left_pad(it.mask, lt, False)
            t_cand[i] = False
            t_cand[i, :c] = it.cand_mask
            t_act[i], t_adv[i], t_ret[i], t_valid[i] = it.action, it.advantage, it.ret, True
    return Minibatch(PlannerBatch(p_tok, p_mask, p_act, p_adv, p_ret, p_valid),
                     TriggerBatch(t_tok, t_mask, t_cand, t_act, t_adv, t_ret, t_valid))


def rollout_stats(slots: Sequence[Slot], size: int) -> OldStats:
    """The behaviour policy's log-probabilities and values of `slots`' decisions, rows as `collate` lays them out
    (0 for absent decisions and padding rows, which the step masks out)."""
    if not 0 < len(slots) <= size:
        raise ValueError(f"rollout_stats: need 1..{size} slots, got {len(slots)}")
    out = [np.zeros(size, np.float32) for _ in range(4)]
    for i, slot in enumerate(slots):
        for j, item in ((0, slot.planner), (2, slot.trigger)):
            if item is not None:
                out[j][i], out[j + 1][i] = item.rollout_logp, item.rollout_value
    return OldStats(*out)


def minibatch_shape(batch: Minibatch) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes that decide which compiled step runs: (planner tokens, trigger tokens)."""
    return tuple(batch.planner.tokens.shape), tuple(batch.trigger.tokens.shape)


def partition(slots: Sequence[Slot], size: int, rng: np.random.Generator) -> list[list[Slot]]:
    """Shuffles the slots once and cuts them into groups of `size` (the partition every epoch of an update reuses)."""
    order = rng.permutation(len(slots))
    return [[slots[j] for j in order[i: i + size]] for i in range(0, len(slots), size)]


@dataclasses.dataclass
class UpdateResult:
    """What one joint update did: per-epoch mean metrics, skipped steps, the programs it ran."""

    epochs: list[dict[str, float]]
    steps: int
    skipped: int
    shapes: set[tuple[tuple[int, ...], tuple[int, ...]]]
    rollout_logp_gap: dict[str, float]
    rolled_back: bool = False  # a divergence discarded this update (divergence.action='rollback')

    def metrics(self, prefix: str = "update") -> dict[str, float]:
        """Flat metrics: means over all steps, first- and last-epoch clip fraction / KL / ratio deviation."""
        out: dict[str, float] = {f"{prefix}/steps": float(self.steps), f"{prefix}/skipped_steps": float(self.skipped),
                                 f"{prefix}/epochs": float(len(self.epochs)),
                                 f"{prefix}/rolled_back": float(self.rolled_back)}
        if not self.epochs:
            return out
        keys = self.epochs[0].keys()
        for k in keys:
            out[f"{prefix}/{k}"] = float(np.mean([e[k] for e in self.epochs]))
        for name, epoch in (("first_epoch", self.epochs[0]), ("last_epoch", self.epochs[-1])):
            for agent in AGENTS:
                for k in ("clip_fraction", "approx_kl", "ratio_max_dev"):
                    out[f"{prefix}/{name}/{agent}/{k}"] = epoch[f"{agent}/{k}"]
        for agent, gap in self.rollout_logp_gap.items():
            out[f"{prefix}/{agent}/rollout_logp_gap"] = gap
        return out


class JointUpdater:
    """Owns the optimizer state of the TRAINABLE part of `policies` and runs PPO epochs over minibatches.

    The policies are left in eval mode (LoRA dropout off, for rollouts); the step uses the train-mode graph
    (dropout on) only with `config.update_dropout`.
    """

    def __init__(self, policies: MemoryPolicies, config: PPOConfig,
                 divergence: DivergenceConfig | None = None, *, mesh: Mesh | None = None) -> None:
        """`mesh`: where the update runs (default: the policies' mesh, if any). Minibatch rows are sharded over
        its `data` axis; a mesh spanning several processes runs one global update over the rows every process
        passes (the same host minibatches everywhere), the policies staying on their process-local mesh."""
        self.policies, self.config = policies, config
        self.monitor = DivergenceMonitor(divergence or DivergenceConfig(), "online PPO update")
        if config.update_dropout:
            policies.train()
        else:
            policies.eval()
        try:
            graphdef = nnx.graphdef(policies)
        finally:
            policies.eval()
        self.spec = StepSpec(graphdef, step_config(config))
        self.tx = joint_optimizer(self.spec.config)
        self.opt_state = self.tx.init(nnx.state(policies, TRAINABLE))
        self.local_mesh = parallel.model_mesh(policies)
        self.mesh = mesh if mesh is not None else self.local_mesh  # step inputs live where its outputs will
        self._replicated = NamedSharding(self.mesh, PartitionSpec()) if self.mesh is not None else None
        self._global = self.mesh is not None and self.mesh != self.local_mesh  # update mesh != playing mesh
        self._spans = self.mesh is not None and len({d.process_index for d in self.mesh.devices.flat}) > 1
        if self._global and self.local_mesh is None:
            raise ValueError("JointUpdater: an update mesh of its own needs the policies on a mesh too "
                             "(parallel.shard_model onto the process's local mesh)")
        data = self.mesh.shape["data"] if self.mesh is not None else 1
        if config.minibatch_size % data:
            raise ValueError(f"JointUpdater: minibatch_size={config.minibatch_size} rows cannot be sharded over the "
                             f"mesh's data axis of {data} devices; make it a multiple of {data}")
        self.num_skipped = self._put(jnp.zeros((), jnp.int32))
        self.opt_state = jax.tree.map(  # optax makes its step counters on one device
            lambda x: self._to_update_mesh(x) if isinstance(getattr(x, "sharding", None), NamedSharding)
            else self._put(x), self.opt_state)
        self.num_steps = 0

    def _put(self, tree: Any) -> Any:
        """Replicates small step inputs (counters, epoch-0 placeholders) over the update mesh, if any."""
        if self._replicated is None:
            return tree
        if not self._spans:
            return jax.device_put(tree, self._replicated)
        return jax.tree.map(lambda x: parallel.place(x, self._replicated), tree)

    def _to_update_mesh(self, tree: Any) -> Any:
        """Policy-mesh arrays on the update mesh (the same buffers) when the two differ."""
        return parallel.to_mesh(tree, self.mesh) if self._global else tree

    def _to_policy_mesh(self, tree: Any, like: Any) -> Any:
        """The step's outputs back on the policies' mesh, each with the sharding of its input `like`."""
        if not self._global:
            return tree
        tree = jax.tree.map(lambda x, ref: x if x.sharding == ref.sharding else jax.device_put(x, ref.sharding),
                            tree, like)
        return parallel.to_mesh(tree, self.local_mesh)

    def _rows(self, batch: Any, stacked: bool = False) -> Any:
        """A host minibatch (or a stack of them) on the update mesh, its rows sharded over `data`."""
        if self.mesh is None:
            return jax.device_put(batch)
        spec = PartitionSpec(None, "data") if stacked else PartitionSpec("data")
        return jax.tree.map(lambda x: parallel.place(x, NamedSharding(self.mesh, spec)), batch)

    def _flag(self, value: bool) -> Any:
        """The `first_epoch` flag as a step input (replicated over a mesh that spans processes)."""
        return self._put(np.asarray(value)) if self._spans else jnp.asarray(value)

    def split(self) -> tuple[nnx.State, nnx.State, nnx.State]:
        """(trainable, frozen, rest) states of the policies, in the order the step takes them."""
        _, trainable, frozen, rest = nnx.split(self.policies, TRAINABLE, nnx.Param, ...)
        return trainable, frozen, rest

    def run(self, minibatches: Sequence[Minibatch], rng: np.random.Generator,
            rollout: Sequence[OldStats] | None = None, *, epochs: int | None = None) -> UpdateResult:
        """`epochs` (default `config.epochs`) passes over the fixed partition, minibatch order reshuffled after
        epoch 0; then the new parameters are written back into the policies.

        `rollout[k]` = the behaviour policy's statistics of minibatch k's rows (`rollout_stats`): the ratio's
        anchor when `config.old_logp` is "rollout" (required then); with "recompute" used only for the
        `rollout_logp_gap` diagnostic (max |epoch-0 forward - rollout| over valid rows).
        """
        if not minibatches:
            return UpdateResult([], 0, 0, set(), {})
        use_rollout = self.config.old_logp == "rollout"
        if rollout is not None and len(rollout) != len(minibatches):
            raise ValueError(f"JointUpdater.run: {len(rollout)} rollout statistics for {len(minibatches)} minibatches")
        if use_rollout and rollout is None:
            raise ValueError("JointUpdater.run: PPOConfig.old_logp='rollout' anchors the ratio on the behaviour "
                             "policy, so every minibatch needs its rollout statistics (`rollout_stats`)")
        epochs = self.config.epochs if epochs is None else epochs
        params, frozen, rest = self._to_update_mesh(self.split())
        start_params, start_rest = params, rest  # their shardings: what the policies' mesh gets back
        host_batches = list(minibatches)
        shapes = {minibatch_shape(mb) for mb in host_batches}
        # runs of STEPS_PER_CALL steps go to `ppo_steps` when every minibatch has one shape; the rest one by one
        chunk = STEPS_PER_CALL if len(shapes) == 1 and len(host_batches) >= STEPS_PER_CALL else 0
        minibatches = [self._rows(mb) for mb in host_batches] if not chunk else []  # once for all epochs
        skipped_before = int(parallel.to_host(self.num_skipped))
        rollback = self.monitor.config.action == "rollback"  # the policies keep the old params until the end
        saved_opt = jax.tree.map(jnp.copy, self.opt_state) if rollback else None  # the live one is donated
        olds: list[Any] = ([jax.tree.map(np.asarray, r) for r in rollout] if use_rollout
                           else [None] * len(host_batches))  # host copies; None: this minibatch's epoch-0 forward
        seen: list[OldStats | None] = [None] * len(host_batches)  # each minibatch's epoch-0 forward statistics
        per_epoch = []
        for epoch in range(epochs):
            order = list(range(len(host_batches)) if epoch == 0 else rng.permutation(len(host_batches)))
            first = olds[order[0]] is None  # the same for every minibatch of an epoch
            zeros = OldStats.zeros(len(host_batches[0].planner.valid))
            outputs = []  # (minibatch indices, current, metrics, stacked: from `ppo_steps`) per dispatch
            cut = len(order) - len(order) % chunk if chunk else 0
            for start in range(0, cut, chunk or 1):
                ks = order[start: start + chunk]
                batch = self._rows(_stack([host_batches[k] for k in ks]), stacked=True)
                old = self._put(_stack([jax.tree.map(np.asarray, zeros) if first else olds[k] for k in ks]))
                params, self.opt_state, rest, self.num_skipped, current, metrics = ppo_steps(
                    self.spec, params, frozen, rest, self.opt_state, self.num_skipped, batch, old, self._flag(first))
                outputs.append((ks, current, metrics, True))
            for k in order[cut:]:
                batch = minibatches[k] if minibatches else self._rows(host_batches[k])
                old = self._put(jax.tree.map(jnp.asarray, zeros if first else olds[k]))
                params, self.opt_state, rest, self.num_skipped, current, metrics = ppo_step(
                    self.spec, params, frozen, rest, self.opt_state, self.num_skipped, batch, old, self._flag(first))
                outputs.append(([k], current, metrics, False))
            host = []
            for ks, current, metrics, stacked in parallel.to_host(outputs):  # one transfer per epoch
                currents = _unstack(current, len(ks)) if stacked else [current]
                host += _unstack(metrics, len(ks)) if stacked else [metrics]
                for k, c in zip(ks, currents, strict=True):
                    if first:
                        olds[k] = c
                    if epoch == 0:
                        seen[k] = c
            self.num_steps += len(host)
            if check_window(self.monitor, [(None, m) for m in host], self.num_steps - len(host), DIVERGENCE_HINT,
                            "the policy before this update"):  # rollback: this update never happened
                self.opt_state, self.num_skipped = saved_opt, self._put(jnp.asarray(skipped_before, jnp.int32))
                return UpdateResult(per_epoch, (epoch + 1) * len(host_batches), 0, shapes, {}, rolled_back=True)
            per_epoch.append({key: float(np.mean([m[key] for m in host])) for key in host[0]
                              if key not in PER_STEP_ONLY})
        nnx.update(self.policies, *self._to_policy_mesh((params, rest), (start_params, start_rest)))
        gap = {a: 0.0 for a in AGENTS}
        for k, forward in enumerate(seen if rollout is not None and epochs > 0 else ()):
            batch = host_batches[k]
            for agent, recomputed, given, valid in (
                ("planner", forward.planner_logp, rollout[k].planner_logp, batch.planner.valid),
                ("trigger", forward.trigger_logp, rollout[k].trigger_logp, batch.trigger.valid),
            ):
                diff = np.abs(np.asarray(recomputed) - given)[np.asarray(valid)]
                gap[agent] = max(gap[agent], float(diff.max(initial=0.0)))
        skipped = int(parallel.to_host(self.num_skipped)) - skipped_before
        return UpdateResult(per_epoch, len(host_batches) * epochs, skipped, shapes, gap)

    def state_dict(self) -> dict[str, Any]:
        """Optimizer state as a flat list of host arrays (its structure comes from the live optimizer on restore, so
        a checkpointer sees plain arrays) plus the step counters; a collective when the update mesh spans
        processes."""
        return {"opt_state": parallel.to_host(jax.tree.leaves(self.opt_state)),
                "num_skipped": parallel.to_host(self.num_skipped), "num_steps": self.num_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what `state_dict` returned; the leaves must match this optimizer's state one for one."""
        expected = jax.tree.leaves(self.opt_state)
        got = list(state["opt_state"])
        check_compatible(leaves_index(got), leaves_index(expected),
                         "JointUpdater.load_state_dict: optimizer state", dtypes=False)
        leaves = [jax.device_put(jnp.asarray(g, dtype=e.dtype), e.sharding) if e.is_fully_addressable
                  else parallel.place(np.asarray(g).astype(e.dtype), e.sharding) for e, g in zip(expected, got)]
        self.opt_state = jax.tree.unflatten(jax.tree.structure(self.opt_state), leaves)
        self.num_skipped = self._put(jnp.asarray(state["num_skipped"], jnp.int32))
        self.num_steps = int(state["num_steps"])
