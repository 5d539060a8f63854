"""The function_call environment kind: BFCL's data into records, BFCL's own checker as the judge,
the decomposed parts as process rewards, episodes, the converter's errors, and the served agent's
plumbing (a question's functions into its prompt, the call out)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from agentr1.config import DataSource, load_config
from agentr1.data.generated import dataset_kind
from agentr1.data.records import DataError, load_dataset
from agentr1.env.function_call import bfcl
from agentr1.env.function_call.env import FunctionCallEnv
from agentr1.env.base import EnvSettings
from agentr1.env.rewards import RewardWeights

pytest.importorskip("bfcl_eval", reason="bfcl-eval is installed by make setup (pip install --no-deps bfcl-eval)")

UNSOLVABLE = {"live_simple_106-63-0", "live_simple_112-68-0", "live_multiple_862-181-3", "live_multiple_964-207-0"}
"""BFCL entries whose possible answer no call can pass (a required argument with no accepted value,
a gold argument the function does not have): the same for every model."""
CONFIG = "conf/bfcl-smollm2.yaml"


@pytest.fixture(scope="module")
def records() -> dict[str, list]:
    root = bfcl.data_root()
    return {c: [r for _, _, r in bfcl.read_category(root, c)] for c in bfcl.CATEGORIES}


def _env(**reward) -> FunctionCallEnv:
    cfg = load_config(CONFIG, [f"reward.{k}={v}" for k, v in reward.items()])
    return FunctionCallEnv(EnvSettings.from_config(cfg.env), RewardWeights.from_config(cfg.reward))


def _official(record, name: str, arguments: dict) -> bool:
    checker = bfcl.official_checker()
    from bfcl_eval.constants.enums import Language

    meta = record.meta
    return bool(checker.ast_checker(meta["functions"], [{name: arguments}], meta["ground_truth"], Language.PYTHON,
                                    meta["category"], bfcl.CHECKER_MODEL)["valid"])


def test_the_categories_have_their_published_sizes_and_every_gold_call_passes_the_official_checker(records):
    assert {c: len(rs) for c, rs in records.items()} == {"simple_python": 400, "live_simple": 258, "multiple": 200,
                                                        "live_multiple": 1053}
    rejected = set()
    for category, rs in records.items():
        for r in rs:
            call = r.meta["calls"][0]
            verdict = bfcl.judge(r.meta["functions"], r.meta["ground_truth"], category, call["name"], call["arguments"])
            assert verdict.valid == _official(r, call["name"], call["arguments"])
            if not verdict.valid:
                rejected.add(r.id)
    assert rejected == UNSOLVABLE


def _perturbations(record) -> list[tuple[str, str, dict]]:
    """Wrong calls made from the gold one: another name, a required argument dropped, an argument
    added, each gold value replaced by one of another type or another value."""
    call = record.meta["calls"][0]
    name, args = call["name"], call["arguments"]
    out = [("name", name + "_x", args), ("extra", name, {**args, "zz_unexpected": 1})]
    required = record.meta["functions"][0]["parameters"].get("required", [])
    if required and required[0] in args:
        out.append(("missing", name, {k: v for k, v in args.items() if k != required[0]}))
    for key, value in args.items():
        wrong = value + 1 if isinstance(value, (int, float)) and not isinstance(value, bool) else \
            value + " and more" if isinstance(value, str) else [] if isinstance(value, list) else 12345
        out.append((f"value:{key}", name, {**args, key: wrong}))
    return out


def test_the_scorer_agrees_with_the_official_checker_on_perturbed_calls_and_decomposes_them(records):
    """Every test-category record: the verdict is the official checker's, a wrong name scores no
    part, and a call that only drops or adds an argument keeps the right name."""
    n = 0
    for category in ("simple_python", "live_simple"):
        for r in records[category]:
            if r.id in UNSOLVABLE:
                continue
            for what, name, args in _perturbations(r):
                v = bfcl.judge(r.meta["functions"], r.meta["ground_truth"], category, name, args)
                assert v.valid == _official(r, name, args), (r.id, what)
                n += 1
                if what == "name":
                    assert (v.valid, v.name, v.keys, v.values) == (False, False, False, 0.0)
                elif what in ("extra", "missing"):
                    assert not v.valid and v.name and not v.keys, (r.id, what)
                elif not v.valid:
                    assert v.name and v.values < 1.0, (r.id, what)
                assert 0.0 <= v.partial <= 1.0
    assert n > 2000


def test_hostile_arguments_are_a_wrong_call_never_an_exception(records):
    r = records["simple_python"][0]
    name = r.meta["calls"][0]["name"]
    deep: object = 1
    for _ in range(200):
        deep = [deep]
    for args in ({"base": deep}, {"base": {"x": {"y": []}}}, {"base": "1" * 10_000}, {"base": None},
                 {"base": float("inf")}, {"": 1}, {"base": [{"a": 1}], "height": {"b": [1, 2]}}):
        v = bfcl.judge(r.meta["functions"], r.meta["ground_truth"], "simple_python", name, args)
        assert not v.valid


def test_an_episode_ends_with_the_call_its_reward_is_the_verdict_plus_the_parts(records):
    env = _env()
    w = env.weights
    r = records["simple_python"][0]
    call = r.meta["calls"][0]
    text = f"<tool_call>{json.dumps(call)}</tool_call>"
    state = env.reset(r)
    res = env.step(state, text)
    assert res.done and state.end_reason == "call" and res.observation is None
    assert res.outcome_reward == pytest.approx(w.outcome_em + w.format_answer)
    assert res.process_reward == pytest.approx(w.process_valid_call + w.process_call_name + w.process_call_keys
                                               + w.process_call_values)
    m = env.episode_metrics(state)
    assert m["em"] == m["f1"] == m["answered"] == m["format_ok"] == m["call_name"] == 1.0
    # a malformed turn: the parser's error, another try, then a wrong value
    state = env.reset(r)
    first = env.step(state, "<tool_call>{not json</tool_call>")
    assert not first.done and first.observation.startswith("Error:") and first.process_reward == w.process_bad_call
    wrong = {**call, "arguments": {**call["arguments"], "base": 11}}
    res = env.step(state, f"<tool_call>{json.dumps(wrong)}</tool_call>")
    assert res.done and env.episode_metrics(state)["em"] == 0.0 and 0 < env.episode_metrics(state)["call_values"] < 1
    assert res.outcome_reward == pytest.approx(w.format_answer + w.format_bad_call)
    # prose instead of a call: done, nothing earned
    state = env.reset(r)
    res = env.step(state, "<answer>The area is 25.</answer>")
    assert res.done and state.end_reason == "answer" and env.episode_metrics(state)["answered"] == 0.0


def test_the_system_turn_lists_the_records_functions_after_its_own_system_message(records):
    env = _env()
    with_system = next(r for r in records["live_simple"] if "system" in r.meta)
    turn = env.system_turn(with_system)
    assert turn.startswith(with_system.meta["system"]) and "<tools>" in turn
    for f in with_system.meta["functions"]:
        assert json.dumps(f["name"]) in turn and bfcl.PYTHON_HINT in turn
    assert env.user_prompt(with_system) == with_system.question


def test_gold_only_variants_keep_their_question_and_go_to_its_split(records):
    from agentr1.env.datasets import convert_sources

    sources = [DataSource(format="bfcl", categories=["multiple"], split="train", dev_fraction=0.3),
               DataSource(format="bfcl", categories=["multiple"], split="train", dev_fraction=0.3, functions="gold")]
    converted = convert_sources(sources)
    where = {r.id: s for s, rs in converted.splits.items() for r in rs}
    variants = [i for i in where if i.endswith(":gold")]
    assert len(variants) == 200 and all(where[v] == where[v.removesuffix(":gold")] for v in variants)
    one = next(r for rs in converted.splits.values() for r in rs if r.id.endswith(":gold"))
    assert len(one.meta["functions"]) == 1 and one.hops == 1 and one.meta["category"] == "simple_python"
    call = one.meta["calls"][0]
    assert bfcl.judge(one.meta["functions"], one.meta["ground_truth"], one.meta["category"], call["name"],
                      call["arguments"]).valid


def test_cli_converts_bfcl_and_validate_reads_the_kind_it_records(tmp_path, capsys):
    from cli.main import main

    out = tmp_path / "bfcl"
    assert main(["data", "convert", "--format", "bfcl", "--category", "simple_python", "--out", str(out),
                 "--split", "test"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["kind"] == "function_call" and summary["splits"] == {"test": 400}
    assert dataset_kind(out) == "function_call"
    assert main(["data", "validate", "--data", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "function_call"
    assert main(["data", "validate", "--data", str(out), "--kind", "qa"]) == 2
    assert "converted for env.kind 'function_call'" in capsys.readouterr().err
    splits, corpus = load_dataset(out)
    assert len(splits["test"]) == 400 and corpus


def _bfcl_dir(tmp_path: Path, entry: dict, answer: dict) -> Path:
    root = tmp_path / "bfcl-data"
    (root / "possible_answer").mkdir(parents=True)
    (root / "BFCL_v4_simple_python.json").write_text(json.dumps(entry) + "\n")
    (root / "possible_answer" / "BFCL_v4_simple_python.json").write_text(json.dumps(answer) + "\n")
    return root


@pytest.mark.parametrize("field, change", [
    ("question", lambda e, a: e.update(question=[[{"role": "assistant", "content": "x"}]])),
    ("function", lambda e, a: e.update(function=[{"description": "no name"}])),
    ("ground_truth", lambda e, a: a.update(ground_truth=[{"f": {}}, {"g": {}}])),
    ("ground_truth", lambda e, a: a.update(ground_truth=[{"not_offered": {}}])),
    ("id", lambda e, a: a.update(id="another")),
])
def test_a_bad_bfcl_row_names_the_file_line_and_field(tmp_path, records, field, change):
    r = records["simple_python"][0]
    entry = {"id": r.id, "question": [[{"role": "user", "content": r.question}]], "function": r.meta["functions"]}
    answer = {"id": r.id, "ground_truth": r.meta["ground_truth"]}
    entry, answer = copy.deepcopy(entry), copy.deepcopy(answer)
    change(entry, answer)
    root = _bfcl_dir(tmp_path, entry, answer)
    with pytest.raises(DataError) as err:
        bfcl.convert(DataSource(format="bfcl", input=str(root), categories=["simple_python"], split="test"))
    assert err.value.line == 1 and err.value.field == field and err.value.path.endswith("simple_python.json")


def test_a_run_refuses_data_converted_for_another_kind(tmp_path):
    from agentr1.config import ConfigError
    from agentr1.env.datasets import convert_to_dataset
    from agentr1.recipe.workspace import Workspace

    convert_to_dataset(DataSource(format="bfcl", categories=["simple_python"], split="test"), tmp_path / "d")
    with pytest.raises(ConfigError, match="converted for env.kind 'function_call'"):
        Workspace.build(load_config("conf/train.yaml", [f"data.dir={tmp_path / 'd'}"]))


def test_a_served_question_brings_its_functions_and_its_call_is_the_result(records):
    """The serving path without a policy: the record a served question makes, its prompt, and the
    transcript of an episode that made the call (ask, the MLflow model and the OpenAI endpoint
    all build the record with agent.question_record and read the result with agent.transcript)."""
    from agentr1.agent import check_functions, question_record, transcript
    from agentr1.episode import Trajectory

    r = records["simple_python"][0]
    openai_tools = [{"type": "function", "function": f} for f in r.meta["functions"]]
    functions = check_functions(json.dumps(openai_tools))
    assert [f["name"] for f in functions] == [f["name"] for f in r.meta["functions"]]
    record = question_record(r.question, functions=functions)
    env = _env()
    assert r.meta["functions"][0]["name"] in env.system_turn(record)
    state = env.reset(record)
    call = r.meta["calls"][0]
    text = f"<tool_call>{json.dumps(call)}</tool_call>"
    res = env.step(state, text)  # no gold: ends with the call, unjudged
    assert res.done and state.end_reason == "call" and state.call == call
    traj = Trajectory(record.id, [], [], [], 0, finish="call", turn_texts=[text])
    out = transcript(r.question, traj, env)
    assert out["tool_calls"] == [{**call, "result": None}] and out["answer"] is None and out["finish"] == "call"
    for bad in ("", "[]", "{}", "[1]", json.dumps([{"name": 3}]), "x" * 200_000):
        with pytest.raises(ValueError, match="functions"):
            check_functions(bad)
