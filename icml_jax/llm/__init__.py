"""LLM back ends behind one protocol (Gemini, OpenAI-compatible, local Flax model, offline), prompts, generation,
judges."""

from icml_jax.llm.gemini import GeminiBackend, GeminiConfig, read_api_key
from icml_jax.llm.generation import (
    CondenseInput,
    Condensed,
    Reply,
    ReplyInput,
    condense_turns,
    generate_replies,
    generate_reply,
)
from icml_jax.llm.local import LocalBackend
from icml_jax.llm.openai_compat import OpenAIBackend, OpenAIConfig
from icml_jax.llm.judges import JudgeResult, JudgeStats, ProxyInput, ProxyJudge, QualityInput, QualityJudge
from icml_jax.llm.jsonparse import parse_json_text
from icml_jax.llm.offline import OfflineBackend, heuristic_information_value
from icml_jax.llm.prompts import QUALITY_DIMENSIONS, Dialogue, format_dialogue
from icml_jax.llm.registry import available_backends, make_backend, register_backend
from icml_jax.llm.retry import RetryPolicy
from icml_jax.llm.types import (
    TASK_CONDENSE,
    TASK_GENERIC,
    TASK_PROXY_JUDGE,
    TASK_QUALITY_JUDGE,
    TASK_REPLY,
    BackendError,
    LLMBackend,
    LLMRequest,
    LLMResponse,
    MissingAPIKeyError,
    TokenUsage,
    UsageMeter,
)

__all__ = [
    "BackendError",
    "LocalBackend",
    "CondenseInput",
    "Condensed",
    "Dialogue",
    "GeminiBackend",
    "GeminiConfig",
    "JudgeResult",
    "JudgeStats",
    "LLMBackend",
    "LLMRequest",
    "LLMResponse",
    "MissingAPIKeyError",
    "OfflineBackend",
    "OpenAIBackend",
    "OpenAIConfig",
    "ProxyInput",
    "ProxyJudge",
    "QUALITY_DIMENSIONS",
    "QualityInput",
    "QualityJudge",
    "Reply",
    "ReplyInput",
    "RetryPolicy",
    "TASK_CONDENSE",
    "TASK_GENERIC",
    "TASK_PROXY_JUDGE",
    "TASK_QUALITY_JUDGE",
    "TASK_REPLY",
    "TokenUsage",
    "UsageMeter",
    "available_backends",
    "condense_turns",
    "format_dialogue",
    "generate_replies",
    "generate_reply",
    "heuristic_information_value",
    "make_backend",
    "parse_json_text",
    "read_api_key",
    "register_backend",
]
