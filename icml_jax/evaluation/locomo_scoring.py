"""LoCoMo's scoring as pure functions (issue 49 item 2): the release's own per-category F1, the Mem0 paper's F1
and BLEU-1, evidence recall at turn and session level, the judge J's request and verdict, and the summary table.

Three scorers, never to be mixed in one column (`SCORER_LABELS` names each):

- ``locomo_f1``: LoCoMo's ``task_eval/evaluation.py`` (Maharana et al., ACL 2024). Normalisation deletes commas,
  lower-cases, deletes ASCII punctuation (so "don't" -> "dont", "rock-and-roll" -> "rockandroll": the words a / an /
  the / and are removed only after that), removes those four words and collapses whitespace; tokens are then
  Porter-stemmed (nltk) and overlap as a multiset. Category 1 splits both sides on ',' and averages the best part
  F1 over the gold parts; category 3's gold is cut at its first ';'; category 5 is 1 when the lower-cased answer
  contains "no information available" or "not mentioned".
- ``mem0_f1`` / ``bleu1``: the Mem0 paper's (arXiv 2504.19413) scorers: lower-case, '.', ',', '!', '?' become
  spaces, set overlap; BLEU-1 is nltk's ``sentence_bleu`` with weights (1, 0, 0, 0) and smoothing method 1 (here
  on those same tokens: Mem0's code tokenises BLEU with ``nltk.word_tokenize``, which needs the downloaded Punkt
  model).
- the judge J (Mem0's protocol): a CORRECT / WRONG verdict as JSON at temperature 0, generous on wording; its
  prompt is `LOCOMO_JUDGE_SYSTEM` + `LOCOMO_JUDGE_INSTRUCTION`, recorded with every J (`JUDGE_PROTOCOL`).

Evidence recall is reported over questions with evidence only (the release counts a question without any as 1).
"""

from __future__ import annotations

import functools
import json
import re
import string
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import regex  # nltk's own dependency; the release removes articles with this module's \b
from nltk.stem import PorterStemmer
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

from icml_jax.llm.jsonparse import parse_json_text
from icml_jax.llm.offline import register_offline_answers
from icml_jax.llm.prompts import DATA_NOTE, merge_metadata, quote
from icml_jax.llm.types import LLMRequest, LLMResponse

__all__ = [
    "ADVERSARIAL_PHRASES",
    "CATEGORY_NAMES",
    "JUDGE_PROTOCOL",
    "LOCOMO_JUDGE_INSTRUCTION",
    "LOCOMO_JUDGE_SCHEMA",
    "LOCOMO_JUDGE_SYSTEM",
    "SCORER_LABELS",
    "TASK_LOCOMO_JUDGE",
    "bleu1",
    "evidence_recall",
    "evidence_session_recall",
    "judge_request",
    "locomo_f1",
    "mem0_f1",
    "mem0_tokens",
    "normalize_answer",
    "parse_verdict",
    "session_number",
    "session_recall",
    "summarize",
    "token_f1",
]

# The data's `category` ids as LoCoMo's code and data use them (the Mem0 paper names them differently).
CATEGORY_NAMES: dict[int, str] = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop",
                                  5: "adversarial"}
ANSWERED_CATEGORIES = (1, 2, 3, 4)  # the overall row; category 5 is reported apart
ADVERSARIAL_PHRASES = ("no information available", "not mentioned")

SCORER_LABELS: dict[str, str] = {
    "f1": "LoCoMo F1 (release task_eval/evaluation.py: Porter-stemmed multiset overlap, per-category rules)",
    "mem0_f1": "Mem0 F1 (lower-cased, . , ! ? as spaces, set overlap, no stemming)",
    "bleu1": "Mem0 BLEU-1 (nltk sentence_bleu, weights (1, 0, 0, 0), smoothing method 1, Mem0 F1's tokens)",
    "judge": "J: LLM judge, CORRECT / WRONG (Mem0's generous protocol, prompt in JUDGE_PROTOCOL)",
}

