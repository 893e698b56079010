"""The check every memory baseline must pass: two users' sessions interleaved, each user's memory and replies
hold only their own turns, and `reset` forgets both."""

from __future__ import annotations

from icml_jax.data.protocol import final_session_targets
from icml_jax.evaluation.protocol import gold_history
from tests.baselines.helpers import USER, episode


def check_two_users_never_mix(agent) -> None:
    """Plays two users' episodes interleaved session by session through `observe`, then answers each user's
    final session: no memory text, shown text or source turn of one user reaches the other."""
    a = episode(["I have a dog named Rex in Paris."], ["My dog Rex loves Paris."], ["Where is my dog Rex?"],
                episode_id="ep-A")
    b = episode(["I have a cat named Tom in Rome."], ["My cat Tom loves Rome."], ["Is my dog in Rome?"],
                episode_id="ep-B")
    agent.reset()
    for s in range(2):
        for ep in (a, b):
            history: list[tuple[str, str]] = []
            for t, turn in enumerate(ep.sessions[s].turns):
                if turn.speaker == USER:
                    agent.observe(ep.episode_id, ep, s, t, history)
                history.append((turn.speaker, turn.text))
    for ep, other in ((a, "Tom"), (b, "Rex")):
        texts = agent.memory_texts(ep.episode_id)
        assert texts and not any(other in t for t in texts)
        targets = final_session_targets(ep)
        (reply,) = agent.answer(ep.episode_id, ep, targets, [gold_history(ep, t.session, t.turn) for t in targets])
        assert reply.memory.all_refs and {r[0] for r in reply.memory.all_refs} == {ep.episode_id}
        assert other not in reply.memory.text
    agent.reset()
    assert agent.memory_texts("ep-A") == agent.memory_texts("ep-B") == []
