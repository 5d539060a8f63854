"""The ``qa`` environment kind: multi-hop questions answered by searching a document collection.

``env`` is the environment (QAEnv: the search tool over the run's corpus, EM/F1 answers, a
process reward for a search that finds a gold document), ``search`` the BM25 index and the
``search`` tool, ``synth`` the synthetic world and its question generator (the ``sql`` and
``mixed`` kinds draw their questions from the same world), ``convert`` HotpotQA and MuSiQue
into records, ``retrieval_eval`` the index's recall on a dataset. This module declares the kind
for the registry (``agentr1.env.registry``) and imports nothing heavy.
"""
from agentr1.env.kind import EnvKind, RecordRule, ToolEntry


def _has_chain_or_support(row: dict) -> int:
    return int(not (row.get("chain") or row.get("supporting_docs")))


KIND = EnvKind("qa", "agentr1.env.qa.env:build", (), "agentr1.env.qa.synth:generate_from_config",
               "multi-hop QA: search a document collection, then answer",
               (RecordRule("demonstrable", "a train record has a relation chain (synthetic: chain) or supporting "
                           "documents (converted data), so the warm-up can demonstrate it", "supporting_docs",
                           _has_chain_or_support),),
               {"hotpotqa": "agentr1.env.qa.convert:convert_hotpotqa",
                "musique": "agentr1.env.qa.convert:convert_musique"})
TOOLS = (ToolEntry("search", "agentr1.env.qa.search:search_tool", factory=True),)
