"""Each baseline's memory behaviour on small handmade episodes with the offline back end (or scripted answers):
what it stores, what it shows a reply, what it forgets, how it counts malformed answers, and that two users'
memories never mix."""

from __future__ import annotations

import math

import pytest

from icml_jax.baselines import long_context as lc
from icml_jax.baselines.common import Query, ReplySettings
from icml_jax.baselines.dense import DenseAgent
from icml_jax.baselines.encoder import LexicalRelevance
from icml_jax.baselines.heuristic import HeuristicAgent
from icml_jax.baselines.mem0 import Mem0Agent
from icml_jax.baselines.memorybank import BankMemory, MemoryBankAgent
from icml_jax.baselines.no_memory import NoMemoryAgent
from icml_jax.evaluation.protocol import play as play_all
from icml_jax.llm import prompts as llm_prompts
from icml_jax.memory.lexical import bm25_scores
from icml_jax.memory.store import MemoryStore
from tests.baselines.helpers import USER, KeywordEncoder, Recording, count_words, episode, play
from tests.baselines.two_users import check_two_users_never_mix


@pytest.fixture
def store():
    with MemoryStore() as s:
        yield s


def refs_of(row) -> list[tuple[int, int]]:
    return [tuple(r) for r in row["memory_refs"]]


# -- no memory ----------------------------------------------------------------------------------------------


def test_no_memory_never_shows_memory_and_stores_nothing():
    gen = Recording()
    agent = NoMemoryAgent(gen, user_speaker=USER)
    result = play(agent, episode(["I live in Paris with my wife."], ["I work as a nurse."], ["Where do I live?",
                                                                                             "Right."]))
    assert result.targets and all(r["memory"] is None and r["memory_refs"] == [] and r["memory_id"] is None
                                  for r in result.targets)
    assert result.memories == [0, 0] and result.storage_tokens == [0, 0] and result.saved == []
    assert sum(c.turns for c in result.counts) == 0  # saved is None: no save decisions to count
    assert [r.task for r in gen.requests] == ["reply"] * len(result.targets) and gen.calls == 1  # one reply call
    assert all(r.metadata["memory"] is None and "(none)" in r.prompt for r in gen.requests)


# -- long context -------------------------------------------------------------------------------------------


LC_EPISODE = episode(["one two three four", "five six"], ["seven eight nine"], ["ten eleven twelve thirteen"],
                     ["what now?"])
LC_HISTORY = [(s, t) for s in range(3) for t in range(len(LC_EPISODE.sessions[s].turns))]  # oldest first


@pytest.mark.parametrize("budget", [16, 30, 40, 1000])
def test_long_context_keeps_the_newest_turns_within_the_budget(budget):
    agent = lc.LongContextAgent(Recording(), user_speaker=USER, count_tokens=count_words, budget=budget)
    result = play(agent, LC_EPISODE)
    assert result.memories == [4, 6, 8] and result.saved == []  # every turn kept verbatim, no save decision
    (row,) = result.targets
    kept = refs_of(row)
    assert kept == LC_HISTORY[len(LC_HISTORY) - len(kept):]  # a suffix: the oldest turns go first
    assert row["memory_tokens"] == count_words(row["memory"] or "") <= budget
    logged = agent._log[LC_EPISODE.episode_id]
    if len(kept) < len(LC_HISTORY):  # one more (older) turn would not fit
        assert count_words(lc.render(logged[len(logged) - len(kept) - 1:])) > budget
    else:
        assert row["memory"].startswith("Session 1:\nuser: one two three four")
    if kept:
        assert row["memory_ref"] == [2, 1] and "Session 3 (1 day after the previous session):" in row["memory"]
        assert "user: ten eleven twelve thirteen" in row["memory"]
    assert (budget == 16) == (len(kept) == 2)  # 16 tokens: session 3's header and its two turns only


def test_long_context_observes_earlier_sessions_only():
    agent = lc.LongContextAgent(Recording(), user_speaker=USER, count_tokens=count_words, budget=1000)
    agent.reset()
    history: list[tuple[str, str]] = []
    choice, saved, _ = agent.observe("u", LC_EPISODE, 0, 0, history)
    assert choice.text is None and saved is None and agent.memory_texts("u") == []
    agent.observe("u", LC_EPISODE, 0, 2, history)  # the session's last user turn: the session is over
    assert len(agent.memory_texts("u")) == 4
    choice, _, _ = agent.observe("u", LC_EPISODE, 1, 0, [])
    assert {r[1] for r in choice.all_refs} == {0} and len(choice.all_refs) == 4


