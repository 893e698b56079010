"""Figure 5's data: one evaluation episode played greedily by several policies (untrained, warm-up, online),
recording the Planner's save probability on every user turn (the policy's own saves shape its memory), and the
Trigger's query and memory features on every turn that needs a memory, over the same memories for every policy
(the turns the labels say to save), projected to 2-D with PCA (one projection per policy).

The Trigger's features are the ones its scores compare: with the bilinear match head (`policy.match_rank` > 0)
the query is h_0 U (the context-only option) and a memory is h_i V; without it, the pooled hidden states.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import ml_collections
import numpy as np

from icml_jax.agents.agent import MemoryAgent
from icml_jax.agents.policy import _features
from icml_jax.checkpoint import load_warmup
from icml_jax.data.stream import user_speaker
from icml_jax.evaluate import eval_episodes
from icml_jax.llm.offline import OfflineBackend
from icml_jax.memory.fragment import NewFragment
from icml_jax.memory.store import MemoryStore
from icml_jax.run.builders import build_models
from icml_jax.run.runspec import RunSpec


def _trigger_features(policies, tokens: np.ndarray, mask: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, ...]:
    """(query [D], memories [N, D]) of one Trigger observation (tokens [C, L]; option 0 is the context alone)."""
    h = np.asarray(_features(policies.trigger_backbone, jnp.asarray(tokens), jnp.asarray(mask), policies.pooling))
    n = int(cand.sum())
    if policies.trigger_match is not None:
        q = h[0] @ np.asarray(policies.trigger_match.context[...])
        k = h[1:n] @ np.asarray(policies.trigger_match.memory[...])
    else:
        q, k = h[0], h[1:n]
    return q, k


def _user_turns(episode, speaker: str | None):
    """(session, turn, Turn, gold history before it) of every turn the agent acts on, in order."""
    for s, session in enumerate(episode.sessions):
        history: list[tuple[str, str]] = []
        for t, turn in enumerate(session.turns):
            if speaker is None or turn.speaker == speaker:
                yield s, t, turn, tuple(history)
            history.append((turn.speaker, turn.text))


def _cosine_distance(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return 1.0 if na == 0 or nb == 0 else float(1.0 - a @ b / (na * nb))


def play_maps(config: ml_collections.ConfigDict, workdir: Path, checkpoint: Path | None, episode) -> dict[str, Any]:
    """One policy's maps: per user turn (session, turn, y_p, p(save), saved) and per turn that needs a memory the
    Trigger's query / candidate features over the labelled memories, which are needed, and summary distances."""
    spec = RunSpec.from_config(config)
    policies, tokenizer = build_models(config, workdir, spec)
    if checkpoint is not None:
        load_warmup(checkpoint, policies)
    policies.eval()
    agent_config = dataclasses.replace(spec.agent, greedy=True)
    speaker = user_speaker(spec.data)
    turns, queries = [], []
    with MemoryStore() as store:  # the Planner: the policy plays the episode with its own saves
        agent = MemoryAgent(policies, tokenizer, store, OfflineBackend(), config=agent_config, seed=int(config.seed))
        for s, t, turn, history in _user_turns(episode, speaker):
            _, receipt = agent.step(episode.episode_id, turn.text, history=history, episode_id=episode.episode_id,
                                    session=s, turn=t)
            turns.append({"session": s, "turn": t, "y_p": turn.y_p, "p_save": receipt.planner.prob_save,
                          "saved": receipt.planner.save})
    with MemoryStore() as store:  # the Trigger: every policy sees the same memories, the labelled saves (y_p)
        agent = MemoryAgent(policies, tokenizer, store, OfflineBackend(), config=agent_config, seed=int(config.seed))
        for s, t, turn, history in _user_turns(episode, speaker):
            needed = {(n.session, n.turn) for n in turn.y_t or ()}
            if needed and store.count(episode.episode_id):
                decision, _ = agent.choose_memory(episode.episode_id, turn.text, history=history,
                                                  episode_id=episode.episode_id, session=s, turn=t)
                refs = [tuple(store.get(episode.episode_id, i).ref[1:]) for i in decision.candidate_ids]
                q, k = _trigger_features(policies, decision.tokens, decision.mask, decision.cand_mask)
                queries.append({"session": s, "turn": t, "query": q, "memories": k,
                                "needed": [r in needed for r in refs], "chosen": decision.action})
            if turn.y_p:
                store.append(episode.episode_id, NewFragment(episode.episode_id, s, t, turn.text, turn.text, "gold"))
    pair = [_cosine_distance(x["query"], m) for x in queries for m, need in zip(x["memories"], x["needed"]) if need]
    other = [_cosine_distance(x["query"], m) for x in queries for m, need in zip(x["memories"], x["needed"])
             if not need]
    gold = [x["p_save"] for x in turns if x["y_p"]]
    rest = [x["p_save"] for x in turns if x["y_p"] is not None and not x["y_p"]]
    points = [x["query"] for x in queries] + [m for x in queries for m in x["memories"]]
    projected = _pca2(np.stack(points)) if points else np.zeros((0, 2))
    nq = len(queries)
    offsets = np.cumsum([0] + [len(x["memories"]) for x in queries])
    mean = lambda xs: float(np.mean(xs)) if xs else None  # noqa: E731
    return {
        "turns": turns,
        "queries": [{"session": x["session"], "turn": x["turn"], "xy": projected[i].tolist(),
                     "memories_xy": projected[nq + offsets[i]: nq + offsets[i + 1]].tolist(),
                     "needed": x["needed"], "chosen": x["chosen"]} for i, x in enumerate(queries)],
        "summary": {"save_prob_gold": mean(gold), "save_prob_other": mean(rest), "pair_distance": mean(pair),
                    "other_distance": mean(other)},
    }


