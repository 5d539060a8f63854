"""Tokenizer and chat template for the from-scratch policy.

Two properties matter for a tiny model that must learn to *copy* fresh entity names from
search results into tool calls and answers (FIELD-NOTES pitfalls 1 and 2):

* An unseen name splits into pieces that are frequent in training (syllables, letters),
  never into a rare whole-name merge: capitalised tokens are at most
  ``MAX_CAPITALISED_TOKEN`` characters and every merge needs ``min_frequency`` occurrences.
* A name has the same token ids wherever it appears (after a space, after a JSON quote, at
  the start of a line, before punctuation): the pre-tokenizer makes every capitalised run
  of letters its own piece, so a name never carries a leading space or quote. Lowercase
  words keep theirs (" city" is one token), which keeps sequences about a third shorter
  than isolating every space.

Byte-level pieces make every string encodable and ``decode(encode(s)) == s`` exact.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
    "</tool_response>", "<answer>", "</answer>", "<think>", "</think>", "<pad>",
]
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<pad>"
UNK_TOKEN = "<|endoftext|>"  # never produced (byte-level covers everything); set so configs have one

# Pieces: Qwen2's pre-tokenizer regex (digits one by one, punctuation runs, whitespace),
# then every capitalised run of letters cut loose from the one character Qwen2 glues in
# front of it (" Zorvak", '"Zorvak'). No merge ever joins a non-letter to a capital, so a
# name is the same ids wherever it stands, while " city" stays one token. Starting from Qwen2's regex matters: transformers' AutoTokenizer
# loads any checkpoint of model_type "qwen2" as Qwen2Tokenizer, which swaps in that regex
# (and NFC); with these merges it then splits every text exactly as this tokenizer does.
CAPITALISED_RUN = r"\p{Lu}\p{L}*"
# Capitalised tokens (name starts: "Krer", "Zor") stay at most this long, so a fresh name
# splits into syllable-sized pieces seen thousands of times, not into a rare whole-name
# merge. Other tokens may be longer: template and prompt words ("distributed", "search")
# stay whole, which keeps sequences ~25% shorter than a global cap would.
MAX_CAPITALISED_TOKEN = 4
OVERTRAIN = 3  # BPE is trained for this times vocab_size merges before the cap prunes them
MAX_TOKEN_LENGTH = 16  # bounds odd long runs ("=====") that would waste vocabulary
# A merge seen fewer times than this would give a token whose embedding barely trains.
MIN_FREQUENCY = 8

# Qwen2.5/Hermes-style template, kept short: the model is tiny and every prompt token is
# paid for in every rollout. Tools are listed as one compact JSON object per line (the
# "function" part of an OpenAI-style schema). A tool message renders exactly like Qwen2.5:
# "<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n".
CHAT_TEMPLATE = (
    "{%- set ns = namespace(first=0) -%}"
    "{%- if messages and messages[0].role == 'system' -%}{%- set ns.first = 1 -%}{%- endif -%}"
    "{%- if ns.first == 1 or tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if ns.first == 1 -%}{{- messages[0].content -}}{%- endif -%}"
    "{%- if tools -%}"
    "{%- if ns.first == 1 -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n<tools>\\n' -}}"
    "{%- for tool in tools -%}"
    "{{- (tool.function if tool.function is defined else tool) | tojson(separators=(',', ':')) -}}{{- '\\n' -}}"
    "{%- endfor -%}"
    "{{- '</tools>\\nCall a tool with <tool_call>{\"name\": <name>, \"arguments\": <args>}</tool_call>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages[ns.first:] -%}"
    "{%- if message.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') -}}"
    "{%- for call in (message.tool_calls or []) -%}"
    "{%- set f = call.function if call.function is defined else call -%}"
    "{{- '<tool_call>{\"name\": ' + (f.name | tojson) + ', \"arguments\": ' + (f.arguments | tojson) + '}</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int) -> Tokenizer:
    """Byte-level BPE (``tokenizers``) over the letter-run pre-tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.Split(Regex(CAPITALISED_RUN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        max_token_length=MAX_TOKEN_LENGTH,
        # All 256 byte symbols, seen or not, so any text (e.g. "Zoë") encodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def _capitalised(token: str) -> bool:
    # Not str.isupper: the byte-level space symbol "Ġ" (U+0120) is itself a capital letter.
    return "A" <= token[0] <= "Z"


def _cap_capitalised(tok: Tokenizer, max_len: int, vocab_size: int) -> Tokenizer:
    """Drop merges that build a capitalised token longer than ``max_len`` (and every merge
    that needs one), keep the first merges up to ``vocab_size`` tokens, then renumber the
    vocabulary without the unreachable tokens.

    Token strings are byte-level symbols; ASCII letters are themselves, so an ASCII capital on
    the first symbol tells a capitalised piece.
    """
    spec = json.loads(tok.to_str())
    bpe = spec["model"]
    by_id = sorted(bpe["vocab"], key=bpe["vocab"].get)
    reachable = {t for t in by_id if len(t) == 1 or t in SPECIAL_TOKENS}
    merges = []
    for left, right in (m.split(" ") if isinstance(m, str) else m for m in bpe["merges"]):
        token = left + right
        if len(reachable) >= vocab_size:
            break
        if left in reachable and right in reachable and not (_capitalised(token) and len(token) > max_len):
            merges.append([left, right])
            reachable.add(token)
    bpe["vocab"] = {t: i for i, t in enumerate(t for t in by_id if t in reachable)}
    bpe["merges"] = merges
    for added in spec["added_tokens"]:  # specials come first, so their ids must not move
        if bpe["vocab"][added["content"]] != added["id"]:
            raise RuntimeError(f"special token {added['content']!r} moved from id {added['id']}")
    return Tokenizer.from_str(json.dumps(spec))


def build_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 2048,
    max_capitalised_token: int = MAX_CAPITALISED_TOKEN,
    min_frequency: int = MIN_FREQUENCY,
    phrases: Iterable[str] = (),
) -> PreTrainedTokenizerFast:
    """Train a tokenizer on ``texts``: documents, questions, tool calls, answers and the
    rendered prompts (system prompt + tools), each text as often as it occurs in training,
    so that frequent scaffolding becomes whole tokens.

    ``phrases``: fixed strings that become one (non-special) token each, matched before any
    other splitting, e.g. the JSON of a tool call around its argument. BPE alone cannot merge
    them: its pieces never cross punctuation and spaces.

    Special tokens take ids 0..len(SPECIAL_TOKENS)-1 in the order of ``SPECIAL_TOKENS``;
    phrases follow the BPE vocabulary.
    The vocabulary ends up below ``vocab_size`` by the merges that capping removes, and
    when fewer merges reach ``min_frequency``.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size={vocab_size}: needs at least the 256 bytes + {len(SPECIAL_TOKENS)} specials")
    # Fresh names make syllable-pair merges frequent; most build long capitalised tokens that
    # the cap removes. Train for a larger vocabulary so the kept merges fill ``vocab_size``.
    backend = _cap_capitalised(_train_bpe(texts, OVERTRAIN * vocab_size, min_frequency),
                               max_capitalised_token, vocab_size)
    backend.add_tokens([AddedToken(p, special=False, normalized=False) for p in phrases])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        extra_special_tokens=[t for t in SPECIAL_TOKENS if t not in (EOS_TOKEN, PAD_TOKEN, UNK_TOKEN)],
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def single_token_ids(tokenizer: PreTrainedTokenizerBase, strings: Iterable[str | None]) -> list[int]:
    """Ids of those ``strings`` that are one token in this vocabulary (in order, no repeats;
    e.g. ``</answer>`` is one token here but several in Qwen2.5's vocabulary)."""
    ids: list[int] = []
    for s in strings:
        enc = tokenizer.encode(s, add_special_tokens=False) if s else []
        if len(enc) == 1 and enc[0] not in ids:
            ids.append(enc[0])
    return ids