_PUNCTUATION = str.maketrans("", "", string.punctuation)  # ASCII punctuation only, as the release
_ARTICLES = regex.compile(r"\b(?:a|an|the|and)\b")
_MEM0_SEPARATORS = str.maketrans({".": " ", ",": " ", "!": " ", "?": " "})
_DIA_ID = re.compile(r"D(\d+):(\d+)")
_STEMMER = PorterStemmer()  # rule-based: needs no downloaded corpus
_SMOOTHING = SmoothingFunction().method1


def normalize_answer(text: str | int) -> str:
    """LoCoMo's normalisation, in the release's order: commas deleted, lower case, ASCII punctuation deleted,
    the words a / an / the / and removed, whitespace collapsed."""
    text = str(text).replace(",", "").lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


@functools.lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    """nltk's Porter stem of one token (cached: the same words recur across thousands of answers)."""
    return _STEMMER.stem(word)


def _stemmed_tokens(text: str | int) -> list[str]:
    """The Porter-stemmed tokens of the normalised text."""
    return [_stem(w) for w in normalize_answer(text).split()]


def _f1(overlap: int, n_predicted: int, n_gold: int) -> float:
    """Harmonic mean of precision and recall from counts; 0 when nothing overlaps."""
    if overlap == 0:
        return 0.0
    precision, recall = overlap / n_predicted, overlap / n_gold
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, answer: str | int) -> float:
    """LoCoMo's token F1 (categories 2-4): multiset overlap of the stemmed normalised tokens."""
    predicted, gold = _stemmed_tokens(prediction), _stemmed_tokens(answer)
    overlap = sum((Counter(predicted) & Counter(gold)).values())
    return _f1(overlap, len(predicted), len(gold))


def _multi_hop_f1(prediction: str, answer: str) -> float:
    """Category 1: each comma-separated gold part takes its best F1 over the predicted parts; mean over gold."""
    parts = [p.strip() for p in prediction.split(",")]
    return float(np.mean([max(token_f1(p, g.strip()) for p in parts) for g in answer.split(",")]))


def locomo_f1(prediction: str | int, answer: str | int | None, category: int) -> float:
    """LoCoMo's own score of one answer as the release computes it per category (see the module docstring);
    `answer` may be an int (cast to text) and is not read for category 5."""
    prediction = str(prediction)
    if category == 5:
        said = prediction.lower()
        return 1.0 if any(phrase in said for phrase in ADVERSARIAL_PHRASES) else 0.0
    if category not in ANSWERED_CATEGORIES:
        raise ValueError(f"locomo_f1: category must be 1-5, got {category!r}")
    if answer is None:
        raise ValueError(f"locomo_f1: a category-{category} question needs a gold answer, got None")
    gold = str(answer)
    if category == 1:
        return _multi_hop_f1(prediction, gold)
    if category == 3:
        gold = gold.split(";")[0].strip()
    return token_f1(prediction, gold)


def mem0_tokens(text: str | int) -> list[str]:
    """The Mem0 paper's tokens: lower case, '.', ',', '!' and '?' as spaces, split on whitespace."""
    return str(text).lower().translate(_MEM0_SEPARATORS).split()


def mem0_f1(prediction: str, answer: str | int) -> float:
    """The Mem0 paper's F1: overlap of token sets (no stemming, no article removal); 0 if a side is empty."""
    predicted, gold = set(mem0_tokens(prediction)), set(mem0_tokens(answer))
    if not predicted or not gold:
        return 0.0
    return _f1(len(predicted & gold), len(predicted), len(gold))


def bleu1(prediction: str, answer: str | int) -> float:
    """The Mem0 paper's BLEU-1 (nltk sentence_bleu, unigram weights, smoothing method 1) on Mem0's tokens;
    0 if a side has none."""
    predicted, gold = mem0_tokens(prediction), mem0_tokens(answer)
    if not predicted or not gold:
        return 0.0
    with warnings.catch_warnings():  # nltk warns about zero higher-order counts that weigh nothing here
        warnings.simplefilter("ignore")
        return float(sentence_bleu([gold], predicted, weights=(1, 0, 0, 0), smoothing_function=_SMOOTHING))


