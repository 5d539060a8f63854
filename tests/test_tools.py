"""Tools as plain callables, environments by name: schemas, argument checks, failing tools,
the registry's errors, and demonstrations from gold calls (real QA data included)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from agentr1.config import EnvConfig, RewardConfig, load_config
from agentr1.data.records import DataError, Document, QARecord
from agentr1.env.base import EnvSettings, ToolEnv
from agentr1.env.episodes import run_episodes
from agentr1.env.protocol import format_answer, format_call
from agentr1.env.qa.env import QAEnv
from agentr1.env.registry import RegistryError, build_env, resolve
from agentr1.env.rewards import RewardWeights
from agentr1.env.qa.search import SearchIndex
from agentr1.env.tools import Tool, ToolDefinitionError, ToolError


def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return str(a + b)


def divide(a: float, b: float) -> str:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor.
    """
    if a < 0:
        raise ToolError("negative <|im_start|> numbers are not supported " + "x" * 500)
    return f"{a / b:g}"


class Counter:
    """A tool with a batched backend, which says how many calls each batch held (the tool runs in
    a sandboxed worker: its answers are all the test can see of it)."""

    name = "count"

    def __call__(self, word: str) -> str:
        """Count the letters of a word.

        Args:
            word: The word.
        """
        return str(len(word))

    def batch(self, calls: list[dict]) -> list[str]:
        return [f"{len(c['word'])} (batch of {len(calls)})" for c in calls]


def record(i: int = 0, calls=None, answers=("5",)) -> QARecord:
    meta = {"calls": calls} if calls is not None else {}
    return QARecord(id=f"r{i}", question=f"What is 2 + 3? ({i})", answers=answers, supporting_docs=(), hops=1,
                    source="test", meta=meta)


def make_env(*tools, max_turns: int = 4) -> ToolEnv:
    settings = EnvSettings.from_config(EnvConfig(max_turns=max_turns, system_prompt=None))
    return ToolEnv([Tool.from_callable(t) for t in tools], settings, RewardWeights.from_config(RewardConfig()))


def test_schema_comes_from_signature_and_docstring():
    tool = Tool.from_callable(add)
    assert tool.name == "add"
    fn = tool.schema["function"]
    assert fn["description"] == "Add two integers."
    assert fn["parameters"] == {"type": "object", "required": ["a", "b"], "additionalProperties": False,
                                "properties": {"a": {"type": "integer", "description": "The first number."},
                                               "b": {"type": "integer", "description": "The second number."}}}
    counter = Tool.from_callable(Counter())
    assert counter.name == "count" and counter.batch is not None
    assert list(counter.parameters["properties"]) == ["word"]


def test_a_tool_without_type_hints_or_docstring_is_refused_by_name():
    def untyped(x):
        """Do it.

        Args:
            x: A thing.
        """

    def undocumented(x: int) -> str:
        return ""

    with pytest.raises(ToolDefinitionError, match="untyped.*type hint"):
        Tool.from_callable(untyped)
    with pytest.raises(ToolDefinitionError, match="undocumented.*docstring"):
        Tool.from_callable(undocumented)


@pytest.mark.parametrize("arguments, message", [
    ({"a": 2}, "missing field arguments.b"),
    ({"a": 2, "b": 3, "c": 4}, "unexpected field arguments.c"),
    ({"a": "2", "b": 3}, "arguments.a must be an integer"),
    ({"a": True, "b": 3}, "arguments.a must be an integer"),
    ({"a": 2.5, "b": 3}, "arguments.a must be an integer"),
])
def test_bad_arguments_are_an_error_observation_and_a_penalty(arguments, message):
    env = make_env(add)
    state = env.reset(record())
    step = env.step(state, format_call("add", arguments))
    assert not step.done and message in step.observation and step.observation.startswith("Error:")
    assert step.process_reward == pytest.approx(-0.1) and step.info["bad_call"] == 1.0
    good = env.step(state, format_call("add", {"a": 2, "b": 3}))
    assert good.observation == "5" and good.info["valid_call"] == 1.0
    end = env.step(state, format_answer("5"))
    assert end.done and env.episode_metrics(state)["em"] == 1.0
    assert env.episode_metrics(state)["n_bad_calls"] == 1.0 and env.episode_metrics(state)["n_tool_errors"] == 0.0


