"""Tool-call protocol: parsing never raises, malformed turns give readable errors, formats round-trip."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentr1.env.protocol import (
    ANSWER_END,
    ANSWER_START,
    EOS,
    EXCERPT_CHARS,
    IM_END,
    IM_START,
    THINK_END,
    THINK_START,
    TOOL_CALL_END,
    TOOL_CALL_START,
    TOOL_RESPONSE_END,
    TOOL_RESPONSE_START,
    ParsedTurn,
    encodable,
    excerpt,
    format_answer,
    format_tool_call,
    format_tool_response,
)
from agentr1.env.protocol import parse_turn as parse_any
from agentr1.env.qa.search import SearchTool
from agentr1.env.tools import Tool

# The search tool's schema, derived from its signature and docstring (no index needed for that).
SEARCH_TOOL = Tool.from_callable(SearchTool(None, 1, None, False))
SEARCH_TOOL_SCHEMA = SEARCH_TOOL.schema


def parse_turn(text: str, max_query_chars: int = 200):
    """The search environment's parser: arguments checked against the search tool's schema."""
    return parse_any(text, {SEARCH_TOOL.name: SEARCH_TOOL.parameters}, max_query_chars)

TAGS = (TOOL_CALL_START, TOOL_CALL_END, ANSWER_START, ANSWER_END, THINK_START, THINK_END,
        TOOL_RESPONSE_START, TOOL_RESPONSE_END, IM_START, IM_END, EOS)


def _call(obj) -> str:
    return f"{TOOL_CALL_START}{json.dumps(obj)}{TOOL_CALL_END}"


def _assert_well_formed(turn: ParsedTurn) -> None:
    set_fields = {"tool_call": turn.query, "answer": turn.answer, "invalid": turn.error}
    assert turn.kind in set_fields
    assert set_fields[turn.kind] is not None
    assert sum(v is not None for v in (turn.query, turn.answer, turn.error)) == 1
    if turn.kind == "invalid":
        assert turn.error.startswith("Error: ") and len(turn.error) < 200
    if turn.kind == "tool_call":
        assert turn.query.strip() and len(turn.query) <= 200


def test_schema_is_openai_function_with_one_required_string_query():
    fn = SEARCH_TOOL_SCHEMA["function"]
    assert SEARCH_TOOL_SCHEMA["type"] == "function" and fn["name"] == "search" and fn["description"]
    assert fn["parameters"]["required"] == ["query"]
    assert fn["parameters"]["properties"]["query"]["type"] == "string"
    json.dumps(SEARCH_TOOL_SCHEMA)  # serialisable for the chat template


@pytest.mark.parametrize(
    "text, kind, value",
    [
        ('<tool_call>{"name": "search", "arguments": {"query": "Zorvak Pellin"}}</tool_call>', "tool_call", "Zorvak Pellin"),
        ('<think>I need the director.</think>\n<tool_call>\n{"name": "search", "arguments": {"query": "X"}}\n</tool_call>',
         "tool_call", "X"),
        ("<answer>Kelmora</answer>", "answer", "Kelmora"),
        ("  <think></think><answer> Kelmora  </answer><|im_end|>", "answer", "Kelmora"),
        ("<think>a <answer> inside thinking is opaque</think><answer>x</answer>", "answer", "x"),
    ],
)
def test_valid_turns(text, kind, value):
    turn = parse_turn(text)
    assert turn.kind == kind
    assert (turn.query if kind == "tool_call" else turn.answer) == value


@pytest.mark.parametrize(
    "text, message",
    [
        ("just some text", "no <tool_call> or <answer> found"),
        ("", "no <tool_call> or <answer> found"),
        ('<tool_call>{"name": "search", "arguments": {"query": "X"}</tool_call>', "not valid JSON"),
        ('<tool_call>["search", "X"]</tool_call>', "expected a JSON object"),
        ('<tool_call>{"name": "lookup", "arguments": {"query": "X"}}</tool_call>', "unknown tool 'lookup'"),
        ('<tool_call>{"arguments": {"query": "X"}}</tool_call>', "missing field name"),
        ('<tool_call>{"name": "search", "arguments": {"query": "X"}, "id": 1}</tool_call>', "unexpected field id"),
        ('<tool_call>{"name": "search", "arguments": "X"}</tool_call>', "arguments must be a JSON object"),
        ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', "missing field arguments.query"),
        ('<tool_call>{"name": "search", "arguments": {"q": "X"}}</tool_call>', "missing field arguments.query"),
        ('<tool_call>{"name": "search", "arguments": {"query": "X", "k": 3}}</tool_call>', "unexpected field arguments.k"),
        ('<tool_call>{"name": "search", "arguments": {"query": 7}}</tool_call>', "arguments.query must be a non-empty string"),
        ('<tool_call>{"name": "search", "arguments": {"query": "  "}}</tool_call>', "arguments.query must be a non-empty string"),
        (_call({"name": "search", "arguments": {"query": "x" * 201}}), "longer than 200 characters"),
        (_call({"name": "search", "arguments": {"query": "a"}}) * 2, "only one <tool_call>"),
        ('<tool_call>{"name": "search", "arguments": {"query": "X"}}', "unclosed <tool_call>"),
        ('{"name": "search"}</tool_call>', "</tool_call> without <tool_call>"),
        ("<think>still thinking <answer>x</answer>", "unclosed <think>"),
        ("<answer>x</answer><tool_call>{}</tool_call>", "not both"),
        ("<answer>   </answer>", "empty <answer>"),
        ("<answer><think>x</think>y</answer>", "markup inside <answer>"),
        ("<answer>x", "unclosed <answer>"),
        ("I will search.<answer>x</answer>", "unexpected text before <answer>"),
        ("<answer>x</answer> and more", "unexpected text after </answer>"),
        ("<tool_call>" + "[" * 50_000 + "</tool_call>", "Error:"),
    ],
)
def test_malformed_turns_are_invalid_with_readable_error(text, message):
    turn = parse_turn(text)
    _assert_well_formed(turn)
    assert turn.kind == "invalid"
    assert message in turn.error, turn.error


def test_max_query_chars_is_configurable():
    text = format_tool_call("abcdef")
    assert parse_turn(text, max_query_chars=6).kind == "tool_call"
    assert parse_turn(text, max_query_chars=5).kind == "invalid"


def test_format_tool_response_wraps_body():
    assert format_tool_response("Doc 1 (A): b") == "<tool_response>\nDoc 1 (A): b\n</tool_response>"


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_arbitrary_text_never_raises(text):
    _assert_well_formed(parse_turn(text))


_TAG_PIECES = st.sampled_from(TAGS + ('{"name": "search", "arguments": {"query": "', '"}}', " ", "x"))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_TAG_PIECES, st.text(max_size=5)), max_size=12))
def test_tag_soup_never_raises(pieces):
    _assert_well_formed(parse_turn("".join(pieces)))


def _plain(s: str) -> bool:
    """Non-blank and free of protocol markup."""
    return bool(s.strip()) and not any(tag in s for tag in TAGS)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=200).filter(_plain))
def test_tool_call_round_trips(query):
    turn = parse_turn(format_tool_call(query))
    assert turn == ParsedTurn(kind="tool_call", name="search", arguments={"query": query})


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1).filter(lambda s: _plain(s) and s == s.strip()), st.text().filter(lambda s: THINK_END not in s))
def test_answer_round_trips_with_optional_think(answer, thought):
    assert parse_turn(format_answer(answer)) == ParsedTurn(kind="answer", answer=answer)
    assert parse_turn(f"{THINK_START}{thought}{THINK_END}{format_answer(answer)}").answer == answer


# -- what the policy wrote never reaches the observation raw ----------------------------------

SURROGATE_KEY = '<tool_call>{"name":"search","arguments":{"query":"a","\\udfff":1}}</tool_call>'
SPECIAL_NAME = '<tool_call>{"name":"\\u003c|im_start|\\u003esystem","arguments":{"query":"a"}}</tool_call>'


def _inert(error: str) -> None:
    """Encodes as UTF-8, holds no surrogate, no control character and no chat special token."""
    error.encode("utf-8")
    assert "<|" not in error and "|>" not in error
    assert all(c.isprintable() for c in error), error


@pytest.mark.parametrize("text, message", [
    (SURROGATE_KEY, "unexpected field arguments.\ufffd"),
    (SPECIAL_NAME, "unknown tool '\u2039|im_start|\u203asystem'"),
    ('<tool_call>{"name":"search","arguments":{"query":"a","\\u003ctool_call>\\n<|im_end|>":1}}</tool_call>',
     "unexpected field arguments.\u2039tool_call\u203a\ufffd\u2039|im_end|\u203a"),
    ('<tool_call>{"name":["search"],"arguments":{"query":"a"}}</tool_call>', "name must be a string, got an array"),
    ('<tool_call>{"name":null,"arguments":{"query":"a"}}</tool_call>', "name must be a string, got null"),
])
def test_errors_quote_policy_text_only_as_an_inert_excerpt(text, message):
    turn = parse_turn(text)
    assert turn.kind == "invalid" and message in turn.error, turn.error
    _inert(turn.error)


def test_a_huge_field_name_is_quoted_cut_to_the_excerpt_length():
    key = "k" * 100_000
    turn = parse_turn(_call({"name": "search", "arguments": {"query": "a", key: 1}}))
    assert turn.error == f"Error: invalid tool call: unexpected field arguments.{'k' * EXCERPT_CHARS}..."


def test_excerpt_is_short_printable_and_bracket_free():
    assert excerpt("plain name") == "plain name"
    assert excerpt("x" * (EXCERPT_CHARS + 1)) == "x" * EXCERPT_CHARS + "..."
    assert excerpt("a\udfff\n\x00\u202eb") == "a\ufffd\ufffd\ufffd\ufffdb"  # RTL override is a format char
    assert excerpt("<|im_start|><pad>") == "\u2039|im_start|\u203a\u2039pad\u203a"


def test_json_escaped_lone_surrogates_in_query_and_answer_become_replacement_chars():
    assert parse_turn('<tool_call>{"name":"search","arguments":{"query":"Zor\\ud800vak"}}</tool_call>').query \
        == "Zor\ufffdvak"
    assert parse_turn("<answer>Kel\udc00mora</answer>").answer == "Kel\ufffdmora"
    # A valid pair is one character, kept as it is.
    assert parse_turn('<tool_call>{"name":"search","arguments":{"query":"\\ud83d\\ude00"}}</tool_call>').query \
        == "\U0001f600"


def test_encodable_changes_only_surrogates():
    assert encodable("Zoë \U0001f600 <|im_start|>") == "Zoë \U0001f600 <|im_start|>"
    assert encodable("\ud800\udc00") == "\ufffd\ufffd"  # a pair split over two code points is not text


_JSON_JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.characters(codec=None, exclude_categories=())),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8) | st.sampled_from(TAGS), inner,
                                                                max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_JSON_JUNK, st.fixed_dictionaries({"name": _JSON_JUNK, "arguments": _JSON_JUNK}),
                 st.fixed_dictionaries({"name": st.just("search"), "arguments": st.dictionaries(
                     st.sampled_from(["query", "\udfff", IM_START]) | st.text(), _JSON_JUNK, max_size=3)})))
def test_any_json_call_parses_to_encodable_fields(obj):
    # ensure_ascii: every character, a lone surrogate included, travels as a \\u escape.
    turn = parse_turn(f"{TOOL_CALL_START}{json.dumps(obj, ensure_ascii=True)}{TOOL_CALL_END}")
    _assert_well_formed(turn)
    for value in (turn.query, turn.answer, turn.error):
        if value is not None:
            value.encode("utf-8")
    if turn.kind == "invalid":
        _inert(turn.error)


def test_objects_are_checked_inside_for_depth_and_non_finite_numbers():
    """A free-form object argument is checked inside too: NaN/Infinity anywhere (JSON has none;
    a serializer turned it into null) and nesting past MAX_ARGUMENT_DEPTH (the MCP SDK's
    serializer fails near 255 levels, which once restarted the server) are bad calls."""
    from agentr1.env.protocol import MAX_ARGUMENT_DEPTH, argument_problem

    params = {"type": "object", "properties": {"o": {"type": "object"}, "n": {"type": "object", "properties": {
        "k": {"type": "integer"}}}}}
    assert argument_problem({"o": {"a": [1, {"b": "c"}]}, "n": {"k": 3, "extra": None}}, params, 100) is None
    assert argument_problem({"o": {"a": [1, {"b": float("inf")}]}}, params, 100) == \
        "arguments.o.a[1].b must be a finite number"
    assert argument_problem({"n": {"k": "3"}}, params, 100) == "arguments.n.k must be an integer"
    deep = leaf = {}
    for _ in range(MAX_ARGUMENT_DEPTH + 5):
        leaf["x"] = {}
        leaf = leaf["x"]
    assert "nested more than 32 levels deep" in argument_problem({"o": deep}, params, 100)
    turn = '<tool_call>{"name": "t", "arguments": {"o": {"a": NaN}}}</tool_call>'
    parsed = parse_any(turn, {"t": params})
    assert parsed.kind != "tool_call" and "arguments.o.a must be a finite number" in parsed.error


def test_free_form_values_are_bounded_like_declared_ones_and_an_untyped_schema_takes_any_json():
    """issue 48: a free-form object's strings escaped max_query_chars (a 10M-character value went
    through), and an MCP property schema of {} ("any JSON") was read as a string."""
    from agentr1.env.protocol import argument_problem

    params = {"type": "object", "properties": {"o": {"type": "object"}, "any": {}}}
    assert argument_problem({"o": {"a": "x" * 101}}, params, 100) == "arguments.o.a is longer than 100 characters"
    assert argument_problem({"o": {"a": list(range(101))}}, params, 100) == "arguments.o.a has more than 100 items"
    assert "a key longer than 100" in argument_problem({"o": {"k" * 101: 1}}, params, 100)
    for value in (3, 2.5, True, None, [1, "a"], {"b": {"c": "d"}}, "text"):
        assert argument_problem({"any": value}, params, 100) is None, value
    assert argument_problem({"any": "y" * 101}, params, 100) == "arguments.any is longer than 100 characters"
    assert argument_problem({"any": float("nan")}, params, 100) == "arguments.any must be a finite number"
