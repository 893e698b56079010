"""The local back end: the project's own Flax model and sampler behind the LLM protocol."""

from __future__ import annotations

import pytest

from icml_jax.llm import LLMRequest, LocalBackend, make_backend
from icml_jax.llm.generation import generate_reply
from icml_jax.models import from_pretrained, generate, load_tokenizer
from tests.models import hf_fixtures as F
from tests.models.tokenizer_fixtures import build_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("local_llm")
    F.build("qwen3", d)
    build_tokenizer(d)
    return d


def test_requests_answered_in_order_with_usage(model_dir):
    backend = make_backend({"kind": "local", "model_dir": str(model_dir), "dtype": "float32"})
    assert isinstance(backend, LocalBackend)
    requests = [LLMRequest("hello how are you", max_output_tokens=4),
                LLMRequest("i like my dog", system="be brief", max_output_tokens=6),
                LLMRequest("what do you eat", max_output_tokens=4)]
    answers = backend.generate(requests)
    assert len(answers) == 3 and all(isinstance(a.text, str) for a in answers)
    # Same answer as calling the sampler directly on the chat-templated prompt (greedy is deterministic).
    tok = load_tokenizer(model_dir)
    model = from_pretrained(model_dir)
    prompt = backend._render(requests[0])
    assert prompt.startswith("<bos><user>")
    assert answers[0].text == generate(model, tok, [prompt], max_new_tokens=4, add_special_tokens=False)[0]
    usage = backend.usage
    assert usage.calls == 3 and usage.prompt_tokens == sum(a.prompt_tokens for a in answers) > 0


def test_large_request_lists_run_in_bounded_power_of_two_batches(model_dir, monkeypatch):
    """5 requests with max_batch 2: chunks of 2, 2 and 1 rows; each answer is the one its prompt gets alone."""
    from icml_jax.models import sampler

    backend = make_backend({"kind": "local", "model_dir": str(model_dir), "dtype": "float32", "max_batch": 2})
    texts = ["hello how are you", "i like my dog", "what do you eat", "my dog is big", "how are you"]
    batches = []
    real = sampler.generate
    monkeypatch.setattr(sampler, "generate", lambda m, t, prompts, **kw: batches.append(len(prompts))
                        or real(m, t, prompts, **kw))
    answers = backend.generate([LLMRequest(t, max_output_tokens=4) for t in texts])
    assert batches == [2, 2, 1] and len(answers) == 5
    tok, model = load_tokenizer(model_dir), from_pretrained(model_dir)
    for text, answer in zip(texts, answers):
        prompt = backend._render(LLMRequest(text, max_output_tokens=4))
        assert answer.text == real(model, tok, [prompt], max_new_tokens=4, add_special_tokens=False)[0]
    # 3 requests under max_batch 4: one call padded to 4 rows, the padding's answers dropped
    batches.clear()
    four = make_backend({"kind": "local", "model_dir": str(model_dir), "dtype": "float32", "max_batch": 4})
    assert [a.text for a in four.generate([LLMRequest(t, max_output_tokens=4) for t in texts[:3]])] == \
        [a.text for a in answers[:3]] and batches == [4]
    with pytest.raises(ValueError, match="max_batch and max_batch_cells must be >= 1"):
        make_backend({"kind": "local", "model_dir": str(model_dir), "max_batch": 0})


def test_long_prompts_run_in_fewer_rows_within_the_cell_budget(model_dir, monkeypatch):
    """max_batch_cells bounds rows x padded length squared per call: 4 short prompts run 2 by 2 where their bucket
    allows 2, a long one alone (a row always runs); the answers are those of unbounded batches; a budget below 1 is
    refused."""
    from icml_jax.models import sampler

    block = {"kind": "local", "model_dir": str(model_dir), "dtype": "float32", "max_batch": 4}
    texts = ["hello how are you", "i like my dog", "what do you eat", "my dog is big", "my dog is big " * 30]
    requests = [LLMRequest(t, max_output_tokens=4) for t in texts]
    unbounded = make_backend(block)
    lengths = [len(unbounded.tokenizer(unbounded._render(r), add_special_tokens=False)["input_ids"]) for r in requests]
    short = sampler.length_bucket(max(lengths[:4]))
    assert sampler.length_bucket(lengths[4]) > short  # the long prompt is in a larger bucket
    batches, real = [], sampler.generate
    monkeypatch.setattr(sampler, "generate", lambda m, t, prompts, **kw: batches.append(len(prompts))
                        or real(m, t, prompts, **kw))
    expected = [a.text for a in unbounded.generate(requests)]
    assert batches == [4, 1]
    batches.clear()
    bounded = make_backend({**block, "max_batch_cells": 2 * short * short})
    assert [a.text for a in bounded.generate(requests)] == expected and batches == [2, 2, 1]
    with pytest.raises(ValueError, match="max_batch_cells must be >= 1"):
        make_backend({**block, "max_batch_cells": 0})


def test_a_sampled_answer_depends_on_its_request_alone(model_dir):
    """At temperature 1 a request gets the same answer alone, after other calls, in a batch of others and from
    another back end of the same seed (what the answer cache assumes); another seed gives other answers."""
    hot = [LLMRequest(t, max_output_tokens=8, temperature=1.0)
           for t in ("hello how are you", "i like my dog", "what do you eat", "my dog is big")]
    block = {"kind": "local", "model_dir": str(model_dir), "dtype": "float32"}
    backend = make_backend(block)
    alone = [backend.generate([r])[0].text for r in hot]
    assert [a.text for a in backend.generate(hot[::-1])] == alone[::-1]  # after 4 calls, all in one batch
    assert [a.text for a in make_backend({**block, "max_batch": 2}).generate(hot)] == alone
    assert [a.text for a in make_backend({**block, "seed": 1}).generate(hot)] != alone


