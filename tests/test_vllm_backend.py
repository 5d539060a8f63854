"""The vllm backend, for real on CPU: the hf backend's behaviour (masks, stops, seeds,
log-probs) and weight sync after a PPO update. Skipped when vllm is not installed; one engine
is started for the whole file (start-up is the slow part)."""
from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

if importlib.util.find_spec("vllm") is None:  # not imported here: ~6 s of every worker's collection
    pytest.skip("vllm is not installed", allow_module_level=True)
pytestmark = pytest.mark.slow  # one vLLM engine for the module: ~12 s to start, ~20 s in all

from accelerate import Accelerator

from agentr1.config import ModelConfig, load_config
from agentr1.rl.guard import StepGuard
from agentr1.rl.ppo import forward_tokens, ppo_update, score_batch
from agentr1.rollout.backend import SamplingSpec
from agentr1.rollout.batch import collate
from agentr1.rollout.engine import RolloutEngine, RolloutSettings
from agentr1.rollout.vllm_backend import VLLMBackend, preserved_rng, shutdown_engines
from agentr1.recipe.ppo import ppo_hyper
from models.policy import ModelSpec, build_policy

# fp32 on both sides; vLLM's CPU kernels sum in another order than torch's.
LOGP_TOL = 1e-4
MAX_LEN = 512


@pytest.fixture(scope="module")
def world(rollout_world):
    # head size 32: the smallest vLLM's CPU attention supports
    spec = ModelSpec.from_config(ModelConfig(), hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2,
                                 intermediate_size=128, max_position_embeddings=512)
    model = build_policy(spec, rollout_world["tok"], seed=0)
    model.eval()
    yield {**rollout_world, "model": model, "backend": VLLMBackend(model.policy, max_model_len=MAX_LEN)}
    shutdown_engines()


def engine(world, max_turn_tokens=12, max_context=400, backend=None) -> RolloutEngine:
    return RolloutEngine(backend or world["backend"], world["chat"], world["tok"], world["env"],
                         RolloutSettings(max_turn_tokens, max_context))


def backend_for(world, model) -> VLLMBackend:
    """A backend for another model of the same shape: it shares the fixture's engine."""
    backend = VLLMBackend(model.policy, max_model_len=MAX_LEN)
    assert backend.llm is world["backend"].llm  # no second start-up
    return backend


def logp_gap(model, trajs, pad_id) -> tuple[float, float]:
    """Max and mean |rollout log-prob - trainer log-prob| over action tokens."""
    batch = collate(trajs, pad_id)
    with torch.no_grad():
        logp, _, _ = forward_tokens(model, batch.input_ids, batch.attention_mask)
    gap = (logp - batch.rollout_logprobs).abs()[batch.action_mask.bool()]
    return float(gap.max()), float(gap.mean())


def test_turns_are_sampled_ids_with_mask_1_and_observation_ids_with_mask_0(world):
    chat, records = world["chat"], world["splits"]["test"][:8]
    trajs = engine(world, max_turn_tokens=7).run(records, seed=0)
    for t, r in zip(trajs, records):
        assert t.token_ids[: t.prompt_len] == chat.prompt_ids(None, world["env"].user_prompt(r))
        assert not any(t.action_mask[: t.prompt_len])
        j = t.prompt_len
        for k, end in enumerate(t.turn_ends):
            turn = t.token_ids[j : end + 1]
            assert all(t.action_mask[j : end + 1])
            stops = [i for i, tok in enumerate(turn) if tok in chat.stop_token_ids]
            assert stops in ([], [len(turn) - 1]) and (stops or len(turn) == 7)
            j = end + 1
            if k < len(t.observations):
                obs = chat.observation_ids(t.observations[k], turn_closed=turn[-1] == chat.end_of_turn_id)
                assert t.token_ids[j : j + len(obs)] == obs and not any(t.action_mask[j : j + len(obs)])
                j += len(obs)
        assert j == len(t.token_ids) == len(t.action_mask) == len(t.rollout_logprobs)


