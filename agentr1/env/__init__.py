"""The agent's world: tool-call protocol, search tool, QA environment, rewards, scripted agents.

Modules: ``protocol`` (parse/format turns), ``search`` (BM25 index), ``qa_env`` (QAEnv),
``rewards`` (answer metrics, reward weights), ``agents`` (oracle / noisy expert, run_episode).
Only the light modules are re-exported here, so ``import agentr1.env.protocol`` does not
pull in the search backend.
"""
from agentr1.env.protocol import ParsedTurn, format_answer, format_tool_call, format_tool_response, parse_turn
from agentr1.env.rewards import RewardWeights, exact_match, f1, normalize_answer

__all__ = [
    "ParsedTurn", "RewardWeights", "exact_match", "f1", "format_answer", "format_tool_call",
    "format_tool_response", "normalize_answer", "parse_turn",
]
