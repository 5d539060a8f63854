"""The ``function_call`` environment kind: function calling judged by BFCL's own checker.

``bfcl`` reads BFCL's questions and possible answers (the ``bfcl-eval`` package) into records,
imports the official AST checker and decomposes a call's score; ``env`` is the environment
(a record's functions in its system turn, one call per episode). This module
declares the kind for the registry (``agentr1.env.registry``): its builder, its converter
(``--format bfcl``) and its record rules; it imports nothing heavy.
"""
from agentr1.env.kind import GOLD_CALLS_RULE, EnvKind, RecordRule


def _bfcl_problems(row: dict) -> int:
    return sum(key not in row for key in ("functions", "ground_truth", "category"))


KIND = EnvKind("function_call", "agentr1.env.function_call.env:build",
               description="function calling: each record brings its functions, one call answers it, "
                           "judged by BFCL's checker",
               record_rules=(RecordRule("bfcl_fields", "a record carries its functions, its possible answers "
                                        "(ground_truth) and its BFCL category", "functions", _bfcl_problems,
                                        ("train", "dev", "test")),
                             GOLD_CALLS_RULE),
               converters={"bfcl": "agentr1.env.function_call.bfcl:convert"})
