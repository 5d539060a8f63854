"""Answer scoring (SQuAD / HotpotQA style) and the reward weights that combine the parts.

Every reward is a weighted sum of named components (em, f1, answered, n_bad_calls,
valid_call, new_support, bad_call); the environment reports each component separately
so that an ablation that zeroes a weight still logs what the agent did.
"""
from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from agentr1.config import RewardConfig

# HotpotQA scores these special answers as all-or-nothing: "yes" vs "no" shares no F1.
_SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
# Lower bound of the format part of the outcome: many malformed calls cannot push the
# outcome reward below this, so rewards stay bounded whatever max_turns is.
FORMAT_FLOOR = -0.5


def normalize_answer(text: str) -> str:
    """Unicode NFKC (full-width letters and digits, ligatures and compatibility forms as their
    plain characters), then SQuAD's: lower-case, drop punctuation and the articles a/an/the,
    collapse whitespace."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _best(prediction: str | None, answers: Sequence[str], score) -> float:
    """The best ``score`` of the prediction against a gold answer, both normalised; a gold that
    normalises to nothing (all punctuation or articles) is matched by the same text only, as
    written (spaces aside), so a prediction of junk punctuation cannot score on it."""
    if prediction is None or not answers:
        return 0.0
    pred = normalize_answer(prediction)
    best = 0.0
    for gold in answers:
        normal = normalize_answer(gold)
        best = max(best, score(pred, normal) if normal else float(prediction.strip() == gold.strip()))
    return best


def _em(pred: str, gold: str) -> float:
    return float(pred == gold)


def _f1(pred: str, gold: str) -> float:
    if (pred in _SPECIAL_ANSWERS or gold in _SPECIAL_ANSWERS) and pred != gold:
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _contains(pred: str, gold: str) -> float:
    gold_tokens, pred_tokens = gold.split(), pred.split()
    if not gold_tokens:  # a gold answer that normalises to nothing only matches nothing
        return float(not pred_tokens)
    n = len(gold_tokens)
    return float(any(pred_tokens[i: i + n] == gold_tokens for i in range(len(pred_tokens) - n + 1)))


def exact_match(prediction: str | None, answers: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer; None scores 0."""
    return _best(prediction, answers, _em)


def f1(prediction: str | None, answers: Sequence[str]) -> float:
    """Best token F1 over the gold answers (HotpotQA: yes/no/noanswer mismatches score 0)."""
    return _best(prediction, answers, _f1)


def contains(prediction: str | None, answers: Sequence[str]) -> float:
    """1.0 when a normalised gold answer appears as a token span of the normalised prediction."""
    return _best(prediction, answers, _contains)


@dataclass(frozen=True)
class AnswerScores:
    em: float = 0.0
    f1: float = 0.0
    contains: float = 0.0


def score_answer(prediction: str | None, answers: Sequence[str]) -> AnswerScores:
    """All answer metrics at once; ``prediction=None`` (no answer given) scores zero."""
    return AnswerScores(
        em=exact_match(prediction, answers),
        f1=f1(prediction, answers),
        contains=contains(prediction, answers),
    )


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the reward components. No defaults here: they are built from the validated
    config's ``reward`` section (:meth:`from_config`), the one place every default lives."""

    outcome_em: float
    """Outcome: weight of exact match of the final answer."""
    outcome_f1: float
    """Outcome: weight of token F1 of the final answer."""
    format_answer: float
    """Outcome (format): bonus when the episode ends with a well-formed <answer>."""
    format_bad_call: float
    """Outcome (format): added once per malformed turn of the episode (format part floored at FORMAT_FLOOR)."""
    process_valid_call: float
    """Process: each well-formed tool call."""
    process_new_support: float
    """Process: a call that retrieves at least one supporting doc not retrieved before (once per call)."""
    process_bad_call: float
    """Process: each malformed turn."""
    process_enabled: bool
    """Off: every process reward is 0 (components are still reported)."""
    process_call_name: float
    """Process (function calling): the call names the gold function."""
    process_call_keys: float
    """Process (function calling): the right function with exactly the allowed argument names."""
    process_call_values: float
    """Process (function calling): the right function, times the share of arguments right."""

    @classmethod
    def from_config(cls, reward: RewardConfig, **changes) -> "RewardWeights":
        """The weights of ``reward`` (``agentr1.config.RewardConfig``), with ``changes`` applied."""
        return cls(**{**reward.model_dump(), **changes})


def process_reward(valid_call: bool, new_support: bool, bad_call: bool, weights: RewardWeights) -> float:
    """The process reward of one turn (0 when process rewards are disabled)."""
    if not weights.process_enabled:
        return 0.0
    return (
        weights.process_valid_call * valid_call
        + weights.process_new_support * new_support
        + weights.process_bad_call * bad_call
    )


def format_reward(answered: bool, n_bad_calls: int, weights: RewardWeights) -> float:
    """Format part of the outcome: answer-tag bonus plus per-malformed-turn penalty, floored."""
    raw = weights.format_answer * answered + weights.format_bad_call * n_bad_calls
    return max(FORMAT_FLOOR, raw)


def outcome_reward(scores: AnswerScores, answered: bool, n_bad_calls: int, weights: RewardWeights) -> float:
    """The reward at the end of an episode: correctness of the answer plus its format part."""
    correctness = weights.outcome_em * scores.em + weights.outcome_f1 * scores.f1
    return correctness + format_reward(answered, n_bad_calls, weights)
