"""The ``sql`` environment kind: the synthetic world's questions over an SQLite database.

``tool`` is the read-only ``sql`` tool and its database rules, ``env`` the environment (the
scripted expert writes one query per hop; a process reward for a result that holds a hop's
value), ``synth`` the generator (the ``qa`` world's questions, its facts as tables). This
module declares the kind for the registry (``agentr1.env.registry``) and imports nothing heavy.
"""
from agentr1.env.kind import GOLD_CALLS_RULE, EnvKind, RecordRule, ToolEntry, gold_values_problems


def chain_or_calls(row: dict) -> int:
    """A record's problems when it has neither a generated hop chain nor well-formed gold calls."""
    return int(not row.get("chain") and GOLD_CALLS_RULE.problems(row) > 0)


KIND = EnvKind("sql", "agentr1.env.sql.env:build", ("sql",), "agentr1.env.sql.synth:generate_from_config",
               "question answering over an SQLite database with the sql tool",
               (RecordRule("demonstrable", "a train record has a generated hop chain (meta.chain) or gold calls "
                           "(meta.calls), so the warm-up can demonstrate it", "calls", chain_or_calls),
                RecordRule("gold_values", "a record lists each hop's value (gold_values, strings), what the "
                           "process reward looks for in query results", "gold_values", gold_values_problems,
                           ("train", "dev", "test"))))
TOOLS = (ToolEntry("sql", "agentr1.env.sql.tool:sql_tool", factory=True),)
