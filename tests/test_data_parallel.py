"""Data-parallel PPO (agentr1/rl/distributed.py): one update on 2 processes, started the way a user
starts them (``accelerate launch --multi_gpu --num_processes 2``, gloo on CPU), gives the parameters
of the same update on 1 process, on the same global batch.

The batch (10 episodes, minibatches of 3, 2 epochs) makes the processes' shares uneven in tokens,
and its last minibatch of each epoch has one row, so one process holds none of it. Plain SGD with
clipping out of the way: the parameters move by the summed gradients themselves, so a wrong
normalisation (a mean of per-process token means, gradients averaged instead of summed) shows.

This file is also the worker script the test launches (``__main__`` below).
"""
from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CASES = {  # config overrides of each update checked: a critic with global whitening, and GRPO groups
    # with every trajectory weighing the same (each process's share counts rows, not tokens)
    "gae": ["ppo.estimator=gae", "ppo.whiten_advantages=true"],
    "grpo": ["ppo.estimator=grpo", "ppo.group_size=2", "ppo.episodes_per_iter=10", "ppo.loss_weighting=trajectory"],
}
COMMON = ["ppo.epochs=2", "ppo.minibatch_size=3", "ppo.max_grad_norm=1e6", "ppo.kl_coef=0.05",
          "ppo.entropy_coef=0.01"]
LR = 0.05
TOL = 1e-5


def fixed_batch(vocab: int, n: int = 10):
    """``n`` episodes of 2 turns with varied lengths, rewards and log-probs (seeded)."""
    from agentr1.rollout.batch import collate
    from agentr1.episode import Trajectory

    g = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(n):
        prompt, act1, obs, act2 = (int(torch.randint(lo, hi, (1,), generator=g))
                                   for lo, hi in ((4, 9), (2, 7), (3, 10), (2, 9)))
        length = prompt + act1 + obs + act2
        ids = torch.randint(3, vocab, (length,), generator=g).tolist()
        mask = [0] * prompt + [1] * act1 + [0] * obs + [1] * act2
        logps = [(-3 * float(torch.rand(1, generator=g))) if m else 0.0 for m in mask]
        trajs.append(Trajectory(f"q{i // 2}", ids, mask, logps, prompt,
                                turn_ends=[prompt + act1 - 1, length - 1],
                                process_rewards=[0.1 * float(torch.randn(1, generator=g))] * 2,
                                outcome_reward=float(torch.rand(1, generator=g) < 0.5), group=i // 2))
    return collate(trajs, pad_token_id=0)


@functools.cache
def tiny_tokenizer():
    from models.tokenizer import build_tokenizer

    return build_tokenizer([f"question {i} answer {i * 7} search the corpus" for i in range(50)], vocab_size=300)


def tiny_policy(seed: int):
    from agentr1.config import ModelConfig
    from models.policy import ModelSpec, build_policy

    spec = ModelSpec.from_config(ModelConfig(), hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2,
                                 intermediate_size=64, max_position_embeddings=64)
    return build_policy(spec, tiny_tokenizer(), seed=seed)


def one_update(case: str, *extra: str) -> dict:
    """Score the fixed batch and run one PPO update on it with whatever processes are running;
    returns the parameters after it and the update's metrics."""
    from agentr1.config import load_config
    from agentr1.rl.guard import StepGuard
    from agentr1.rl.ppo import ppo_update, score_batch
    from agentr1.rl.distributed import make_accelerator
    from agentr1.recipe.ppo import ppo_hyper

    hp = ppo_hyper(load_config(None, [*COMMON, *CASES[case], *extra]))
    model, ref = tiny_policy(seed=0), tiny_policy(seed=1)
    ref.eval().requires_grad_(False)
    batch = fixed_batch(len(tiny_tokenizer()))
    acc = make_accelerator(torch.device("cpu"), "no")
    model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=LR))
    model.eval()
    scored, _ = score_batch(model, ref, batch, hp, acc)
    model.train()
    metrics = ppo_update(model, optimizer, acc, batch, scored, hp, torch.Generator().manual_seed(3),
                         StepGuard(max_in_row=1))
    return {"params": params_of(acc.unwrap_model(model)), "metrics": metrics, "world": acc.num_processes}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradient_accumulation_splits_a_minibatch_and_steps_once(case):
    """ppo.grad_accum cuts each minibatch (3 rows) into micro-batches whose gradients add up to
    the minibatch's: the same update, step for step, as without it (it once counted whole
    minibatches as accelerate's steps, so the optimizer stepped every grad_accum-th minibatch)."""
    whole, split = one_update(case), one_update(case, "ppo.grad_accum=3")
    assert split["metrics"]["actor/n_updates"] == whole["metrics"]["actor/n_updates"] > 0
    for k in ("actor/grad_norm", "actor/pg_loss", "critic/vf_loss"):
        assert abs(split["metrics"][k] - whole["metrics"][k]) <= TOL * max(1.0, abs(whole["metrics"][k])), k
    for name, value in whole["params"].items():
        assert torch.allclose(split["params"][name], value, atol=TOL), name
    assert any(not torch.equal(whole["params"][k], v) for k, v in params_of(tiny_policy(seed=0)).items())


@pytest.mark.parametrize("masks", [("ppo.loss_mask=true", "ppo.advantage_mask=false"),
                                   ("ppo.loss_mask=false", "ppo.advantage_mask=true")])