def test_long_context_default_budget_is_what_the_backbone_context_leaves():
    reply = ReplySettings(max_tokens=10)
    agent = lc.LongContextAgent(Recording(), user_speaker=USER, count_tokens=count_words,
                                context_tokens=1000, margin=5, reply=reply)
    query = Query("what now?", (), "ep-1", 3, 0)  # the episode's one target: no history before it
    frame = llm_prompts.reply_request(query.history, query.utterance, None, max_output_tokens=10)
    frame_tokens = count_words(frame.system) + count_words(frame.prompt)
    assert agent.budget_for(query) == 1000 - 10 - frame_tokens - 5
    agent.context_tokens = 10 + frame_tokens + 5 + 16  # leaves a 16-token memory block
    (row,) = play(agent, LC_EPISODE).targets
    assert len(row["memory_refs"]) == 2 and row["memory_tokens"] <= 16
    assert "context_tokens (backbone) - reply_max_tokens" in agent.provenance()["budget"]
    with pytest.raises(ValueError, match="budget"):
        lc.LongContextAgent(Recording(), user_speaker=USER, count_tokens=count_words)


def test_backbone_context_from_the_tiny_decoder_or_config_json(tmp_path):
    import json

    import ml_collections

    config = ml_collections.ConfigDict({"model": {"kind": "tiny", "hidden": 16, "layers": 1, "path": None}})
    assert lc.backbone_context(config, tokenizer=[0] * 40) == 512  # agents.tiny.tiny_model_config's
    (tmp_path / "config.json").write_text(json.dumps(dict(
        model_type="llama", vocab_size=32, hidden_size=16, intermediate_size=32, num_attention_heads=2,
        num_hidden_layers=1, max_position_embeddings=2048)))
    config.model.kind, config.model.path = "pretrained", str(tmp_path)
    assert lc.backbone_context(config, tokenizer=None) == 2048
    config.model.path = None
    with pytest.raises(ValueError, match="long_context_tokens"):
        lc.backbone_context(config, tokenizer=None)


@pytest.mark.parametrize("kind, window", [("gemini", 1_048_576), ("openai", 128_000), ("openai", 4000),
                                          ("local", None), ("offline", None)])
def test_long_context_budget_comes_from_a_remote_generator_else_the_backbone(kind, window):
    import ml_collections

    from configs.base import gemini_backend

    generator = gemini_backend()
    generator.kind = kind
    if kind == "openai" and window == 4000:
        generator.context_tokens = 4000  # the knob: a local OpenAI-compatible server's smaller model
    if kind == "local":
        generator = ml_collections.ConfigDict({"kind": "local", "model_dir": "/nowhere"})
    config = ml_collections.ConfigDict({"model": {"kind": "tiny", "hidden": 16, "layers": 1, "path": None},
                                        "llm": {"generator": generator}})
    context, source = lc.generator_context(config, tokenizer=[0] * 40)
    if window is None:  # a local generator: the backbone's (here the tiny decoder's 512 positions)
        assert (context, source) == (512, "backbone max_position_embeddings")
    else:
        assert (context, source) == (window, "llm.generator.context_tokens")
        generator.context_tokens = 0
        with pytest.raises(ValueError, match="config.llm.generator: .*context_tokens must be >= 1"):
            lc.generator_context(config, tokenizer=[0] * 40)


# -- dense ------------------------------------------------------------------------------------------------


DENSE_EPISODE = episode(["I have a dog named Rex.", "I live in Paris.", "I am a nurse."],
                        ["I cook vegan food at home.", "My dog likes Paris."],
                        ["Should my dog come to Paris?", "What should I cook?"])


