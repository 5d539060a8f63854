"""The agent's world: environments, tools, the tool-call protocol, rewards, scripted agents.

Modules: ``base`` (the Environment interface; ToolEnv, the tool-use environment), ``tools``
(typed Python callables as tools: schema, argument checks, contained failures), ``registry``
(environments and tools by name: ``env.kind``, ``env.tools``, plug-ins), ``protocol``
(parse/format turns), ``search`` (BM25 index, the search tool), ``qa_env`` (QAEnv: multi-hop QA
over search), ``rewards`` (answer metrics, reward weights), ``agents`` (oracle / noisy expert /
gold-calls demonstrators, run_episodes).
Only the light modules are re-exported here, so ``import agentr1.env.protocol`` does not
pull in the search backend.
"""
from agentr1.env.protocol import ParsedTurn, format_answer, format_tool_call, format_tool_response, parse_turn
from agentr1.env.rewards import RewardWeights, exact_match, f1, normalize_answer

__all__ = [
    "ParsedTurn", "RewardWeights", "exact_match", "f1", "format_answer", "format_tool_call",
    "format_tool_response", "normalize_answer", "parse_turn",
]
