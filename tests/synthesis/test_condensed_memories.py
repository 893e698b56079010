"""The warm-up's memories are the online memories: the synthesis condenses every memory of its expert data with
the memory writer and the condenser back end, so a Trigger candidate reads exactly what `save_turns` would store
for that turn online; notes that collapse onto the positive's do not stay as negatives."""

from __future__ import annotations

import hashlib
import re

from icml_jax.data import persona_world
from icml_jax.data.persona_world import PersonaWorldConfig
from icml_jax.data.schema import TurnRef
from icml_jax.llm import OfflineBackend
from icml_jax.llm.types import TASK_CONDENSE, LLMResponse
from icml_jax.memory import MemoryStore, TurnToSave, save_turns
from icml_jax.synthesis import SynthesisConfig, load_expert_data, synthesize

CONFIG = SynthesisConfig(seed=5, num_seeds=4, storylines_per_seed=2, prequels_per_storyline=3, heldout_fraction=0.25,
                         world=PersonaWorldConfig(seed=5, min_user_turns=3), hard_negatives=2, soft_negatives=2,
                         note_max_tokens=48)


# one note for every turn that still passes the note check (llm.note_check): it holds every word of the world
WORLD_NOTE = "The user said something about " + " ".join(sorted(set(re.findall(
    r"[a-z]{3,}", repr((persona_world.TEMPLATES, persona_world.NOISE)).lower())))) + "."


class NoteTaker(OfflineBackend):
    """The offline back end, except that a condensation answers with a digest of its whole prompt (turn and
    recent dialogue), then the turn itself: equal notes mean equal condensation requests. `collapse`: one note
    (WORLD_NOTE) for every turn."""

    name = "note-taker"

    def __init__(self, collapse: bool = False) -> None:
        super().__init__()
        self.collapse, self.condensed, self.note_caps = collapse, 0, set()

    def generate(self, requests):
        out = []
        for request, response in zip(requests, super().generate(requests), strict=True):
            if request.task == TASK_CONDENSE:
                self.condensed += 1
                self.note_caps.add(request.max_output_tokens)
                note = WORLD_NOTE if self.collapse else \
                    f"Note {hashlib.sha256(request.prompt.encode()).hexdigest()[:12]}: {request.metadata['turn_text']}"
                response = LLMResponse(text=note)
            out.append(response)
        return out


def test_trigger_candidates_read_what_the_online_writer_stores(tmp_path):
    writer, condenser = OfflineBackend(), NoteTaker()
    manifest = synthesize(CONFIG, writer, tmp_path, condenser=condenser)
    data = load_expert_data(tmp_path)
    episodes = {e.episode_id: e for e in data.train_episodes + data.heldout_episodes}
    examples = data.train_trigger + data.heldout_trigger
    candidates = [c for ex in examples for c in ex.candidates]
    assert len(candidates) > 50 and manifest["memories"]["backend"]["name"] == "note-taker"
    assert manifest["memories"]["train"]["memories"] > 0 and manifest["memories"]["train"]["fallbacks"] == 0
    assert condenser.condensed <= sum(manifest["memories"][s]["memories"] for s in ("train", "heldout"))
    assert condenser.note_caps == {CONFIG.note_max_tokens}
    with MemoryStore() as store:
        for i, c in enumerate(candidates[:40]):
            ep = episodes[c.episode_id]
            session, ref = ep.sessions[c.ref[0]], TurnRef(*c.ref)
            history = tuple((t.speaker, t.text) for t in session.turns[: ref.turn])
            online = NoteTaker()
            (fragment,) = save_turns(store, online, f"u{i}",
                                     [TurnToSave(ep.episode_id, ref.session, ref.turn, c.source_text, history)],
                                     policy_version="0", note_max_tokens=CONFIG.note_max_tokens)
            assert online.note_caps == {CONFIG.note_max_tokens}
            assert c.source_text == session.turns[ref.turn].text
            assert c.text == fragment.text and c.text.startswith("Note ")  # what the online Trigger would read
    # the expert's saves carry their notes too (what the Planner's memory observation shows in the warm-up)
    saved = [t for e in episodes.values() for s in e.sessions for t in s.turns if t.y_p]
    assert saved and all(t.meta["memory"].startswith("Note ") for t in saved)


def test_raw_turn_texts_when_condensation_is_off(tmp_path):
    import dataclasses

    synthesize(dataclasses.replace(CONFIG, condense_memories=False), OfflineBackend(), tmp_path,
               condenser=NoteTaker())
    data = load_expert_data(tmp_path)
    episodes = {e.episode_id: e for e in data.train_episodes}
    for c in (c for ex in data.train_trigger for c in ex.candidates):
        assert c.source_text is None and c.text == episodes[c.episode_id].turn(TurnRef(*c.ref)).text


def test_negatives_that_condense_onto_the_positive_note_are_dropped(tmp_path):
    manifest = synthesize(CONFIG, OfflineBackend(), tmp_path, condenser=NoteTaker(collapse=True))
    data = load_expert_data(tmp_path)
    with_positive = [ex for ex in data.train_trigger if ex.target > 0]
    assert with_positive and manifest["memories"]["train"]["negatives_dropped_as_duplicates"] > 0
    for ex in with_positive:  # every note is the same: only the positive can stay
        assert len(ex.candidates) == 1 and ex.target == 1 and ex.candidates[0].source == "positive"


def test_warmup_planner_examples_show_the_experts_earlier_notes_most_similar_first():
    """memories=k: each Planner example holds the expert's saves before it (as notes), the k most similar."""
    from icml_jax.data.schema import Episode, Session, Turn
    from icml_jax.synthesis import planner_examples

    def user(text, y_p, note=None):
        return Turn("user", text, y_p=y_p, y_t=(), meta={"memory": note} if note else {})

    ep = Episode("synthesis", "e", (
        Session((user("I adopted a dog named Rex.", True, "The user has a dog, Rex."), user("Nice day.", False),
                 user("I am vegan.", True, "The user is vegan."))),
        Session((user("Rex, my dog, is ill.", True), user("My dog Rex again.", False))),
    ))
    plain = planner_examples([ep], "user")
    assert all(e.memories == () for e in plain)
    shown = {e.utterance: e.memories for e in planner_examples([ep], "user", memories=1)}
    assert shown["I adopted a dog named Rex."] == ()  # nothing saved before the first turn
    assert shown["Nice day."] == ()  # no stored memory shares a word with it
    assert shown["Rex, my dog, is ill."] == ("The user has a dog, Rex.",)  # the note, not the turn text
    assert shown["My dog Rex again."] == ("Rex, my dog, is ill.",)  # uncondensed saves show their text