def test_dense_stores_every_acted_turn_and_shows_the_k_most_similar(store):
    encoder = KeywordEncoder(["dog", "paris", "nurse", "cook", "vegan"])
    agent = DenseAgent(Recording(), store, encoder, user_speaker=USER, top_k=2)
    result = play(agent, DENSE_EPISODE)
    assert [(s["session"], s["turn"]) for s in result.saved] == [(0, 0), (0, 2), (0, 4), (1, 0), (1, 2)]
    assert result.memories == [3, 5]
    memories = {(f.session, f.turn): f for f in store.fragments(DENSE_EPISODE.episode_id)}
    assert all(f.text == f.source_text for f in memories.values())  # the offline condenser keeps the turn text
    for row in result.targets:
        order = sorted(memories, key=lambda r: (-encoder.cosine(row["utterance"], memories[r].text),
                                                -list(memories).index(r)))
        assert refs_of(row) == order[:2]
        assert row["memory_id"] == memories[order[0]].fragment_id and row["memory_ref"] == list(order[0])
        assert row["memory"] == "\n".join(f"- {memories[r].text}" for r in order[:2])
    assert refs_of(result.targets[0])[0] == (1, 2)  # "My dog likes Paris." for "Should my dog come to Paris?"
    seen = [t for call in encoder.calls for t in call]
    assert len(seen) == len(set(seen))  # every text is encoded once
    utterances = {r["utterance"] for r in result.targets}
    assert any(utterances <= set(call) for call in encoder.calls)  # the final session's queries in one batch


def test_dense_before_any_memory_shows_none(store):
    agent = DenseAgent(Recording(), store, KeywordEncoder(["dog"]), user_speaker=USER)
    agent.reset()
    choice, saved, _ = agent.observe("u", DENSE_EPISODE, 0, 0, [])
    assert choice.text is None and saved is True and len(store.fragments("u")) == 1
    with pytest.raises(ValueError, match="top_k"):
        DenseAgent(Recording(), store, KeywordEncoder(["dog"]), user_speaker=USER, top_k=0)


LOCKSTEP_EPISODES = [
    DENSE_EPISODE,
    episode(["I have a cat named Tom.", "I live in Rome."], ["My cat hates Rome."], ["Where does my cat live?"],
            episode_id="ep-2"),
    episode(["I am a vegan cook."], ["I cook at home.", "I have a dog."], ["What should I cook?"],
            episode_id="ep-3"),
]


@pytest.mark.parametrize("kind", ["dense", "heuristic"])
def test_notes_written_in_lockstep_give_each_episode_its_sequential_result(kind):
    def run(lockstep: int):
        gen = Recording()
        with MemoryStore() as s:
            agent = (DenseAgent(gen, s, KeywordEncoder(["dog", "paris", "cat", "rome", "cook"]), user_speaker=USER,
                                top_k=2, lockstep=lockstep) if kind == "dense"
                     else HeuristicAgent(gen, s, user_speaker=USER, lockstep=lockstep))
            results = play_all(agent, LOCKSTEP_EPISODES, user_speaker=USER, count_tokens=count_words)
        drop = ("memory_id", "retrieval_ms", "generation_ms")  # a fresh fragment id per run; wall times
        rows = [([{k: v for k, v in row.items() if k not in drop} for row in r.targets], r.saved, r.memories,
                 r.storage_tokens, [vars(c) for c in r.counts]) for r in results]
        return rows, gen

    (alone, gen1), (together, gen3) = run(1), run(3)
    assert together == alone  # the same saves, memories shown and target rows
    assert sorted(r.prompt for r in gen3.tasks("condense")) == sorted(r.prompt for r in gen1.tasks("condense"))
    assert gen3.calls < gen1.calls  # one condense call per tick instead of one per turn


# -- heuristic ----------------------------------------------------------------------------------------------


def test_heuristic_saves_every_user_turn_and_recalls_the_bm25_best_or_none(store):
    ep = episode(["I have a dog named Rex.", "It is sunny today."], ["I work as a nurse in a dog clinic."],
                 ["Can my dog Rex sleep here?", "Tell me a joke."])
    gen = Recording()
    result = play(HeuristicAgent(gen, store, user_speaker=USER), ep)
    assert [(s["session"], s["turn"]) for s in result.saved] == [(0, 0), (0, 2), (1, 0)]
    assert len(gen.tasks("condense")) == 3  # condensed like our saves
    rows = {r["utterance"]: r for r in result.targets}
    frags = store.fragments(ep.episode_id)
    scores = bm25_scores("Can my dog Rex sleep here?", [f"{f.text} {f.source_text}" for f in frags])
    assert max(scores) > 0 and scores.index(max(scores)) == 0
    assert refs_of(rows["Can my dog Rex sleep here?"]) == [(0, 0)]  # Rex and dog beat dog alone
    assert rows["Can my dog Rex sleep here?"]["memory"] == "I have a dog named Rex."
    assert rows["Tell me a joke."]["memory"] is None and rows["I see."]["memory"] is None  # no shared word