def _pca2(x: np.ndarray) -> np.ndarray:
    """The first two principal components of the rows of x (zeros where the data has fewer dimensions of spread)."""
    centered = x - x.mean(axis=0)
    u, s, _ = np.linalg.svd(centered, full_matrices=False)
    out = np.zeros((x.shape[0], 2))
    k = min(2, s.shape[0])
    out[:, :k] = u[:, :k] * s[:k]
    return out


def episode_maps(config: ml_collections.ConfigDict, workdir: Path, checkpoints: dict[str, Path | None],
                 index: int) -> dict[str, Any]:
    """`play_maps` of each named policy on evaluation episode `index` (None: untrained heads)."""
    episodes = eval_episodes(config)
    if not 0 <= index < len(episodes):
        raise ValueError(f"experiments.policy_map_episode={index}: there are {len(episodes)} evaluation episodes")
    episode = episodes[index]
    return {"episode_id": episode.episode_id,
            "policies": {name: play_maps(config, workdir, ckpt, episode) for name, ckpt in checkpoints.items()}}


def plot_maps(maps: dict[str, Any], path: Path) -> None:
    """Top: p(save) per user turn per policy, gold saves marked; bottom: each policy's Trigger projection."""
    import matplotlib.pyplot as plt

    names = list(maps["policies"])
    fig = plt.figure(figsize=(4 * len(names), 6.5))
    top = fig.add_subplot(2, 1, 1)
    for name in names:
        turns = maps["policies"][name]["turns"]
        top.plot(range(len(turns)), [x["p_save"] for x in turns], marker=".", label=name)
    turns = maps["policies"][names[0]]["turns"]
    gold = [i for i, x in enumerate(turns) if x["y_p"]]
    top.scatter(gold, [1.02] * len(gold), marker="v", color="k", label="y_p = 1")
    top.set_xlabel(f"user turn of episode {maps['episode_id']}")
    top.set_ylabel("p(save)")
    top.set_ylim(-0.05, 1.08)
    top.legend(fontsize=7, ncol=len(names) + 1)
    for j, name in enumerate(names):
        ax = fig.add_subplot(2, len(names), len(names) + j + 1)
        for q in maps["policies"][name]["queries"]:
            ax.scatter(*q["xy"], color="tab:blue", s=14)
            for m, need in zip(q["memories_xy"], q["needed"], strict=True):
                ax.scatter(*m, color="tab:red" if need else "tab:gray", s=10, alpha=0.8 if need else 0.3)
                if need:
                    ax.plot([q["xy"][0], m[0]], [q["xy"][1], m[1]], color="tab:red", lw=0.6)
        ax.set_title(f"{name}: Trigger features (PCA)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


__all__ = ["episode_maps", "play_maps", "plot_maps"]
