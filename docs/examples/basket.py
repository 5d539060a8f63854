"""A third plug-in, with a longer horizon: the price of a basket of three items, five tool calls.

`price_of(item)` reads the price list this plug-in's generator writes beside the records
(`prices.json`); `add(a, b)` adds two amounts. A question names three items; the gold episode
looks each price up, adds the first two, adds the third to that sum and answers the total: five
calls, every number copied from an earlier tool answer into a later call, so one mis-copied digit
anywhere spoils the answer (the shop's failure, three times as many chances). A task of the suite
(conf/suite/default.yaml); `agentr1 train --config conf/basket.yaml` trains it alone.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from agentr1.data.records import Document, QARecord
from agentr1.env.base import build_tool_env
from agentr1.env.registry import register_environment, register_tool
from agentr1.env.tools import ToolError

PRICES = "prices.json"
ITEMS = ["apple", "bread", "cheese", "eggs", "flour", "grapes", "honey", "jam", "kale", "lemon", "milk", "nuts",
         "oats", "pasta", "rice", "salt", "tea", "tofu", "yogurt", "butter"]
BASKET = 3


class PriceOf:
    """The price of a grocery item, from the dataset's ``prices.json`` (item -> price), read once."""

    name = "price_of"

    def __init__(self, data_dir: Path):
        self.prices = json.loads((Path(data_dir) / PRICES).read_text())

    def __call__(self, item: str) -> str:
        """Look up the price of one grocery item.

        Args:
            item: The item's name, e.g. milk.
        """
        if item not in self.prices:
            raise ToolError(f"no item {item!r} in the price list")
        return f"{self.prices[item]:.2f}"


@register_tool(factory=True, name="price_of")
def price_of(cfg, data_dir: Path) -> PriceOf:
    """The tool over the price list of ``data_dir`` (built again inside its sandbox worker)."""
    return PriceOf(data_dir)


@register_tool
def add(a: float, b: float) -> str:
    """Add two amounts of money.

    Args:
        a: The first amount.
        b: The second amount.
    """
    if not (0 <= a <= 1e6 and 0 <= b <= 1e6):
        raise ToolError("amount out of range")
    return f"{a + b:.2f}"


def make_data(cfg) -> tuple[dict[str, list[QARecord]], list[Document], dict[str, bytes]]:
    """A price list, and questions about baskets of three items whose gold calls look the three
    prices up and add them two at a time; the answer is the total."""
    rng = random.Random(cfg.data.synth.seed)
    prices = {item: round(rng.uniform(0.5, 20), 2) for item in ITEMS}

    def record(split: str, i: int) -> QARecord:
        items = rng.sample(ITEMS, BASKET)
        calls = [{"name": "price_of", "arguments": {"item": item}} for item in items]
        total = f"{prices[items[0]]:.2f}"
        for item in items[1:]:
            calls.append({"name": "add", "arguments": {"a": float(total), "b": prices[item]}})
            total = add(float(total), prices[item])
        question = f"What do the {items[0]}, the {items[1]} and the {items[2]} cost together?"
        return QARecord(id=f"basket-{split}-{i}", question=question, answers=(total,), supporting_docs=(),
                        hops=BASKET, source="basket", meta={"calls": calls})

    s = cfg.data.synth
    splits = {name: [record(name, i) for i in range(n)]
              for name, n in (("train", s.n_train), ("dev", s.n_dev), ("test", s.n_test))}
    corpus = [Document(item, item, f"The grocer sells {item}.") for item in ITEMS]
    return splits, corpus, {PRICES: json.dumps(prices, indent=1).encode()}


register_environment("basket", build_tool_env, tools=["price_of", "add"], synth=make_data,
                     description="a grocery basket: look three prices up, add them two at a time, answer the total")