def test_json_requests_record_parse_errors_not_crash(model_dir):
    backend = make_backend({"kind": "local", "model_dir": str(model_dir), "dtype": "float32"})
    (answer,) = backend.generate([LLMRequest("rate this", json_schema={"type": "object"}, max_output_tokens=3)])
    assert answer.parsed is None and answer.parse_error  # an untrained model does not write JSON


def test_reply_generation_through_local_backend(model_dir):
    backend = make_backend({"kind": "local", "model_dir": str(model_dir), "dtype": "float32"})
    reply = generate_reply(backend, [("user", "hello"), ("assistant", "hi")], "what do you eat", None)
    assert isinstance(reply, str)


def test_config_errors(model_dir):
    with pytest.raises(ValueError, match="needs model_dir"):
        make_backend({"kind": "local"})
    with pytest.raises(ValueError, match="unknown config key"):
        make_backend({"kind": "local", "model_dir": str(model_dir), "modle": 1})


def test_max_output_tokens_caps_every_request(model_dir, monkeypatch):
    """A 1024-token judge request to a local back end capped at 3 decodes 3 tokens: the answer of an uncapped
    3-token request; requests under the cap keep their own budget."""
    from icml_jax.models import sampler

    budgets = []
    real = sampler.generate
    monkeypatch.setattr(sampler, "generate", lambda m, t, prompts, **kw: budgets.append(kw["max_new_tokens"])
                        or real(m, t, prompts, **kw))
    capped = make_backend({"kind": "local", "model_dir": str(model_dir), "dtype": "float32", "max_output_tokens": 3})
    plain = make_backend({"kind": "local", "model_dir": str(model_dir), "dtype": "float32"})
    long, short = LLMRequest("i like my dog", max_output_tokens=1024), LLMRequest("i like my dog", max_output_tokens=2)
    assert capped.generate([long])[0].text == plain.generate([LLMRequest("i like my dog", max_output_tokens=3)])[0].text
    capped.generate([short])
    assert budgets == [3, 3, 2]
    with pytest.raises(ValueError, match="max_output_tokens must be >= 1"):
        make_backend({"kind": "local", "model_dir": str(model_dir), "max_output_tokens": 0})


def test_generate_each_answers_as_generate(model_dir):
    """The local back end has no generate_each of its own: the batch goes through generate in one call."""
    from icml_jax.llm.generation import generate_each

    backend = make_backend({"kind": "local", "model_dir": str(model_dir), "dtype": "float32"})
    requests = [LLMRequest("hello how are you", max_output_tokens=4),
                LLMRequest("what do you eat", max_output_tokens=4)]
    texts = lambda out: [(r.text, r.prompt_tokens, r.output_tokens) for r in out]  # noqa: E731 - not latency
    assert texts(generate_each(backend, requests)) == texts(backend.generate(requests))
    assert backend.usage.calls == 4


def test_loglik_matches_transformers_loss_on_the_same_prompts(model_dir):
    """Teacher-forced continuation log-likelihoods equal transformers' causal-LM loss (labels on the
    continuation only) times its length, in mixed-length batches split across chunks; an empty continuation
    scores 0 over 0 tokens."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from icml_jax.llm.types import LoglikRequest

    backend = make_backend({"kind": "local", "model_dir": str(model_dir), "dtype": "float32", "max_batch": 2})
    asks = [LoglikRequest(LLMRequest("hello how are you", system="be brief"), "i like my dog"),
            LoglikRequest(LLMRequest("what do you eat"), "my dog is big and i like how you are"),
            LoglikRequest(LLMRequest("i like my dog"), ""),
            LoglikRequest(LLMRequest("how are you"), "hello")]
    got = backend.loglik(asks)
    assert got[2].tokens == 0 and got[2].logprob == 0.0 and got[2].nll is None
    hf = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    tok = load_tokenizer(model_dir)
    for ask, answer in zip(asks, got):
        if not ask.continuation:
            continue
        prompt = tok(backend._render(ask.request), add_special_tokens=False)["input_ids"]
        cont = tok(ask.continuation, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + cont])
        labels = torch.tensor([[-100] * len(prompt) + cont])
        with torch.no_grad():
            loss = float(hf(input_ids=ids, labels=labels).loss)
        assert answer.tokens == len(cont) and answer.prompt_tokens == len(prompt)
        np.testing.assert_allclose(answer.nll, loss, rtol=2e-5, atol=2e-5)


def test_a_prompt_beyond_the_models_window_is_refused_before_any_work(model_dir, monkeypatch):
    """The fixture's window is 256 tokens: a prompt of about 300 is one error naming the request, its task and the
    window, and nothing runs (a row alone past the window is what ran LoCoMo's MemoChat out of memory)."""
    from icml_jax.models import sampler

    backend = make_backend({"kind": "local", "model_dir": str(model_dir), "dtype": "float32"})
    calls = []
    monkeypatch.setattr(sampler, "generate", lambda *a, **kw: calls.append(1))
    long = LLMRequest(" ".join(["dog"] * 300), max_output_tokens=4, task="memochat_retrieve")
    with pytest.raises(ValueError, match=r"request 1 \(task 'memochat_retrieve'\) has \d+ prompt tokens, at or "
                                         r"beyond the model's 256-token window"):
        backend.generate([LLMRequest("hello", max_output_tokens=4), long])
    assert calls == []
    fits = LLMRequest(" ".join(["dog"] * 200), max_output_tokens=4)
    monkeypatch.undo()
    assert len(backend.generate([fits])) == 1