def session_number(dia_id: str) -> int | None:
    """The session s of a dialogue id "D<s>:<t>", or None when the id is not of that form."""
    m = _DIA_ID.fullmatch(dia_id.strip())
    return int(m.group(1)) if m else None


def evidence_recall(evidence_ids: Sequence[str], reached_ids: Iterable[str]) -> float | None:
    """Share of the question's evidence dia_ids among those that reached the answer prompt; None without
    evidence (the release counts 1 there: we report over questions with evidence only)."""
    if not evidence_ids:
        return None
    reached = {r.strip() for r in reached_ids}
    return sum(e.strip() in reached for e in evidence_ids) / len(evidence_ids)


def session_recall(evidence_ids: Sequence[str], reached: Iterable[str | int]) -> float | None:
    """Share of the evidence ids whose session is among the sessions that reached the prompt (`reached`: dia_ids
    "D<s>:<t>", or session numbers as ints for systems that retrieve whole sessions); None without evidence."""
    if not evidence_ids:
        return None
    sessions = {r if isinstance(r, int) else session_number(r) for r in reached} - {None}
    return sum(session_number(e) in sessions for e in evidence_ids) / len(evidence_ids)


def evidence_session_recall(evidence_sessions: Sequence[int], reached_sessions: Iterable[int]) -> float | None:
    """Share of a question's evidence sessions (1-based numbers, e.g. LongMemEval's answer sessions) among the
    sessions that reached the prompt; None without any."""
    wanted = list(dict.fromkeys(evidence_sessions))
    if not wanted:
        return None
    reached = set(reached_sessions)
    return sum(s in reached for s in wanted) / len(wanted)


# The judge J.
TASK_LOCOMO_JUDGE = "locomo_judge"
LOCOMO_JUDGE_SYSTEM = ("You grade answers to questions about a long conversation between two people. You answer "
                       "in JSON only. " + DATA_NOTE)
LOCOMO_JUDGE_INSTRUCTION = (
    "Label the generated answer to the question below CORRECT or WRONG against the gold answer. The question asks "
    "about something one speaker should know about the other from their earlier conversations. The gold answer is "
    "short; the generated answer may be much longer. Be generous: it is CORRECT when it is about the same topic "
    "and states the same facts as the gold answer, whatever its wording or length. For a question about time it is "
    "CORRECT when it refers to the same date or period as the gold answer, in any format (\"7 May\", \"May 7th\", "
    "\"2023-05-07\") or as a relative reference (\"last Tuesday\") to that date. Otherwise it is WRONG. Answer with "
    'a JSON object: {"reason": one short sentence, "label": "CORRECT" or "WRONG"}.'
)
LOCOMO_JUDGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {"type": "string", "description": "one short sentence"},
        "label": {"type": "string", "enum": ["CORRECT", "WRONG"]},
    },
    "required": ["reason", "label"],
}
JUDGE_PROTOCOL: dict[str, Any] = {  # what a results file records beside every J (with the judge's model)
    "task": TASK_LOCOMO_JUDGE,
    "system": LOCOMO_JUDGE_SYSTEM,
    "instruction": LOCOMO_JUDGE_INSTRUCTION,
    "schema": LOCOMO_JUDGE_SCHEMA,
    "temperature": 0.0,
}


