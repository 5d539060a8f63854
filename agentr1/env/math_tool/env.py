"""The ``math_tool`` environment: an arithmetic word problem, a calculator, a number as the answer.

The tool-use environment of :class:`agentr1.env.base.ToolEnv` with the ``calculate`` tool
(:mod:`~agentr1.env.math_tool.calculator`) and two differences: an answer is scored as a number
(:func:`number_scores`: the last number in the ``<answer>``, the same as the gold within
:data:`~agentr1.env.math_tool.convert.REL_TOLERANCE` of it), and a call earns
``process_new_support`` when its result is one of the gold solution's step values not returned
earlier in the episode (``meta.gold_values``). ``called`` (an episode made at least one
well-formed call) is reported beside the usual metrics, so a policy that stops calling the tool
and guesses shows as a falling tool-call rate (FIELD-NOTES item 9).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from agentr1.data.records import QARecord
from agentr1.env.base import EnvSettings, EpisodeState, ToolEnv
from agentr1.env.math_tool.convert import same_number
from agentr1.env.rewards import AnswerScores, RewardWeights
from agentr1.env.tools import Tool

SYSTEM_PROMPT = (
    "Solve the math word problem. Use the calculate tool for each arithmetic step: write "
    '<tool_call>{"name": "calculate", "arguments": {"expression": "..."}}</tool_call> and read the '
    "result. When you know the answer, write the number as <answer>...</answer>."
)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def parse_number(text: str | None) -> float | None:
    """The last number written in ``text`` (thousands separators and a leading ``$`` allowed:
    ``$1,200.50`` is 1200.5), or None."""
    if not text:
        return None
    found = _NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None


def number_scores(answer: str | None, golds: Sequence[str]) -> AnswerScores:
    """1 for em, f1 and contains when the answer's last number is a gold number, else 0."""
    value = parse_number(answer)
    hit = value is not None and any(same_number(value, g) for g in (parse_number(x) for x in golds) if g is not None)
    return AnswerScores(float(hit), float(hit), float(hit))


class MathToolEnv(ToolEnv):
    """See the module docstring."""

    kind = "math_tool"
    default_system_prompt = SYSTEM_PROMPT
    extra_metrics = ("called",)

    def score(self, answer: str | None, record: QARecord) -> AnswerScores:
        return number_scores(answer, record.answers)

    def gold_keys(self, record: QARecord) -> tuple[str, ...]:
        return tuple(record.meta.get("gold_values") or ())

    def episode_metrics(self, state: EpisodeState) -> dict[str, float]:
        return {**super().episode_metrics(state), "called": float(state.n_calls > 0)}


def build(cfg, data_dir: Path, tools: Sequence[Tool]) -> MathToolEnv:
    """The ``math_tool`` environment: the ``calculate`` tool and any others of ``env.tools``."""
    return MathToolEnv(tools, EnvSettings.from_config(cfg.env), RewardWeights.from_config(cfg.reward))
