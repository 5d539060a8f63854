"""The ``function_call`` environment kind: function calling judged by BFCL's own checker.

``bfcl`` reads BFCL's questions and possible answers (the ``bfcl-eval`` package) into records,
imports the official AST checker and decomposes a call's score; ``env`` is the environment
(a record's functions in its system turn, one call per episode). The registry
(``agentr1.env.registry``) names the kind, its builder, its converter (``--format bfcl``) and
its record rules.
"""
