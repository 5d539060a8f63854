"""The agent's world: the environment framework, and one package per built-in environment kind.

The framework: ``base`` (the Environment interface; ToolEnv, the tool-use environment),
``tools`` (typed Python callables as tools: schema, argument checks, contained failures),
``kind`` (what a kind and a tool declare), ``registry`` (environments and tools by name:
``env.kind``, ``env.tools``, plug-ins), ``datasets`` (making a dataset through a kind's
converters), ``protocol`` (parse/format turns), ``rewards`` (answer metrics, reward weights),
``agents`` (oracle / noisy expert / gold-calls demonstrators, run_episodes), ``sandbox``
(tool workers), ``mcp`` (MCP servers' tools).
The kinds, each one folder with its environment, tools, generator, converters and record rules:
``qa``, ``sql``, ``mixed``, ``function_call``, ``math_tool``.
Only the light modules are re-exported here, so ``import agentr1.env.protocol`` does not
pull in the search backend.
"""
from agentr1.env.protocol import ParsedTurn, format_answer, format_tool_call, format_tool_response, parse_turn
from agentr1.env.rewards import RewardWeights, exact_match, f1, normalize_answer

__all__ = [
    "ParsedTurn", "RewardWeights", "exact_match", "f1", "format_answer", "format_tool_call",
    "format_tool_response", "normalize_answer", "parse_turn",
]
