"""A second plug-in: a shop assistant whose tool reads a data file of its own, two tools per episode.

`lookup_price(item)` reads the catalogue that this plug-in's generator writes beside the records
(`catalogue.json`), `convert_currency(amount, from_currency, to_currency)` converts the price; the
agent copies the price from the first result into the second call and the converted amount into
its answer. `agentr1 train --config conf/shop.yaml` trains it (docs/add-a-tool.md). The catalogue
travels with the dataset (DVC), into the logged MLflow model and to the served agent: a tool
built by a factory gets the dataset's directory, or the served model's copy of its resources.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from agentr1.data.records import Document, QARecord
from agentr1.env.base import build_tool_env
from agentr1.env.registry import register_environment, register_tool
from agentr1.env.tools import ToolError

CATALOGUE = "catalogue.json"
RATES = {"USD": 1.0, "EUR": 0.9, "GBP": 0.8, "JPY": 150.0}
"""Units of each currency one US dollar buys."""
ITEMS = ["kettle", "lamp", "chair", "desk", "mug", "clock", "rug", "fan", "mirror", "shelf", "stool", "vase",
         "towel", "pillow", "blanket", "basket", "candle", "frame", "tray", "bowl"]


class LookupPrice:
    """Look up an item's price in the shop's catalogue.

    The catalogue is the dataset's ``catalogue.json`` (item -> price in USD), read once."""

    name = "lookup_price"

    def __init__(self, data_dir: Path):
        self.prices = json.loads((Path(data_dir) / CATALOGUE).read_text())

    def __call__(self, item: str) -> str:
        """Look up the price of an item in the shop's catalogue.

        Args:
            item: The item's name, e.g. kettle.
        """
        if item not in self.prices:
            raise ToolError(f"no item {item!r} in the catalogue")
        return f"{self.prices[item]:.2f} USD"


@register_tool(factory=True, name="lookup_price")
def lookup_price(cfg, data_dir: Path) -> LookupPrice:
    """The tool over the catalogue of ``data_dir`` (built again inside its sandbox worker)."""
    return LookupPrice(data_dir)


@register_tool
def convert_currency(amount: float, from_currency: str, to_currency: str) -> str:
    """Convert an amount of money from one currency to another.

    Args:
        amount: The amount to convert.
        from_currency: Its currency (choices: ["USD", "EUR", "GBP", "JPY"])
        to_currency: The currency wanted (choices: ["USD", "EUR", "GBP", "JPY"])
    """
    if not 0 <= amount <= 1e9:
        raise ToolError("amount out of range")
    return f"{amount / RATES[from_currency] * RATES[to_currency]:.2f} {to_currency}"


def make_data(cfg) -> tuple[dict[str, list[QARecord]], list[Document], dict[str, bytes]]:
    """A catalogue with fresh prices, and questions whose gold calls look an item up, then convert
    its price: the warm-up's demonstrator plays those calls and answers the converted amount."""
    rng = random.Random(cfg.data.synth.seed)
    prices = {item: round(rng.uniform(2, 400), 2) for item in ITEMS}

    def record(split: str, i: int) -> QARecord:
        item, to = rng.choice(ITEMS), rng.choice([c for c in RATES if c != "USD"])
        price = f"{prices[item]:.2f}"
        answer = convert_currency(float(price), "USD", to).split()[0]
        calls = [{"name": "lookup_price", "arguments": {"item": item}},
                 {"name": "convert_currency", "arguments": {"amount": float(price), "from_currency": "USD",
                                                            "to_currency": to}}]
        return QARecord(id=f"shop-{split}-{i}", question=f"How much is the {item} in {to}?", answers=(answer,),
                        supporting_docs=(), hops=2, source="shop", meta={"calls": calls})

    s = cfg.data.synth
    splits = {name: [record(name, i) for i in range(n)]
              for name, n in (("train", s.n_train), ("dev", s.n_dev), ("test", s.n_test))}
    corpus = [Document(item, item, f"The shop sells a {item}.") for item in ITEMS]
    return splits, corpus, {CATALOGUE: json.dumps(prices, indent=1).encode()}


register_environment("shop", build_tool_env, tools=["lookup_price", "convert_currency"], synth=make_data,
                     description="a shop assistant: look an item's price up, convert it, answer")
