"""benchmarks/vs_trl.py's one piece that is not run by the benchmark itself in CI: the chat template
TRL gets for a model whose ChatML template renders content only (SmolLM2's), which must write an
assistant's tool calls exactly as the project's policy writes them, and leave every other message
as the model's own template renders it."""
from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest

from agentr1.env.protocol import format_call

ROOT = Path(__file__).resolve().parent.parent
# SmolLM2-135M-Instruct's chat template, as its tokenizer_config.json ships it.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def vs_trl():
    spec = importlib.util.spec_from_file_location("vs_trl", ROOT / "benchmarks" / "vs_trl.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["vs_trl"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smollm2_like():
    """A small tokenizer with SmolLM2's chat template (the template is what is under test)."""
    from models.tokenizer import build_tokenizer

    tok = build_tokenizer([f"question {i} search the corpus" for i in range(20)], vocab_size=300)
    tok.chat_template = SMOLLM2_TEMPLATE
    return tok


def test_tool_calls_render_as_the_policy_writes_them_and_the_rest_as_before(vs_trl, smollm2_like):
    ours = smollm2_like
    tok = copy.deepcopy(ours)
    tok.chat_template = vs_trl._chatml_with_tool_calls(SMOLLM2_TEMPLATE)
    call = {"type": "function", "function": {"name": "search", "arguments": {"query": "Ünïcode \"quoted\""}}}
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "name": "search", "content": "a document"},
                {"role": "assistant", "content": "<answer>x</answer>"}]
    rendered = tok.apply_chat_template(messages, tokenize=False)
    expected_call = format_call("search", {"query": "Ünïcode \"quoted\""})
    assert f"<|im_start|>assistant\n{expected_call}<|im_end|>\n" in rendered
    plain = [m for m in messages if "tool_calls" not in m]
    assert tok.apply_chat_template(plain, tokenize=False, add_generation_prompt=True) == \
        ours.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)


def test_a_template_of_another_shape_is_refused_with_what_is_expected(vs_trl):
    with pytest.raises(SystemExit, match="not a ChatML template"):
        vs_trl._chatml_with_tool_calls("{{ messages | map(attribute='content') | join }}")
