"""Tiny GGUF files written the way llama.cpp's convert_hf_to_gguf.py writes them, from tiny transformers models.

The writer does llama.cpp's steps (q/k row permutation for Llama, +1 on Gemma norm weights, `rope_freqs` for
Llama-3 rope scaling, quantization) and returns the HF weights the converter should give back: the original
weights after the quantization round trip, dequantized by transformers' own torch kernels where they support
the type (an implementation independent of the `gguf` package the converter uses).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers.integrations.gguf import dequant as torch_dequant

from tests.models import hf_fixtures as F

Q = gguf.GGMLQuantizationType
ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3"}
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = ["the cat sat on the mat", "hello world, hello there", "numbers 12 345 6789", "we like tiny tests"] * 20
BPE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SPM_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
SPM_WORDS = ["hello", "world", "the", "cat", "sat", "tiny", "test", "model", "user"]

# Quantization of each tensor kind (GGUF name suffix) per test case; the rest is F32 as llama.cpp keeps norms.
QUANT_MIX = {"attn_q.weight": Q.Q8_0, "attn_k.weight": Q.Q4_0, "attn_v.weight": Q.Q4_1, "attn_output.weight": Q.Q5_0,
             "ffn_gate.weight": Q.F16, "ffn_up.weight": Q.BF16, "ffn_down.weight": Q.Q8_0, "token_embd.weight": Q.Q8_0,
             "output.weight": Q.Q4_1}

_BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
          "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
          "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_GEMMA_BLOCK = {**_BLOCK, "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                "post_feedforward_layernorm": "post_ffw_norm"}


def gguf_name(hf_name: str, arch: str) -> str:
    """llama.cpp's tensor name for a HF one."""
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf_name in top:
        return top[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{(_GEMMA_BLOCK if arch == 'gemma3' else _BLOCK)[module]}.{kind}"


def bpe_tokenizer(vocab_size: int) -> tuple[list[str], list[str], Tokenizer]:
    """A byte-level BPE (GPT-2 style) trained locally: tokens in id order, merges, and the tokenizer itself."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=BPE_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    return tokens, merges, tok


def spm_tokens() -> list[str]:
    """A tiny SentencePiece-style vocabulary: specials, characters, then every prefix of the `▁word` pieces."""
    pieces = list(SPM_SPECIALS) + ["▁"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    for word in SPM_WORDS:
        for end in range(2, len(word) + 2):
            piece = ("▁" + word)[:end]
            if piece not in pieces:
                pieces.append(piece)
    return pieces


def llama3_rope_factors(params: dict, head_dim: int) -> np.ndarray:
    """llama.cpp's `rope_freqs` tensor for Llama-3 rope scaling (one divisor per rotary frequency)."""
    inv = 1.0 / params["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    orig, low, high = params["original_max_position_embeddings"], params["low_freq_factor"], params["high_freq_factor"]
    factors = []
    for freq in inv:
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            factors.append(1.0)
        elif wavelen > orig / low:
            factors.append(params["factor"])
        else:
            smooth = (orig / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / params["factor"] + smooth))
    return np.asarray(factors, np.float32)


def permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: per head, interleave the two rotary halves of the rows."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_k_blocks(rows: int, cols: int, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """Random Q4_K / Q6_K blocks with small super-block scales (gguf has no quantizer for K types)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    if qtype == Q.Q4_K:  # d and dmin (f16) open the block
        data[..., 0:4] = np.frombuffer(np.array([1e-3, 1e-3], np.float16).tobytes(), np.uint8)
    elif qtype == Q.Q6_K:  # d (f16) closes it
        data[..., size - 2:] = np.frombuffer(np.array([2e-4], np.float16).tobytes(), np.uint8)
    else:
        raise ValueError(f"no random blocks for {qtype.name}")
    return data.reshape(rows, -1)


def reference_dequant(data: np.ndarray, qtype: Q, shape: tuple[int, ...]) -> np.ndarray:
    """Dequantizes with transformers' torch kernels where they cover the type, else with the gguf package."""
    if int(qtype) in torch_dequant.GGML_BLOCK:
        out = torch_dequant.dequantize(torch.from_numpy(np.ascontiguousarray(data)), int(qtype), torch.float32)
        return out.numpy().reshape(shape)
    return gguf.quants.dequantize(data, qtype).astype(np.float32).reshape(shape)


def tiny_model(kind: str, vocab_size: int, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny random model of `kind` with a given vocabulary size (llama, qwen2, qwen3 from hf_fixtures; gemma3
    with settings a GGUF can state: query scale from head_dim, per-layer window flags)."""
    torch.manual_seed(seed)
    if kind == "gemma3":
        config = transformers.Gemma3TextConfig(
            **{**F.TINY, "vocab_size": vocab_size, **overrides}, head_dim=16, query_pre_attn_scalar=16, sliding_window=5,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1e6),
                             "sliding_attention": dict(rope_type="default", rope_theta=1e4)},
            bos_token_id=2, eos_token_id=1, pad_token_id=0)
        model = transformers.Gemma3ForCausalLM(config)
    else:
        config = F.CONFIGS[kind]()
        config.vocab_size = vocab_size
        for key, value in overrides.items():
            setattr(config, key, value)
        config.bos_token_id, config.eos_token_id, config.pad_token_id = 1, 2, 0
        model = F.MODEL_CLASSES[kind](config)
    model = model.float().eval()
    F.randomize_(model, seed)
    return model


def write_gguf(kind: str, path: Path, *, quant: dict[str, Q] | None = None, chat_template: str | None = CHATML,
               seed: int = 0, **overrides) -> tuple[torch.nn.Module, dict[str, np.ndarray], Tokenizer | None]:
    """Writes a tiny GGUF file of `kind` (llama, qwen2, qwen3, gemma3) and returns the torch model with the
    weights the file really holds (after quantization), those weights by HF name, and the BPE tokenizer.

    `quant` maps a full GGUF tensor name or a block suffix (`ffn_down.weight`) to its type; Q4_K / Q6_K
    tensors get random blocks. `overrides` change the tiny config (e.g. intermediate_size=256 for K blocks).
    """
    arch = ARCH[kind.split("_")[0]]
    quant = quant or {}
    if arch == "gemma3":
        tokens, merges, bpe = spm_tokens(), None, None
    else:
        tokens, merges, bpe = bpe_tokenizer(300)
    model = tiny_model(kind, len(tokens), seed, **overrides)
    rng = np.random.default_rng(seed)
    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rope = c.rope_parameters["full_attention"] if arch == "gemma3" else c.rope_parameters
    w.add_rope_freq_base(rope["rope_theta"])
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
        w.add_vocab_size(c.vocab_size)
    if arch in ("qwen3", "gemma3"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if arch == "gemma3":
        w.add_sliding_window(c.sliding_window)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in c.layer_types])
    if arch == "gemma3":
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores([0.0] * len(tokens))
        w.add_token_types([3 if t in SPM_SPECIALS else 1 for t in tokens])
        w.add_bos_token_id(2), w.add_eos_token_id(1), w.add_unk_token_id(3), w.add_pad_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_space_prefix(False)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2" if arch.startswith("qwen") else "default")  # as llama.cpp names them
        w.add_token_list(tokens)
        w.add_token_types([3 if t in BPE_SPECIALS else 1 for t in tokens])
        w.add_token_merges(merges)
        w.add_bos_token_id(1), w.add_eos_token_id(2), w.add_pad_token_id(0)
        w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    expected: dict[str, np.ndarray] = {}
    state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    if c.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    for hf_name, value in state.items():
        name = gguf_name(hf_name, arch)
        stored = value
        if arch == "gemma3" and name.endswith("norm.weight"):
            stored = (value + np.float32(1.0)).astype(np.float32)
            value = stored - np.float32(1.0)  # what a converter can give back in float32
        qtype = quant.get(name, quant.get(name.split(".", 2)[-1] if name.startswith("blk.") else name, Q.F32))
        if value.ndim == 1:
            qtype = Q.F32  # llama.cpp keeps 1-D tensors (norms, biases) in F32
        if qtype in (Q.Q4_K, Q.Q6_K):
            data = random_k_blocks(*value.shape, qtype, rng)
            value = reference_dequant(data, qtype, value.shape)
        elif qtype != Q.F32:
            data = gguf.quants.quantize(stored, qtype)
            value = reference_dequant(data, qtype, value.shape)  # rows are whole blocks: permuting commutes
        else:
            data = stored
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = c.num_attention_heads if "attn_q" in name else c.num_key_value_heads
            data = permute_rows(data, heads)  # byte rows of quantized data permute like float rows
        w.add_tensor(name, data, raw_dtype=None if qtype == Q.F32 else qtype)
        expected[hf_name] = value
    if arch == "llama" and rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(rope, head_dim))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with torch.no_grad():  # the reference model holds what the file holds
        for name, p in model.named_parameters():
            if name in expected:
                p.copy_(torch.from_numpy(expected[name]))
    return model, expected, bpe
