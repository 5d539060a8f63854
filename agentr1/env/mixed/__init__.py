"""The ``mixed`` environment kind: questions whose hops need the search tool or the sql tool.

``env`` is the environment (the ``qa`` kind's search beside the ``sql`` kind's database in one
episode; the scripted expert picks each hop's tool), ``synth`` the generator (films and
companies as documents, people and cities as tables). This module declares the kind for the
registry (``agentr1.env.registry``) and imports nothing heavy.
"""
from agentr1.env.kind import EnvKind, RecordRule
from agentr1.env.sql import chain_or_calls

KIND = EnvKind("mixed", "agentr1.env.mixed.env:build", ("sql",), "agentr1.env.mixed.synth:generate_from_config",
               "questions whose hops need the search tool (films, companies) or the sql tool (people, "
               "cities) in one episode",
               (RecordRule("demonstrable", "a train record has a hop chain naming each hop's tool (meta.chain) "
                           "or gold calls (meta.calls)", "calls", chain_or_calls),))