# -- MemoryBank ---------------------------------------------------------------------------------------------


BANK_EPISODE = episode(["I have a dog named Max at home.", "I work as a nurse at the city hospital."],
                       ["My dog Max loves the park."], ["It is raining today."], ["What should I do with Max?"])


def test_memorybank_summarizes_each_session_reinforces_recalls_and_forgets():
    gen = Recording()
    agent = MemoryBankAgent(gen, LexicalRelevance(), user_speaker=USER, top_k=3, retention_threshold=0.3)
    result = play(agent, BANK_EPISODE)
    summaries = gen.tasks("baseline_summarize")
    assert [r.metadata["session"] for r in summaries] == [0, 1, 2]  # once per earlier session
    assert len(gen.tasks("baseline_extract_facts")) == 3 and result.saved == []
    bank = {m.memory_id: m for m in agent.memories[BANK_EPISODE.episode_id]}
    # the nurse fact (never recalled, S = 1) fell below 0.3 two sessions later; so did session 1's summary;
    # the dog memories recalled in session 1 (S = 2) are kept
    assert list(bank) == ["s0-summary", "s0-fact0", "s2-summary"] and agent.stats["forgotten"] == 2
    assert bank["s0-fact0"].text == "I have a dog named Max at home." and bank["s0-fact0"].refs == (
        (BANK_EPISODE.episode_id, 0, 0),)
    assert bank["s0-summary"].refs == ((BANK_EPISODE.episode_id, 0, 0), (BANK_EPISODE.episode_id, 0, 2))
    assert bank["s0-fact0"].strength == bank["s0-summary"].strength == 2.0 and bank["s0-fact0"].last_recall == 1
    assert bank["s2-summary"].strength == 1.0  # "It is raining today." matched nothing
    assert result.memories == [3, 4, 4]  # after each session: session 1 added a summary, session 2 forgot one
    row = result.targets[0]
    assert row["utterance"] == "What should I do with Max?" and set(refs_of(row)) == {(0, 0), (0, 2)}
    assert row["memory"].startswith("- ")
    assert bank["s0-fact0"].strength == 2.0  # the final session reinforces nothing


def test_memorybank_retention_and_ranking_weight():
    m = BankMemory("x", "fact", "t", (), 0, strength=2.0, last_recall=1)
    assert m.retention(1) == 1.0 and m.retention(3) == pytest.approx(math.exp(-1.0))
    agent = MemoryBankAgent(Recording(), LexicalRelevance(), user_speaker=USER)
    old = BankMemory("old", "fact", "my dog Max", (), 0, last_recall=0)
    new = BankMemory("new", "fact", "my dog Max", (), 2, last_recall=2)
    scores = agent.scores([Query("dog Max", (), "e", 3, 0)], [old, new])[0]
    assert scores[1] / scores[0] == pytest.approx(math.exp(-1) / math.exp(-3))  # same relevance, less retention


def test_memorybank_malformed_answers_are_counted_and_fall_back_visibly():
    gen = Recording({"baseline_summarize": lambda r: "", "baseline_extract_facts": lambda r: "no JSON here"})
    agent = MemoryBankAgent(gen, LexicalRelevance(), user_speaker=USER)
    play(agent, episode(["I have a dog.", "I like tea."], ["bye"]))
    assert agent.malformed == {"baseline_summarize": 1, "baseline_extract_facts": 1}
    bank = agent.memories["ep-1"]
    assert [m.text for m in bank] == ["I have a dog. I like tea.", "I have a dog.", "I like tea."]
    assert [m.refs for m in bank[1:]] == [(("ep-1", 0, 0),), (("ep-1", 0, 2),)]
    assert agent.provenance()["malformed_answers"] is agent.malformed  # live: the setting gets the final counts
    partial = Recording({"baseline_extract_facts": lambda r: '{"facts": [{"turn": 7, "fact": "X"}, "Y"]}'})
    agent = MemoryBankAgent(partial, LexicalRelevance(), user_speaker=USER)
    play(agent, episode(["I have a dog."], ["bye"]))
    facts = [m for m in agent.memories["ep-1"] if m.kind == "fact"]
    assert [(m.text, m.refs) for m in facts] == [("X", ()), ("Y", ())]  # kept, without a source turn
    assert agent.malformed == {"baseline_extract_facts": 2}


