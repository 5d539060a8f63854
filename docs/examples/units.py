"""Add a tool: a length-unit converter, the task that needs it, and its demonstrations.

Trained end to end by `agentr1 train --config conf/units.yaml` (docs/add-a-tool.md); nothing in
agentr1/ knows about it. The config loads this file (`plugins: [docs/examples/units.py]`), so the
tool and the environment below are registered before `env.kind: units` is checked.
"""
from __future__ import annotations

import random

from agentr1.data.records import Document, QARecord
from agentr1.env.base import build_tool_env
from agentr1.env.registry import register_environment, register_tool
from agentr1.env.tools import ToolError

METRES = {"km": 1000.0, "m": 1.0, "cm": 0.01, "mm": 0.001, "mi": 1609.344, "yd": 0.9144, "ft": 0.3048}


@register_tool
def convert(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a length from one unit to another.

    Args:
        value: The length to convert.
        from_unit: The unit it is given in (choices: ["km", "m", "cm", "mm", "mi", "yd", "ft"])
        to_unit: The unit wanted (choices: ["km", "m", "cm", "mm", "mi", "yd", "ft"])
    """
    if abs(value) > 1e12:
        raise ToolError("value too large")  # the model reads this; any other exception shows its type only
    return f"{value * METRES[from_unit] / METRES[to_unit]:.4g} {to_unit}"


def make_data(cfg) -> tuple[dict[str, list[QARecord]], list[Document]]:
    """Questions with fresh numbers (nothing to memorise), each with its gold call: the warm-up's
    demonstrator makes that call, then answers with the number the tool returned."""
    rng = random.Random(cfg.data.synth.seed)

    def record(split: str, i: int) -> QARecord:
        value, (a, b) = rng.randint(1, 999), rng.sample(sorted(METRES), 2)
        answer = convert(value, a, b).split()[0]
        call = {"name": "convert", "arguments": {"value": value, "from_unit": a, "to_unit": b}}
        return QARecord(id=f"units-{split}-{i}", question=f"How many {b} is {value} {a}?", answers=(answer,),
                        supporting_docs=(), hops=1, source="units", meta={"calls": [call]})

    s = cfg.data.synth
    splits = {name: [record(name, i) for i in range(n)]
              for name, n in (("train", s.n_train), ("dev", s.n_dev), ("test", s.n_test))}
    # The dataset format has a corpus (the search tool's); here it only names the units.
    corpus = [Document(u, u, f"1 {u} is {m:g} metres.") for u, m in METRES.items()]
    return splits, corpus


register_environment("units", build_tool_env, tools=["convert"], synth=make_data,
                     description="length-unit conversion with the convert tool")
