"""The joint PPO update of the Planner and the Trigger (`JointUpdater`): the optimizer state, several epochs
of `ppo.ppo_step` over a fixed partition of minibatches, the divergence checks and rollback.

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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from icml_jax import parallel
from icml_jax.agents.policy import TRAINABLE, MemoryPolicies
from icml_jax.checkpoint.arrays import check_compatible, leaves_index
from icml_jax.rl.batch import Minibatch, OldStats, minibatch_shape, stack, unstack
from icml_jax.rl.config import PPOConfig
from icml_jax.rl.divergence import DivergenceConfig, DivergenceMonitor, check_window
from icml_jax.rl.ppo import StepSpec, joint_optimizer, ppo_step, ppo_steps, step_config

AGENTS = ("planner", "trigger")
DIVERGENCE_HINT = ("Lower config.rl.ppo.actor_lr / critic_lr, or set config.divergence (action='rollback' discards "
                   "a diverged update and goes on)")
PER_STEP_ONLY = ("skipped",)  # step figures not averaged into the epoch metrics (skipped_steps counts them)
STEPS_PER_CALL = 8  # minibatches of one shape that `ppo_steps` trains on in one dispatch


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
                batch = self._rows(stack([host_batches[k] for k in ks]), stacked=True)
                old = self._put(stack([jax.tree.map(np.asarray, zeros) if first else olds[k] for k in ks]))
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
                currents = unstack(current, len(ks)) if stacked else [current]
                host += unstack(metrics, len(ks)) if stacked else [metrics]
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
