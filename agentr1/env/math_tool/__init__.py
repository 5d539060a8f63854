"""The ``math_tool`` environment kind: arithmetic word problems solved with a calculator tool.

``calculator`` is the tool (safe arithmetic, the one number format), ``convert`` reads SVAMP,
MAWPS + ASDiv-A and GSM8K into records with their gold solutions as calls, ``env`` is the
environment (numeric answers, a process reward for a gold step's value, the tool-call rate).
The registry (``agentr1.env.registry``) names the kind, its tool, its converters and its rules.
"""