def test_gradient_accumulation_holds_when_the_two_masks_differ(masks):
    """With one mask off the actor averages over the loss mask and the critic over the advantage
    positions: each part of a micro-batch weighs by its share of its own positions. (Weighing both
    by the loss-mask share made the mask ablations' critic depend on grad_accum and on the number of
    processes: parameters 4e-3 apart, vf_loss 0.099 against 0.090.)"""
    whole, split = one_update("gae", *masks), one_update("gae", *masks, "ppo.grad_accum=3")
    for k in ("actor/grad_norm", "actor/pg_loss", "critic/vf_loss"):
        assert abs(split["metrics"][k] - whole["metrics"][k]) <= TOL * max(1.0, abs(whole["metrics"][k])), k
    for name, value in whole["params"].items():
        assert torch.allclose(split["params"][name], value, atol=TOL), name


@pytest.mark.parametrize("loss_mask,advantage_mask", [(True, False), (False, True)])
def test_the_critic_learns_where_the_advantages_read_it(loss_mask, advantage_mask):
    """The value loss covers the advantage positions, not the loss mask's: with the advantage mask
    off, GAE reads values at tool-response tokens, which the critic must then learn (they were
    never trained); with it on, the zero returns at tool tokens are not targets. Advantages are
    whitened over the tokens that learn from them."""
    from agentr1.config import load_config
    from agentr1.rl.core import masked_mean, masked_var, value_loss
    from agentr1.rl.ppo import STEP_METRICS, minibatch_loss, score_batch
    from agentr1.recipe.ppo import ppo_hyper

    hp = ppo_hyper(load_config(None, [*COMMON, *CASES["gae"], f"ppo.loss_mask={str(loss_mask).lower()}",
                                      f"ppo.advantage_mask={str(advantage_mask).lower()}"]))
    model, ref = tiny_policy(seed=0).eval(), tiny_policy(seed=1).eval()
    batch = fixed_batch(len(tiny_tokenizer()))
    with torch.no_grad():
        scored, _ = score_batch(model, ref, batch, hp)
        losses = batch.action_mask if loss_mask else batch.response_mask
        _, _, values = minibatch_loss(model, batch, scored, hp, list(range(len(batch))), batch.input_ids.shape[1], losses)
    critic = batch.action_mask if advantage_mask else batch.response_mask
    tool_tokens = batch.response_mask - batch.action_mask
    # eval mode, same weights: the values are the old values, the loss 0.5 * mean (V - R)^2 over `critic`
    expected, _ = value_loss(scored.old_values, scored.old_values, scored.returns, critic, hp.vf_clip)
    wrong, _ = value_loss(scored.old_values, scored.old_values, scored.returns, losses, hp.vf_clip)
    assert dict(zip(STEP_METRICS, values))["critic/vf_loss"] == pytest.approx(float(expected), rel=1e-5)
    assert float(wrong) != pytest.approx(float(expected), rel=1e-3)
    learners = critic * losses
    assert float(masked_mean(scored.advantages, learners)) == pytest.approx(0.0, abs=1e-5)
    assert float(masked_var(scored.advantages, learners)) == pytest.approx(1.0, abs=1e-3)
    assert float((scored.advantages * tool_tokens).abs().sum()) == 0.0


def params_of(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_one_update_on_two_processes_equals_one_process(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), __file__, str(tmp_path)]
    launch = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    single = {case: one_update(case) for case in CASES}  # while the two processes start
    _, err = launch.communicate(timeout=300)
    assert launch.returncode == 0, err[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    start = params_of(tiny_policy(seed=0))
    for case in CASES:
        one, two = single[case], ranks[0][case]
        assert one["world"] == 1 and two["world"] == 2
        moved = max(float((one["params"][k] - start[k]).abs().max()) for k in start)
        assert moved > 100 * TOL, f"{case}: the update barely moved the parameters ({moved})"
        for k, v in one["params"].items():
            gap = float((two["params"][k] - v).abs().max())
            assert gap <= TOL, f"{case}: {k} differs by {gap} between 2 processes and 1"
            assert torch.equal(ranks[1][case]["params"][k], two["params"][k]), f"{case}: ranks disagree on {k}"
        assert two["metrics"]["actor/n_updates"] == one["metrics"]["actor/n_updates"] == 8
        for k, v in one["metrics"].items():
            assert abs(two["metrics"][k] - v) <= TOL * max(1.0, abs(v)), f"{case}: metric {k}"


def test_stages_other_than_ppo_are_refused_under_several_processes(tmp_path, monkeypatch):
    from agentr1.config import ConfigError, load_config
    from agentr1.recipe.stages import train

    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun tells each process it starts
    cfg = load_config(None, [f"output_dir={tmp_path / 'run'}", f"data.dir={tmp_path / 'data'}"])
    with pytest.raises(ConfigError, match=r"\['evaluate', 'warmup'\] run in one process"):
        train(cfg, stages=("warmup", "ppo", "evaluate"))
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()


def test_a_launch_that_started_one_process_of_several_is_named(monkeypatch, caplog):
    from agentr1.rl.distributed import make_accelerator

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # accelerate launch --cpu --num_processes 2, no MPI
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with caplog.at_level("WARNING", logger="agentr1.train"):
        assert make_accelerator(torch.device("cpu"), "no").num_processes == 1
    assert "--multi_gpu --num_processes" in caplog.text


if __name__ == "__main__":  # the worker: each process saves what its update gave
    results = {case: one_update(case) for case in CASES}
    rank = int(os.environ.get("RANK", "0"))
    torch.save(results, Path(sys.argv[1]) / f"rank{rank}.pt")