def test_generation_keeps_the_stop_token_and_says_why_it_ended(world):
    chat, tok = world["chat"], world["tok"]
    prompts = [chat.prompt_ids(None, r.question) for r in world["splits"]["test"][:16]]
    # Make the most likely first token of each prompt a stop token: some requests stop at once.
    first = [g.token_ids[0] for g in world["backend"].generate(prompts, SamplingSpec(1, (), 0.0), [0] * 16)]
    spec = SamplingSpec(6, tuple(chat.stop_token_ids) + (first[0],), temperature=1.0)
    gens = world["backend"].generate(prompts, spec, list(range(16)))
    assert {g.finish_reason for g in gens} == {"stop", "length"}
    for g in gens:
        assert len(g.token_ids) == len(g.logprobs) and all(lp <= 0 for lp in g.logprobs)
        if g.finish_reason == "stop":
            assert g.token_ids[-1] in spec.stop_token_ids
            assert not set(g.token_ids[:-1]) & set(spec.stop_token_ids)
        else:
            assert len(g.token_ids) == 6 and not set(g.token_ids) & set(spec.stop_token_ids)
    assert tok.decode(gens[0].token_ids)  # plain ids of our vocabulary


def test_same_seed_same_rollout_other_seed_differs_and_global_rng_untouched(world):
    records = world["splits"]["test"][:8]
    rng = torch.get_rng_state()
    a = engine(world).run(records, seed=5)
    b = engine(world).run(records, seed=5)
    c = engine(world).run(records, seed=6)
    assert torch.equal(torch.get_rng_state(), rng)
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    for ta, tb in zip(a, b):
        assert ta.rollout_logprobs == pytest.approx(tb.rollout_logprobs, abs=1e-6)
    assert [t.token_ids for t in a] != [t.token_ids for t in c]
    # A request's sample does not depend on its batch-mates.
    prompts, spec = [t.token_ids[: t.prompt_len] for t in a], SamplingSpec(12, (), temperature=1.0)
    full = world["backend"].generate(prompts, spec, list(range(8)))
    part = world["backend"].generate(prompts[3:5], spec, [3, 4])
    assert [g.token_ids for g in part] == [g.token_ids for g in full[3:5]]


def test_logprobs_match_the_trainers_forward_at_temperature_and_greedy(world):
    records = world["splits"]["test"][:8]
    trajs = engine(world).run(records, seed=3)
    assert logp_gap(world["model"], trajs, world["chat"].pad_token_id)[0] < LOGP_TOL
    greedy = engine(world).run(records, seed=3, temperature=0.0)
    assert logp_gap(world["model"], greedy, world["chat"].pad_token_id)[0] < LOGP_TOL


def test_after_a_ppo_update_and_sync_vllm_logprobs_match_the_trainers(world):
    pad, records = world["chat"].pad_token_id, world["splits"]["test"][:16]
    trajs = engine(world).run(records, seed=7)
    model = copy.deepcopy(world["model"])
    hp = ppo_hyper(load_config(None, ["ppo.epochs=2", "ppo.minibatch_size=8", "ppo.kl_coef=0"]))
    batch = collate(trajs, pad)
    with torch.no_grad():
        scored, _ = score_batch(model, world["model"], batch, hp)
    model.train()
    ppo_update(model, torch.optim.AdamW(model.parameters(), lr=3e-2), Accelerator(cpu=True), batch, scored, hp,
               torch.Generator().manual_seed(0), StepGuard(max_in_row=1))
    model.eval()
    stale_max, _ = logp_gap(model, engine(world).run(records, seed=8), pad)
    world["backend"].sync_weights(model.policy)
    fresh_max, fresh_mean = logp_gap(model, engine(world).run(records, seed=8), pad)
    print(f"\nlog-prob gap after PPO update + sync: max {fresh_max:.2e} mean {fresh_mean:.2e} "
          f"(unsynced engine: max {stale_max:.2e})")
    assert stale_max > 100 * LOGP_TOL  # the update moved the policy; the check below can fail
    assert fresh_max < LOGP_TOL
    world["backend"].sync_weights(world["model"].policy)