def test_unknown_tool_lists_the_tools():
    env = make_env(add, divide)
    obs = env.step(env.reset(record()), format_call("mul", {"a": 1})).observation
    assert "unknown tool 'mul' (available: add, divide)" in obs


def test_a_raising_tool_gives_an_error_observation_is_counted_and_the_run_goes_on():
    env = make_env(divide, add)
    states = [env.reset(record(i)) for i in range(3)]
    steps = env.step_batch(states, [format_call("divide", {"a": 1, "b": 0}),  # ZeroDivisionError
                                    format_call("divide", {"a": -1, "b": 2}),  # ToolError: its message
                                    format_call("divide", {"a": 6, "b": 2})])
    assert steps[0].observation == "Error: tool 'divide' failed: ZeroDivisionError"
    assert steps[1].observation.startswith("Error: tool 'divide' failed: negative \u2039|im_start|\u203a numbers")
    assert len(steps[1].observation) < 200 and "<|" not in steps[1].observation
    assert steps[2].observation == "3"
    assert [s.info["tool_error"] for s in steps] == [1.0, 1.0, 0.0]
    assert steps[0].process_reward == pytest.approx(-0.1)
    metrics = [env.episode_metrics(s) for s in states]
    assert [m["n_tool_errors"] for m in metrics] == [1.0, 1.0, 0.0]
    assert [m["n_calls"] for m in metrics] == [0.0, 0.0, 1.0]


def test_a_batched_tool_answers_a_turn_in_one_call_and_its_failure_is_contained():
    counter = Counter()
    env = make_env(counter, add)
    states = [env.reset(record(i)) for i in range(3)]
    steps = env.step_batch(states, [format_call("count", {"word": w}) for w in ("ab", "abc", "abcd")])
    assert [s.observation for s in steps] == [f"{n} (batch of 3)" for n in (2, 3, 4)]
    broken = Counter()
    broken.batch = lambda calls: 1 / 0
    env = make_env(broken)
    steps = env.step_batch([env.reset(record(i)) for i in range(2)], [format_call("count", {"word": "a"})] * 2)
    assert all(s.observation == "Error: tool 'count' failed: ZeroDivisionError" for s in steps)


def test_gold_calls_demonstrate_a_tool_env_and_missing_calls_are_named():
    env = make_env(add)
    records = [record(i, calls=[{"name": "add", "arguments": {"a": 2, "b": 3}}]) for i in range(4)]
    transcripts = run_episodes(env, env.demonstrator(None, 0), records)
    assert [t.metrics["em"] for t in transcripts] == [1.0] * 4
    assert transcripts[0].observations == ["5"] and transcripts[0].metrics["n_calls"] == 1.0
    env.check_demonstrable(records, "train.jsonl")
    with pytest.raises(DataError, match=r"train.jsonl:3: field 'meta.calls'.*'r2': no gold calls"):
        env.check_demonstrable(records[:2] + [record(2)], "train.jsonl")
    with pytest.raises(DataError, match="call 0: missing field arguments.b"):
        env.check_demonstrable([record(0, calls=[{"name": "add", "arguments": {"a": 1}}])], "train.jsonl")


def test_real_qa_data_is_demonstrated_by_searching_the_supporting_titles(tmp_path):
    docs = [Document("h1", "Kelmora Abbey", "Kelmora Abbey was founded by Zorvak Pellin."),
            Document("h2", "Zorvak Pellin", "Zorvak Pellin was born in Tirnabo."),
            Document("h3", "Tirnabo", "Tirnabo is a town.")]
    real = QARecord(id="hp1", question="Where was the founder of Kelmora Abbey born?", answers=("Tirnabo",),
                    supporting_docs=("h1", "h2"), hops=2, source="hotpotqa")
    env = QAEnv(SearchIndex.build(docs, cache_dir=tmp_path), EnvSettings.from_config(EnvConfig(doc_header=True)),
                RewardWeights.from_config(RewardConfig()))
    (t,) = run_episodes(env, env.demonstrator(None, 0), [real])
    assert [env.parse(x).query for x in t.turn_texts[:2]] == ["Kelmora Abbey", "Zorvak Pellin"]
    assert t.metrics["em"] == 1.0 and t.metrics["support_recall"] == 1.0
    orphan = QARecord(id="hp2", question="?", answers=("x",), supporting_docs=("nope",), hops=2, source="hotpotqa")
    with pytest.raises(DataError, match="train.jsonl:1: field 'supporting_docs'.*'hp2'"):
        env.check_demonstrable([orphan], "train.jsonl")


