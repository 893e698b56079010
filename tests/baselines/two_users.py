"""The check every memory baseline must pass: two users' sessions interleaved, each user's memory and replies
hold only their own turns, and `reset` forgets both."""

from __future__ import annotations

from icml_jax.data.protocol import final_session_targets
from icml_jax.evaluation.protocol import gold_history
from tests.baselines.helpers import play_two_users


def check_two_users_never_mix(agent) -> None:
    """Plays two users' episodes interleaved session by session through `observe`, then answers each user's
    final session: no memory text, shown text or source turn of one user reaches the other."""
    a, b = play_two_users(agent)
    for ep, other in ((a, "Tom"), (b, "Rex")):
        texts = agent.memory_texts(ep.episode_id)
        assert texts and not any(other in t for t in texts)
        targets = final_session_targets(ep)
        (reply,) = agent.answer(ep.episode_id, ep, targets, [gold_history(ep, t.session, t.turn) for t in targets])
        assert reply.memory.all_refs and {r[0] for r in reply.memory.all_refs} == {ep.episode_id}
        assert other not in reply.memory.text
    agent.reset()
    assert agent.memory_texts("ep-A") == agent.memory_texts("ep-B") == []
