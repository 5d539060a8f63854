"""The hostile harness over every environment kind: 10,000 generated policy turns each (junk,
near-miss and valid calls of the kind's own tools, escapes, special tokens, deep JSON, 100 kB
strings) through the kind's environment as training builds it (registry, sandboxed tools, its
own data), never raise; every observation encodes, every reward is finite, and the data
directory is byte for byte as it was. (tests/test_faults_turns.py goes deeper on the search
kind: 100,000 turns, the engine and the rollout table.)"""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from test_faults_turns import TurnGenerator
from test_sandbox import _sha_tree

from agentr1.config import load_config
from agentr1.data.records import load_split
from agentr1.env.registry import build_env, environment_kinds, load_plugins, resolve
from agentr1.recipe.workspace import ensure_data

ROOT = Path(__file__).resolve().parents[1]
TURNS = 10_000
POOL = 250
SMALL = ["data.synth.n_train=40", "data.synth.n_dev=4", "data.synth.n_test=4"]
# A kind, the preset that trains it and what makes its data small here.
KINDS = {
    "qa": ("quick", SMALL),
    "sql": ("sql", SMALL),
    "mixed": ("quick", [*SMALL, "env.kind=mixed"]),
    "units": ("units", SMALL),
    "function_call": ("bfcl-smollm2", []),
    "math_tool": ("calculator-smollm2", []),
}


def test_every_registered_kind_is_fuzzed():
    load_plugins([str(ROOT / "docs" / "examples" / "units.py")])
    # "tools" is the generic kind a plug-in builds on: the units kind fuzzes it with its tool
    assert set(environment_kinds()) - {"tools"} <= set(KINDS), "a kind without a hostile harness: add it to KINDS"


def _call(rng: random.Random, tool: dict, gen: TurnGenerator) -> str:
    """A call of one of the kind's own tools, its arguments right in name and junk in value."""
    props = tool["function"].get("parameters", {}).get("properties", {})
    values = [gen.junk(rng), rng.randint(-10**9, 10**9), 1e308, None, [], {"a": [1]}, True, "1 + 1",
              "SELECT * FROM people", "(" * 200, "9 ** 9 ** 9", gen.chars(rng, 2000)]
    args = {k: rng.choice(values) for k in props}
    return f"<tool_call>{json.dumps({'name': tool['function']['name'], 'arguments': args})}</tool_call>"


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_ten_thousand_hostile_turns_through_each_environment_kind(kind, tmp_path, monkeypatch):
    preset, extra = KINDS[kind]
    cfg = load_config(ROOT / "conf" / f"{preset}.yaml", [f"data.dir={tmp_path / 'data'}", *extra])
    for source in cfg.data.sources:
        if source.input and not (ROOT / source.input).exists():
            pytest.skip(f"{source.input}: the shared real data is not on this machine")
    monkeypatch.chdir(ROOT)  # the presets' relative inputs and plug-ins are the repository's
    load_plugins(cfg.plugins)
    cfg = resolve(cfg)
    data = ensure_data(cfg)
    before = _sha_tree(data)
    env = build_env(cfg, data)
    records = load_split(data, "train")
    # function_call's tools are each record's own functions (BFCL's documents)
    tools = env.tools or [{"function": f} for r in records for f in r.meta.get("functions", [])]
    names = sorted({t["function"]["name"] for t in tools}) or ["tool"]
    gen, rng = TurnGenerator(raw=True, names=names), random.Random(11)
    states = [env.reset(records[i % len(records)]) for i in range(POOL)]
    turns, errors, calls = 0, 0, 0
    while turns < TURNS:
        texts = [_call(rng, rng.choice(tools), gen) if tools and rng.random() < 0.25 else gen.turn(rng)
                 for _ in states]
        calls += sum(t.startswith("<tool_call>") for t in texts)
        for res in env.step_batch(states, texts):
            for value in (res.outcome_reward, res.process_reward):
                assert math.isfinite(value), (kind, res)
            if res.observation is not None:
                res.observation.encode("utf-8")  # raises on a lone surrogate
                errors += res.observation.startswith("Error")
        turns += len(states)
        states = [s if not s.done else env.reset(records[rng.randrange(len(records))]) for s in states]
    for s in states:
        metrics = env.episode_metrics(s)
        assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert _sha_tree(data) == before
    assert errors > 0.1 * turns and calls > 0.2 * turns, (errors, calls)
    print(f"\n{kind}: {turns} turns, {calls} calls, {errors} error observations")