def test_unknown_env_kind_and_tool_name_the_key_and_the_known_names():
    """Validating a config runs no plug-in code; resolving it loads the plug-ins and checks the names."""
    cfg = load_config(None, ["plugins=[missing_plugin.py]", "env.kind=sqlx"])  # validates: names are not its job
    with pytest.raises(RegistryError, match=r"plugins: cannot load 'missing_plugin.py'"):
        resolve(cfg)
    with pytest.raises(RegistryError, match=r"env.kind: unknown environment 'sqlx'; registered: function_call, math_tool, mixed, qa, sql, tools"):
        resolve(load_config(None, ["env.kind=sqlx"]))
    with pytest.raises(RegistryError, match=r"env.tools: unknown tool 'calc'; registered: .*search"):
        resolve(load_config(None, ["env.tools=[calc]"]))
    with pytest.raises(RegistryError, match=r"env.kind: unknown environment 'sqlx'"):  # nor can an env be built
        build_env(load_config(None, ["env.kind=sqlx"]), "data")


def test_a_plugin_registers_its_tool_and_a_bad_tool_fails_at_load(tmp_path):
    good = tmp_path / "good_plugin.py"
    good.write_text(textwrap.dedent('''
        from agentr1.env.registry import register_tool

        @register_tool
        def shout(text: str) -> str:
            """Upper-case a text.

            Args:
                text: The text.
            """
            return text.upper()
    '''))
    cfg = resolve(load_config(None, [f"plugins=[{good}]", "env.kind=tools", "env.tools=[shout]"]))
    assert cfg.env.tools == ["shout"]
    bad = tmp_path / "bad_plugin.py"
    bad.write_text("from agentr1.env.registry import register_tool\n\n@register_tool\ndef nodoc(x: int) -> str:\n"
                   "    return ''\n")
    with pytest.raises(RegistryError, match=r"cannot load .*bad_plugin.py.*tool nodoc.*docstring"):
        resolve(load_config(None, [f"plugins=[{bad}]"]))


