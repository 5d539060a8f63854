"""The math_tool environment kind: the safe calculator, the word-problem converters (SVAMP, MAWPS +
ASDiv-A, GSM8K) and their errors, numeric scoring, the gold-step process reward and the tool-call
rate."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from agentr1.config import DataSource, load_config
from agentr1.data.records import DataError
from agentr1.env.math_tool import calculator
from agentr1.env.math_tool.convert import convert_gsm8k, convert_mawps, convert_svamp, read_mawps
from agentr1.env.math_tool.env import number_scores, parse_number
from agentr1.env.tools import ToolError

REAL = Path(__file__).resolve().parents[2] / "shared" / "realdata"
CONFIG = "conf/calculator-smollm2.yaml"


@pytest.mark.parametrize("expression, value", [
    ("(76 - 25) * 3", "153"), ("48/2", "24"), ("1/3", "0.333333"), ("0.1 + 0.2", "0.3"), ("-5 - -3", "-2"),
    ("2 ** 10", "1024"), ("7 // 2", "3"), ("7 % 4", "3"), ("((((1))))", "1"), ("1e3", "1000"),
])
def test_the_calculator_evaluates_arithmetic(expression, value):
    out = calculator.calculate(expression)
    assert out.text == value and out.keys == (value,)


@pytest.mark.parametrize("expression, why", [
    ("__import__('os').system('id')", "only numbers"), ("open('/etc/passwd')", "only numbers"),
    ("x + 1", "only numbers"), ("[1, 2]", "only numbers"), ("1, 2", "only numbers"), ("True + 1", "only numbers"),
    ("9 ** 9 ** 9", "exponent"), ("10 ** 20", "magnitude"), ("1" * 30, "magnitude"), ("1 / 0", "division by zero"),
    ("(-8) ** 0.5", "real number"), ("(" * 300 + "1" + ")" * 300, "longer than"), ("", "empty"),
    ("1 +", "not an arithmetic"), ("+".join(["1"] * 60), "more than"), ("2 ** -1 ** 1000", "exponent"),
    ("0 ** -1", "exponent"), ("lambda: 1", "only numbers"),
])
def test_the_calculator_refuses_what_is_not_bounded_arithmetic(expression, why):
    with pytest.raises(ToolError, match=why):
        calculator.calculate(expression)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120))
def test_any_text_is_a_value_or_a_tool_error(text):
    try:
        out = calculator.calculate(text)
    except ToolError:
        return
    assert abs(float(out.text)) <= calculator.MAX_MAGNITUDE


def test_numbers_are_read_from_answers_and_compared_within_the_tolerance():
    assert parse_number("$1,200.50") == 1200.5 and parse_number("It is 3 then 51 apples") == 51.0
    assert parse_number("none") is None and parse_number(None) is None
    assert number_scores("51", ["51"]).em == 1.0 and number_scores("51.00001", ["51"]).em == 1.0
    assert number_scores("51.01", ["51"]).em == 0.0 and number_scores("2.333333", ["2.3333333333"]).em == 1.0
    assert number_scores(None, ["1"]).em == 0.0 and number_scores("x", ["1"]).em == 0.0


def test_gold_equations_become_one_call_per_operator(tmp_path):
    path = tmp_path / "svamp.json"
    path.write_text(json.dumps([
        {"ID": "a", "Body": "Mary had 10 cups and 3 more.", "Question": "How many?", "Equation": "( ( 10.0 - 3.0 ) - 5.0 )",
         "Answer": 2.0},
        {"ID": "b", "Body": "Body.", "Question": "Q?", "Equation": "( 10.0 / 3.0 )", "Answer": 3.3333333333},
        {"ID": "c", "Body": "Body.", "Question": "Q?", "Equation": "( 2.0 + 2.0 )", "Answer": 5.0},
    ]))
    records, corpus, skipped = convert_svamp(DataSource(format="svamp", input=str(path), split="test"))
    a, b, c = records
    assert [x["arguments"]["expression"] for x in a.meta["calls"]] == ["10 - 3", "7 - 5"]
    assert a.meta["gold_values"] == ["7", "2"] and a.answers == ("2",) and a.hops == 2
    assert a.question == "Mary had 10 cups and 3 more. How many?"
    assert b.answers == ("3.333333",) and b.meta["calls"][0]["arguments"]["expression"] == "10 / 3"
    # the published answer disagrees with the equation: kept for evaluation, never demonstrated
    assert c.meta["unsolved"] and c.meta["calls"] == [] and c.answers == ("5",) and corpus
    train, _, skipped = convert_svamp(DataSource(format="svamp", input=str(path), split="train"))
    assert [r.id for r in train] == ["svamp-a", "svamp-b"] and skipped == {"equation": 1}


def test_an_expression_solution_is_one_call_of_the_whole_equation(tmp_path):
    path = tmp_path / "svamp.json"
    path.write_text(json.dumps([{"ID": "a", "Body": "B.", "Question": "Q?", "Equation": "( 10.0 - ( 3.0 + 5.0 ) )",
                                 "Answer": 2.0}]))
    (record,), _, _ = convert_svamp(DataSource(format="svamp", input=str(path), split="test", solution="expression"))
    assert record.meta["calls"] == [{"name": "calculate", "arguments": {"expression": "10 - (3 + 5)"}}]
    assert record.meta["gold_values"] == ["2"] and record.hops == 2  # hops: the operators, whatever the calls
    with pytest.raises(DataError, match="solution: steps"):
        convert_gsm8k(DataSource(format="gsm8k", input=str(path), solution="expression"))


def test_mawps_masks_and_prefix_equations(tmp_path):
    path = tmp_path / "m.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Question", "Numbers", "Equation", "Answer"])
        w.writerow(["Tom has number0 books in number1 boxes and number2 more . How many ?", "56.0 9.0 4.0",
                    "+ * number0 number1 number2", "508.0"])
    (record, why), = list(read_mawps(path))
    assert why is None and record.question == "Tom has 56 books in 9 boxes and 4 more. How many?"
    assert [c["arguments"]["expression"] for c in record.meta["calls"]] == ["56 * 9", "504 + 4"]
    assert record.answers == ("508",)


@pytest.mark.parametrize("row, field", [
    (["q number0", "x y", "+ number0 number0", "2"], "Numbers"),
    (["q number3", "1.0", "+ number0 number0", "2"], "Numbers"),
    (["q", "1.0", "+ number0 number0", "two"], "Answer"),
    (["", "1.0", "+ number0 number0", "2"], "Question"),
])
def test_a_bad_mawps_row_names_the_file_line_and_field(tmp_path, row, field):
    path = tmp_path / "m.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Question", "Numbers", "Equation", "Answer"])
        w.writerow(row)
    with pytest.raises(DataError) as err:
        convert_mawps(DataSource(format="mawps", input=str(path), split="train"))
    assert (err.value.path, err.value.line, err.value.field) == (str(path), 2, field)


def test_gsm8k_annotations_are_the_steps_and_a_bad_row_is_named(tmp_path):
    path = tmp_path / "g.jsonl"
    rows = [{"question": "Natalia sold 48, then half as many. How many?",
             "answer": "48/2 = <<48/2=24>>24\n48+24 = <<48+24=72>>72\n#### 72"},
            {"question": "Q?", "answer": "no steps\n#### 5"},
            {"question": "Q?", "answer": "<<2*3=7>>7\n#### 7"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records, _, skipped = convert_gsm8k(DataSource(format="gsm8k", input=str(path), split="train"))
    assert len(records) == 1 and skipped == {"annotation": 2}
    assert [c["arguments"]["expression"] for c in records[0].meta["calls"]] == ["48/2", "48+24"]
    assert records[0].meta["gold_values"] == ["24", "72"] and records[0].answers == ("72",)
    few, _, skipped = convert_gsm8k(DataSource(format="gsm8k", input=str(path), split="test", max_calls=1))
    assert [r.id for r in few] == ["gsm8k-2", "gsm8k-3"] and skipped == {"max_calls": 1}
    path.write_text(json.dumps({"question": "Q?", "answer": "no final answer"}) + "\n")
    with pytest.raises(DataError) as err:
        convert_gsm8k(DataSource(format="gsm8k", input=str(path), split="train"))
    assert (err.value.line, err.value.field) == (1, "answer")


@pytest.mark.skipif(not REAL.is_dir(), reason="../shared/realdata is not beside this checkout")
def test_the_real_files_convert_whole():
    """SVAMP's 1,000 problems all stay (one's equation disagrees with its answer: kept, unsolved);
    every MAWPS + ASDiv-A training problem that can be demonstrated is."""
    svamp, _, _ = convert_svamp(DataSource(format="svamp", input=str(REAL / "svamp" / "SVAMP.json"), split="test"))
    assert len(svamp) == 1000 and sum(bool(r.meta.get("unsolved")) for r in svamp) == 1
    mawps, _, skipped = convert_mawps(DataSource(format="mawps", input=str(REAL / "svamp" / "mawps-asdiv-a_train.csv")))
    assert len(mawps) + skipped["equation"] == 3138 and skipped["equation"] < 20


def _env():
    from agentr1.env.registry import build_env

    cfg = load_config(CONFIG, ["env.sandbox.enabled=false"])
    return build_env(cfg, Path("unused"))


def test_an_episode_pays_for_a_gold_step_and_scores_the_number(tmp_path):
    from agentr1.data.records import QARecord

    env = _env()
    w = env.weights
    record = QARecord("r", "Mary had 10 cups, used 3 and then 5. How many left?", ("2",), (), 2, "svamp",
                      {"calls": [], "gold_values": ["7", "2"]})
    state = env.reset(record)
    first = env.step(state, '<tool_call>{"name": "calculate", "arguments": {"expression": "10 - 3"}}</tool_call>')
    assert first.observation == "7" and first.process_reward == pytest.approx(w.process_valid_call
                                                                                + w.process_new_support)
    again = env.step(state, '<tool_call>{"name": "calculate", "arguments": {"expression": "3 + 4"}}</tool_call>')
    assert again.process_reward == pytest.approx(w.process_valid_call)  # 7 was found already
    bad = env.step(state, '<tool_call>{"name": "calculate", "arguments": {"expression": "os.system(1)"}}</tool_call>')
    assert bad.observation.startswith("Error: tool 'calculate' failed") and not bad.done
    end = env.step(state, "<answer>2 cups</answer>")
    m = env.episode_metrics(state)
    assert end.done and m["em"] == 1.0 and m["called"] == 1.0 and m["n_calls"] == 2
    state = env.reset(record)
    env.step(state, "<answer>2</answer>")
    assert env.episode_metrics(state)["called"] == 0.0 and env.episode_metrics(state)["em"] == 1.0
    assert "calculate" in env.system_turn() and "<answer>" in env.system_turn()


def test_a_served_word_problem_calls_the_calculator_and_the_answer_is_the_result():
    """The serving path without a policy: the record a served question makes (no gold: nothing
    scored), an episode that calls `calculate` then answers, and the transcript `agentr1 ask`, the
    MLflow model and the OpenAI endpoint return (each builds the record with agent.question_record
    and reads the result with agent.transcript), also as MLflow's Responses output."""
    from agentr1.agent import question_record, responses_output, transcript
    from agentr1.episode import Trajectory

    question = "Mary had 10 cups, used 3 and then 5. How many are left?"
    env = _env()
    record = question_record(question)
    assert "calculate" in env.system_turn(record)
    state = env.reset(record)
    turns = ['<tool_call>{"name": "calculate", "arguments": {"expression": "10 - 3 - 5"}}</tool_call>',
             "<answer>2</answer>"]
    first = env.step(state, turns[0])
    assert first.observation == "2" and not first.done
    end = env.step(state, turns[1])
    assert end.done and end.info["em"] == 0.0  # an asked question has no gold: only the format pays
    traj = Trajectory(record.id, [], [], [], 0, finish="answer", turn_texts=turns, observations=[first.observation])
    out = transcript(question, traj, env)
    assert out["tool_calls"] == [{"name": "calculate", "arguments": {"expression": "10 - 3 - 5"}, "result": "2"}]
    assert out["answer"] == "2" and out["finish"] == "answer"
    items = responses_output(out)["output"]
    assert [i["type"] for i in items] == ["function_call", "function_call_output", "message"]
