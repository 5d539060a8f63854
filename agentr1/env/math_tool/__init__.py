"""The ``math_tool`` environment kind: arithmetic word problems solved with a calculator tool.

``calculator`` is the tool (safe arithmetic, the one number format), ``convert`` reads SVAMP,
MAWPS + ASDiv-A and GSM8K into records with their gold solutions as calls, ``env`` is the
environment (numeric answers, a process reward for a gold step's value, the tool-call rate).
This module declares the kind, its tool, its converters and its rules for the registry
(``agentr1.env.registry``); it imports nothing heavy.
"""
from agentr1.env.kind import GOLD_CALLS_RULE, EnvKind, RecordRule, ToolEntry, gold_values_problems

KIND = EnvKind("math_tool", "agentr1.env.math_tool.env:build", ("calculate",),
               description="arithmetic word problems with the calculate tool, answered with a number",
               record_rules=(GOLD_CALLS_RULE,
                             RecordRule("gold_values", "a record lists its solution's step values (gold_values, "
                                        "strings), what the process reward looks for in results", "gold_values",
                                        gold_values_problems, ("train", "dev", "test"))),
               converters={"svamp": "agentr1.env.math_tool.convert:convert_svamp",
                           "mawps": "agentr1.env.math_tool.convert:convert_mawps",
                           "gsm8k": "agentr1.env.math_tool.convert:convert_gsm8k"})
TOOLS = (ToolEntry("calculate", "agentr1.env.math_tool.calculator:calculate"),)