def judge_request(question: str, gold: str | int, prediction: str, *, max_output_tokens: int = 256,
                  metadata: Mapping[str, Any] | None = None) -> LLMRequest:
    """The judge J's request: question, gold and generated answer as quoted data, a CORRECT / WRONG verdict as
    JSON at temperature 0."""
    prompt = (f"{LOCOMO_JUDGE_INSTRUCTION}\n\nQuestion:\n{quote('question', question)}\n\n"
              f"Gold answer:\n{quote('gold', str(gold))}\n\nGenerated answer:\n{quote('answer', prediction)}")
    base = {"question": question, "gold": str(gold), "prediction": prediction}
    return LLMRequest(prompt=prompt, system=LOCOMO_JUDGE_SYSTEM, json_schema=LOCOMO_JUDGE_SCHEMA,
                      max_output_tokens=max_output_tokens, temperature=0.0, task=TASK_LOCOMO_JUDGE,
                      metadata=merge_metadata(base, metadata))


def parse_verdict(response: LLMResponse | str | None) -> bool | None:
    """True for CORRECT, False for WRONG, None for an unusable answer (no JSON object with a label of either;
    callers count those rather than scoring them wrong)."""
    if response is None:
        return None
    if isinstance(response, LLMResponse):
        value = response.parsed if response.ok_json else parse_json_text(response.text)[0]
    else:
        value = parse_json_text(response)[0]
    label = value.get("label") if isinstance(value, Mapping) else None
    if not isinstance(label, str):
        return None
    return {"CORRECT": True, "WRONG": False}.get(label.strip().upper())


def _offline_verdict(task: str, metadata: Mapping[str, Any]) -> str:
    """The offline back end's stand-in judge: CORRECT when at least half the gold's stemmed words are said."""
    gold = _stemmed_tokens(str(metadata.get("gold", "")))
    said = set(_stemmed_tokens(str(metadata.get("prediction", ""))))
    correct = bool(gold) and 2 * sum(t in said for t in gold) >= len(gold)
    return json.dumps({"reason": "offline stand-in: share of the gold answer's stemmed words in the answer",
                       "label": "CORRECT" if correct else "WRONG"})


register_offline_answers([TASK_LOCOMO_JUDGE], _offline_verdict)


# The summary table.
_MEANS = ("f1", "bleu1", "mem0_f1", "judge", "evidence_recall", "offered_recall", "session_recall", "prompt_tokens")
_LATENCIES = ("retrieval_ms", "answer_ms")


def _present(rows: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    """The row values of `key` that are not None (a missing key counts as None)."""
    return [float(r[key]) for r in rows if r.get(key) is not None]


def _group(rows: Sequence[Mapping[str, Any]], name: str) -> dict[str, Any]:
    """Means, counts and latency percentiles of one group of rows; None where nothing to average."""
    out: dict[str, Any] = {"name": name, "count": len(rows)}
    for key in _MEANS:
        values = _present(rows, key)
        out[key] = float(np.mean(values)) if values else None
    out["judged"] = len(_present(rows, "judge"))
    out["with_evidence"] = len(_present(rows, "evidence_recall"))
    for key in _LATENCIES:
        values = _present(rows, key)
        p50, p95 = (float(v) for v in np.percentile(values, [50, 95])) if values else (None, None)
        out[f"{key}_p50"], out[f"{key}_p95"] = p50, p95
    return out


def summarize(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per-category tables ("1".."4"), "overall" (every question of categories 1-4, i.e. count-weighted) and "5"
    apart, from per-question rows (category, f1, bleu1, mem0_f1, judge, evidence_recall, offered_recall,
    session_recall, prompt_tokens, retrieval_ms, answer_ms)."""
    by_category: dict[int, list[Mapping[str, Any]]] = {c: [] for c in CATEGORY_NAMES}
    for row in rows:
        category = row.get("category")
        if category not in by_category:
            raise ValueError(f"summarize: a row's category must be 1-5, got {category!r}")
        by_category[category].append(row)
    table = {str(c): _group(by_category[c], CATEGORY_NAMES[c]) for c in ANSWERED_CATEGORIES}
    table["overall"] = _group([r for c in ANSWERED_CATEGORIES for r in by_category[c]], "overall (1-4)")
    table["5"] = _group(by_category[5], CATEGORY_NAMES[5])
    return table