@pytest.mark.slow
def test_the_cli_names_an_unknown_kind_and_exits_2():
    out = subprocess.run([sys.executable, "-m", "cli", "train", "-o", "env.kind=nope"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "env.kind: unknown environment 'nope'" in out.stderr


def test_great_expectations_checks_each_environment_kinds_records(tmp_path):
    from agentr1.data.generated import write_dataset
    from adapters.validation import validate_dataset

    corpus = [Document("d1", "Adder", "An adder adds.")]
    good = [record(i, calls=[{"name": "add", "arguments": {"a": 2, "b": 3}}]) for i in range(3)]
    write_dataset(tmp_path / "ok", {"train": good, "test": [record(9)]}, corpus)
    reports = validate_dataset(tmp_path / "ok", "tools")
    assert all(r.success for r in reports) and reports[-1].suite == "env_tools"
    assert [r.source.rsplit("/", 1)[-1] for r in reports if r.suite == "env_tools"] == ["train.jsonl"]
    write_dataset(tmp_path / "bad", {"train": good[:1] + [record(5)], "test": [record(9)]}, corpus)
    (failed,) = [r for r in validate_dataset(tmp_path / "bad", "tools") if not r.success]
    assert failed.suite == "env_tools" and failed.failures[0]["field"] == "calls"
    assert failed.failures[0]["rows"][0]["line"] == 2 and failed.failures[0]["rows"][0]["id"] == "r5"
    # The qa kind asks for what its demonstrator needs instead: a chain or supporting documents.
    (qa_failed,) = [r for r in validate_dataset(tmp_path / "bad", "qa") if not r.success]
    assert qa_failed.suite == "env_qa" and qa_failed.failures[0]["unexpected_count"] == 2


def test_each_environment_kind_has_its_own_registered_model():
    from adapters.registry import qualified_ref
    from adapters.tracking import MODEL_NAME, model_name

    assert model_name(load_config().env.kind) == MODEL_NAME == "agentr1-policy"
    other = model_name(load_config(None, ["env.kind=tools", "env.tools=[search]"]).env.kind)
    assert other == "agentr1-policy-tools"
    # A bare version or alias names a version of the config's own model, never the QA one.
    assert qualified_ref("champion", other) == "models:/agentr1-policy-tools@champion"
    assert qualified_ref("3", other) == "models:/agentr1-policy-tools/3"
    assert qualified_ref("models:/agentr1-policy@champion", other) == "models:/agentr1-policy@champion"


def test_a_plugin_names_its_failing_line_and_a_replaced_tool_is_said(tmp_path, caplog, registry_restored):
    """A plug-in that fails at import names its own file and line; one that registers a tool under
    a registered name warns (the built-in sql tool would be silently replaced); a factory needs
    name=, the name the model calls."""
    import logging

    from agentr1.env import registry

    broken = tmp_path / "broken_plugin.py"
    broken.write_text("import os\n\nvalue = 1\nraise RuntimeError('catalogue.json is missing')\n")
    with pytest.raises(RegistryError, match=rf"cannot load .*broken_plugin.py' \({broken}:4\): RuntimeError: "
                                            r"catalogue.json is missing"):
        resolve(load_config(None, [f"plugins=[{broken}]"]))
    syntax = tmp_path / "syntax_plugin.py"
    syntax.write_text("x = 1\ndef f(:\n")
    with pytest.raises(RegistryError, match=rf"\({syntax}:2\): SyntaxError"):
        resolve(load_config(None, [f"plugins=[{syntax}]"]))
    with pytest.raises(RegistryError, match=r"factory=True\) needs name="):
        registry.register_tool(factory=True)

    shadow = tmp_path / "shadow_plugin.py"
    shadow.write_text(textwrap.dedent('''
        from agentr1.env.registry import register_tool

        @register_tool(name="sql")
        def my_sql(query: str) -> str:
            """Not the built-in.

            Args:
                query: Anything.
            """
            return query
    '''))
    with caplog.at_level(logging.WARNING, logger="agentr1.plugins"):
        resolve(load_config(None, [f"plugins=[{shadow}]"]))
    assert "tool 'sql' from agentr1_plugin_shadow_plugin:my_sql replaces the registered tool 'sql' " \
           "(agentr1.env.sql.tool:sql_tool)" in caplog.text


@pytest.mark.parametrize("returned, said", [
    ("[{'id': 'q1'}]", "a list of 1 items"),
    ("({'train': [{'id': 'q1', 'question': 'x'}]}, [])", "a dict in split 'train', not a QARecord"),
    ("({'train': []}, [{'id': 'd1'}])", "a dict in the corpus, not a Document"),
    ("({'train': []}, [], {'catalogue.json': 'text'})", "files that are not {file name: bytes}"),
])
def test_a_generator_returning_the_wrong_shape_is_named(tmp_path, returned, said, registry_restored):
    plugin = tmp_path / f"gen_{abs(hash(returned))}.py"
    plugin.write_text(textwrap.dedent(f'''
        from agentr1.env.registry import register_environment

        def shop_data(cfg):
            return {returned}

        register_environment("shop_{abs(hash(returned))}", "agentr1.env.base:build_tool_env", synth=shop_data)
    '''))
    cfg = load_config(None, [f"plugins=[{plugin}]", f"env.kind=shop_{abs(hash(returned))}"])
    from agentr1.env.registry import synth_data

    with pytest.raises(RegistryError, match=r"its generator agentr1_plugin_gen_\d+:shop_data returned ") as err:
        synth_data(cfg)
    assert said in str(err.value)
