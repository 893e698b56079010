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