def test_a_lora_policy_is_served_with_its_adapters_merged(world):
    from models.pretrained import LoraSpec, apply_lora

    model = apply_lora(copy.deepcopy(world["model"]), LoraSpec(r=4, alpha=8, dropout=0.0,
                                                                target_modules=("q_proj", "v_proj")))
    with torch.no_grad(), preserved_rng():
        torch.manual_seed(0)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    model.eval()
    records, pad = world["splits"]["test"][:8], world["chat"].pad_token_id
    lora = engine(world, backend=backend_for(world, model)).run(records, seed=9)
    assert logp_gap(model, lora, pad)[0] < LOGP_TOL
    assert logp_gap(world["model"], lora, pad)[0] > 100 * LOGP_TOL
    # The fixture's backend takes the shared engine back with its own weights.
    assert logp_gap(world["model"], engine(world).run(records, seed=9), pad)[0] < LOGP_TOL


def test_a_bf16_engine_beside_an_fp32_trainer_samples_the_trainers_policy(world):
    """rollout.dtype=bf16: the engine holds a bf16 copy (its own engine: another dtype is another
    shape), cast from the fp32 weights at start and at every sync; its log-probs stay within
    bf16's rounding of the trainer's, and a sync after an update is seen."""
    pad, records = world["chat"].pad_token_id, world["splits"]["test"][:8]
    bf16 = VLLMBackend(world["model"].policy, max_model_len=MAX_LEN, dtype=torch.bfloat16)
    assert bf16.llm is not world["backend"].llm
    close_max, close_mean = logp_gap(world["model"], engine(world, backend=bf16).run(records, seed=4), pad)
    model = copy.deepcopy(world["model"])
    with torch.no_grad():
        for p in model.policy.parameters():
            p.mul_(1.5)  # another policy
    bf16.sync_weights(model.policy)
    after_max, after_mean = logp_gap(model, engine(world, backend=bf16).run(records, seed=4), pad)
    print(f"\nbf16 engine against the fp32 trainer: mean |gap| {close_mean:.4f}, after a sync {after_mean:.4f}")
    assert close_mean < 0.05 and after_mean < 0.05
    assert logp_gap(world["model"], engine(world, backend=bf16).run(records, seed=4), pad)[1] > 10 * close_mean


def test_a_compiled_engine_samples_the_trainers_policy_and_follows_syncs(world):
    """rollout.compile: vLLM's torch.compile on a CPU (its own engine); its log-probs match the
    trainer's as the eager engine's do, the same seed gives the same episodes, and a sync after an
    update is seen."""
    pad, records = world["chat"].pad_token_id, world["splits"]["test"][:8]
    compiled = VLLMBackend(world["model"].policy, max_model_len=MAX_LEN, compile=True)
    assert compiled.llm is not world["backend"].llm
    assert world["backend"].llm.llm_engine.vllm_config.model_config.enforce_eager
    assert not compiled.llm.llm_engine.vllm_config.model_config.enforce_eager
    a = engine(world, backend=compiled).run(records, seed=4)
    assert logp_gap(world["model"], a, pad)[0] < LOGP_TOL
    assert [t.token_ids for t in engine(world, backend=compiled).run(records, seed=4)] == [t.token_ids for t in a]
    model = copy.deepcopy(world["model"])
    with torch.no_grad():
        for p in model.policy.parameters():
            p.mul_(1.5)  # another policy
    compiled.sync_weights(model.policy)
    assert logp_gap(model, engine(world, backend=compiled).run(records, seed=4), pad)[0] < LOGP_TOL