# -- Mem0 ---------------------------------------------------------------------------------------------------


MEM0_EPISODE = episode(["I live in Paris with my wife."], ["I moved to Berlin with my wife last month."],
                       ["I moved to Berlin with my wife last month.", "I have a dog named Max at home."],
                       ["I don't have my dog Max anymore."], ["Do you like Berlin?"])


def test_mem0_adds_updates_noops_and_deletes():
    gen = Recording()
    agent = Mem0Agent(gen, LexicalRelevance(), user_speaker=USER, similar=5)
    result = play(agent, MEM0_EPISODE)
    assert agent.events == {"ADD": 2, "UPDATE": 1, "DELETE": 1, "NOOP": 1, "fallback_ADD": 0}
    (memory,) = agent.memories["ep-1"].values()  # Paris became Berlin; the dog came and went
    assert memory.text == "I moved to Berlin with my wife last month."
    assert memory.refs == (("ep-1", 1, 0), ("ep-1", 0, 0))  # the updating turn first
    assert [(s["session"], s["turn"]) for s in result.saved] == [(0, 0), (1, 0), (2, 2)]  # NOOP / DELETE: no save
    assert result.memories == [1, 1, 2, 1]
    (row,) = result.targets
    assert row["memory"] == memory.text and refs_of(row) == [(1, 0), (0, 0)] and row["memory_ref"] == [1, 0]
    decide = gen.tasks("baseline_mem0_decide")
    assert [len(r.metadata["memories"]) for r in decide] == [0, 1, 1, 0, 1]  # similar memories shown (BM25 > 0)
    assert len(gen.tasks("baseline_extract_facts")) == 5 and agent.malformed == {}


def test_mem0_shows_at_most_s_similar_memories():
    gen = Recording()
    agent = Mem0Agent(gen, LexicalRelevance(), user_speaker=USER, similar=1)
    play(agent, episode(["I love my cat Luna.", "I love my dog Rex.", "I love my wife Ana."], ["bye"]))
    assert max(len(r.metadata["memories"]) for r in gen.tasks("baseline_mem0_decide")) == 1


@pytest.mark.parametrize("answer", ["oops", '{"event": "UPDATE", "id": "9", "text": "x"}', '{"event": "MERGE"}'])
def test_mem0_malformed_decisions_are_counted_and_become_adds(answer):
    agent = Mem0Agent(Recording({"baseline_mem0_decide": lambda r: answer}), LexicalRelevance(), user_speaker=USER)
    play(agent, episode(["I live in Paris with my wife.", "I live in Paris with my wife."], ["bye"]))
    assert agent.malformed == {"baseline_mem0_decide": 2} and agent.events["fallback_ADD"] == 2
    assert len(agent.memories["ep-1"]) == 2  # the fact is never dropped


def test_mem0_malformed_facts_fall_back_to_the_turn_text():
    agent = Mem0Agent(Recording({"baseline_extract_facts": lambda r: "[1, 2"}), LexicalRelevance(),
                      user_speaker=USER)
    play(agent, episode(["It is sunny."], ["bye"]))
    assert agent.malformed == {"baseline_extract_facts": 1}
    assert [m.text for m in agent.memories["ep-1"].values()] == ["It is sunny."]


# -- per-user isolation -------------------------------------------------------------------------------------


def _agents(store):
    gen = Recording()
    enc = KeywordEncoder(["dog", "cat", "paris", "rome"])
    return {
        "long_context": lc.LongContextAgent(gen, user_speaker=USER, count_tokens=count_words, budget=1000),
        "dense": DenseAgent(gen, store, enc, user_speaker=USER),
        "heuristic": HeuristicAgent(gen, store, user_speaker=USER),
        "memorybank": MemoryBankAgent(gen, LexicalRelevance(), user_speaker=USER),
        "mem0": Mem0Agent(gen, LexicalRelevance(), user_speaker=USER),
    }


@pytest.mark.parametrize("name", ["long_context", "dense", "heuristic", "memorybank", "mem0"])
def test_two_users_memories_never_mix(store, name):
    check_two_users_never_mix(_agents(store)[name])
