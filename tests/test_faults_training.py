"""Fault injection into training: divergence, foreign and reused run directories, interrupted
checkpoint swaps, and kill -9 in the middle of PPO. Each case states what must survive."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_flows import warm_dir as flows_warm  # noqa: F401  (a fixture: the flows' warm-up, on data_dir)
from test_trainer import TINY, params

from cli.main import EXIT_TRAINING_FAILED, main
from agentr1.config import Config, ConfigError, load_config
from agentr1.fsutil import atomic_dir, recover_dir
from agentr1.rl.guard import StepGuard, TrainingDiverged, assert_finite
from agentr1.rundir import LAST_DIR, MARKER, claim_run_dir
from agentr1.recipe.ppo import train_ppo
from agentr1.recipe.warmup import warmup
from agentr1.recipe.workspace import Workspace

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("faults") / "data"
    Workspace.build(load_config("conf/train.yaml", [f"data.dir={d}", *TINY]))
    return d


@pytest.fixture(scope="module")
def warm(data_dir, tmp_path_factory):
    """One tiny warm-up that the PPO cases copy (the run directory is the cases' own)."""
    out = tmp_path_factory.mktemp("warm")
    cfg = load_config("conf/train.yaml", [f"data.dir={data_dir}", f"output_dir={out}", *TINY])
    claim_run_dir(out)
    warmup(cfg, Workspace.build(cfg))
    return out


def run_with_warmup(warm: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(warm, dest)
    return dest


def overrides(data_dir, out, *extra) -> list[str]:
    return [f"data.dir={data_dir}", f"output_dir={out}", *TINY, *extra]


# ----------------------------------------------------------------------------- config and defaults


@pytest.mark.parametrize("bad", ["ppo.lr=.inf", "ppo.lr=.nan", "reward.outcome_em=.nan", "sft.lr=-.inf",
                                 "reward.process_new_support=.inf"])
def test_config_numbers_must_be_finite(bad):
    with pytest.raises(ConfigError, match=bad.split("=")[0]):
        load_config("conf/train.yaml", [bad])


def test_the_pydantic_defaults_are_the_default_run():
    assert Config() == load_config("conf/train.yaml")


# ----------------------------------------------------------------------------- the divergence guard


def test_guard_skips_non_finite_steps_and_stops_after_n_in_a_row():
    guard = StepGuard(max_in_row=3, where="PPO iteration 7")
    assert guard.ok(1.0, 0.5)
    assert not guard.ok(math.nan, None) and not guard.ok(1.0, math.inf)
    assert guard.ok(0.3, 1.0)  # a finite step breaks the streak
    assert guard.take_skipped() == 2 and guard.take_skipped() == 0
    assert not guard.ok(math.inf) and not guard.ok(math.nan)
    with pytest.raises(TrainingDiverged, match="PPO iteration 7: 3 optimizer steps in a row"):
        guard.ok(math.nan)


def test_a_nan_model_is_never_written(tmp_path):
    from models.policy import save_actor_critic

    layer = torch.nn.Linear(2, 2)
    assert_finite(layer, "fine")
    with torch.no_grad():
        layer.weight[0, 1] = math.nan
    with pytest.raises(TrainingDiverged, match="'weight' is not finite"):
        assert_finite(layer, "x")

    class Fake(torch.nn.Module):  # save_actor_critic must refuse before touching the tokenizer
        def __init__(self):
            super().__init__()
            self.value_head = layer

    with pytest.raises(TrainingDiverged):
        save_actor_critic(Fake(), None, tmp_path / "policy")
    assert not (tmp_path / "policy").exists() and not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_huge_learning_rate_exits_non_zero_and_keeps_only_finite_checkpoints(data_dir, warm, tmp_path, capsys):
    out = run_with_warmup(warm, tmp_path / "run")
    code = main(["train", "--config", "conf/train.yaml", "--stage", "ppo", *sum(
        (["-o", o] for o in overrides(data_dir, out, "ppo.iterations=6", "ppo.lr=1e30")), [])])
    err = capsys.readouterr().err
    assert code == EXIT_TRAINING_FAILED, err
    assert "training stopped: PPO iteration" in err
    if (out / LAST_DIR).exists():  # whatever was checkpointed before the stop is finite
        saved = load_file(out / LAST_DIR / "policy" / "model.safetensors")
        assert all(torch.isfinite(t).all() for t in saved.values())
        assert json.loads((out / LAST_DIR / "state.json").read_text())["iteration"] < 6
    assert not (out / "final").exists(), "a diverged run wrote final/"
    warm_weights = load_file(out / "warmup" / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in warm_weights.values())


# ----------------------------------------------------------------------------- rollout batches


def test_the_batch_check_names_each_broken_rule_and_episode():
    from test_store import make_trajectories

    from agentr1.rollout.checks import RolloutBatchError, check_batch

    good = make_trajectories()
    check_batch(good, max_length=64, reward_bounds=(-2.0, 2.0))
    bad = make_trajectories()
    bad[0].outcome_reward = math.nan
    bad[1].action_mask = bad[1].action_mask[:-1]
    with pytest.raises(RolloutBatchError) as info:
        check_batch(bad, max_length=64, reward_bounds=(-2.0, 2.0))
    msg = str(info.value)
    assert "episode 0 (train-00001): outcome_reward and process_rewards are finite" in msg
    assert "episode 1 (train-00002): token_ids, action_mask and rollout_logprobs have the same length" in msg
    with pytest.raises(RolloutBatchError, match="<= 8"):
        check_batch(good, max_length=8, reward_bounds=(-2.0, 2.0))
    with pytest.raises(RolloutBatchError, match="empty"):
        check_batch([], max_length=64, reward_bounds=(-2.0, 2.0))


@pytest.mark.slow
def test_a_corrupt_batch_stops_agentr1_train_before_its_update(data_dir, warm, tmp_path, monkeypatch, capsys):
    from agentr1.recipe.ppo import PPOSession

    collect = PPOSession.collect

    def corrupted(self):
        trajs = collect(self)
        trajs[1].process_rewards[0] = 1e6
        return trajs

    monkeypatch.setattr(PPOSession, "collect", corrupted)
    out = run_with_warmup(warm, tmp_path / "run")
    code = main(["train", "--config", "conf/train.yaml", "--stage", "ppo",
                 *sum((["-o", o] for o in overrides(data_dir, out, "ppo.iterations=2")), [])])
    assert code == EXIT_TRAINING_FAILED
    assert "PPO iteration 1: 1 rollout rule violation" in capsys.readouterr().err
    # no PPO checkpoint, no final policy: only the warm-up's dev score, kept as the best so far
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["best"] and not (out / "final").exists()


@pytest.mark.slow
def test_a_resumed_run_goes_on_counting_non_finite_steps_in_a_row(data_dir, warm, tmp_path):
    """The guard's count of skipped steps in a row is part of the checkpoint: a run one skipped
    step from stopping must not get a fresh allowance by being resumed."""
    from agentr1.recipe.ppo import PPOSession, run_ppo

    out = run_with_warmup(warm, tmp_path / "run")
    cfg = load_config("conf/train.yaml", overrides(data_dir, out, "ppo.iterations=2"))
    ws = Workspace.build(cfg)
    session = run_ppo(PPOSession(cfg, ws), 1)
    session.guard.in_row = cfg.max_nonfinite_steps - 1
    session.save()
    resumed = PPOSession(cfg, ws)
    assert resumed.iteration == 1 and resumed.guard.in_row == cfg.max_nonfinite_steps - 1
    with pytest.raises(TrainingDiverged, match="in a row"):
        resumed.guard.ok(float("nan"))


# ----------------------------------------------------------------------------- run directories


def test_a_foreign_directory_with_run_outputs_is_refused_and_left_alone(data_dir, tmp_path, capsys):
    foreign = tmp_path / "thesis"
    foreign.mkdir()
    (foreign / "summary.json").write_text('{"mine": true}')
    (foreign / "final").mkdir()
    (foreign / "final" / "notes.txt").write_text("precious")
    code = main(["train", "--config", "conf/train.yaml", *sum((["-o", o] for o in overrides(data_dir, foreign)), [])])
    assert code == 2 and "was not made by agentr1" in capsys.readouterr().err
    assert sorted(p.name for p in foreign.iterdir()) == ["final", "summary.json"]
    assert (foreign / "final" / "notes.txt").read_text() == "precious"


@pytest.mark.parametrize("name", ["results.md", "curves.png", "efficiency.json", "suite.json", "registry"])
def test_a_directory_with_an_ablation_or_suite_report_is_not_claimed(tmp_path, name):
    """An ablation's or a suite's tables, and fetched policies, are run outputs too: a directory
    of the user's holding one is refused, as one holding summary.json is."""
    foreign = tmp_path / "chapter4"
    foreign.mkdir()
    (foreign / name).write_text("mine")
    with pytest.raises(ConfigError, match="was not made by agentr1"):
        claim_run_dir(foreign)
    assert [p.name for p in foreign.iterdir()] == [name] and (foreign / name).read_text() == "mine"


def test_training_without_a_train_split_is_refused_before_any_write(data_dir, tmp_path, capsys):
    import shutil

    data = Path(shutil.copytree(data_dir, tmp_path / "data"))
    (data / "qa" / "train.jsonl").unlink()  # a dev-only dataset of the user's validates, but cannot train
    (data / ".agentr1-dataset").unlink()  # (with the generator's marker, the generator would complete it)
    out = tmp_path / "run"
    assert main(["train", "--config", "conf/train.yaml", *sum((["-o", o] for o in overrides(data, out)), [])]) == 2
    assert "train.jsonl: no train split" in capsys.readouterr().err
    assert not out.exists()


def test_ppo_without_a_warm_up_says_to_warm_up_first(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--config", "conf/train.yaml", "--stage", "ppo", *sum((["-o", o] for o in overrides(data_dir, out)), [])])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"agentr1: error: {out / 'warmup'}: no warm-up to start PPO from; run the warm-up first" in err
    assert "Traceback" not in err and not (out / "checkpoints").exists()


def test_real_data_is_demonstrated_and_a_record_it_cannot_be_is_refused_before_any_write(tmp_path, capsys):
    """Converted HotpotQA has no relation chains (that was a KeyError deep in the warm-up, after
    the run directory was made): its demonstrations are gold searches of each record's supporting
    titles. A record without supporting documents cannot be demonstrated: refused, by file, line
    and field, before anything is written."""
    from test_convert import HOTPOT, needs_real

    from agentr1.env.episodes import run_episodes
    from agentr1.recipe.warmup import check_demonstrable

    if needs_real.args[0]:
        pytest.skip(needs_real.kwargs["reason"])
    data, out = tmp_path / "hotpot", tmp_path / "run"
    assert main(["data", "convert", "--format", "hotpotqa", "--input", str(HOTPOT), "--out", str(data),
                 "--test-fraction", "0.2"]) == 0
    capsys.readouterr()
    cfg = load_config("conf/train.yaml", [f"data.dir={data}", f"output_dir={out}"])
    ws = Workspace.build(cfg)
    check_demonstrable(cfg, ws)  # every converted record: its supporting titles, then its answer
    (t,) = run_episodes(ws.env, ws.env.demonstrator(cfg.sft.expert, 0), ws.split("train")[:1])
    assert t.metrics["support_recall"] > 0 and t.turn_texts[-1].startswith("<answer>")
    train = data / "qa" / "train.jsonl"
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    rows[0]["supporting_docs"] = []
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = main(["train", "--config", "conf/train.yaml", "-o", f"data.dir={data}", "-o", f"output_dir={out}"])
    assert code == 2
    assert "train.jsonl:1: field 'supporting_docs'" in capsys.readouterr().err
    assert not out.exists()


def test_a_directory_without_run_outputs_becomes_ours(tmp_path):
    d = tmp_path / "dvc"
    d.mkdir()
    (d / "validation.json").write_text("{}")  # what the DVC validate stage leaves there first
    claim_run_dir(d)
    assert (d / MARKER).is_file() and (d / "validation.json").read_text() == "{}"
    claim_run_dir(d)  # ours now: claiming again is fine


@pytest.mark.slow
def test_a_checkpoint_is_resumed_only_with_its_own_configuration(data_dir, warm, tmp_path):
    out = run_with_warmup(warm, tmp_path / "run")
    cfg = load_config("conf/train.yaml", overrides(data_dir, out, "ppo.iterations=1"))
    ws = Workspace.build(cfg)
    train_ppo(cfg, ws)
    other = load_config("conf/train.yaml", overrides(data_dir, out, "ppo.iterations=2", "ppo.lr=3e-4"))
    with pytest.raises(ConfigError, match=r"ppo\.lr \(0\.0001 then, 0\.0003 now\)"):
        train_ppo(other, ws)
    # More iterations of the same configuration is a resume, not another experiment.
    longer = load_config("conf/train.yaml", overrides(data_dir, out, "ppo.iterations=2"))
    assert len(train_ppo(longer, ws)[3]) == 2


def test_a_warm_up_is_reused_only_with_its_own_configuration(data_dir, warm, tmp_path):
    from agentr1.recipe.warmup import finished_warmup

    out = run_with_warmup(warm, tmp_path / "run")
    same = load_config("conf/train.yaml", overrides(data_dir, out, "ppo.lr=3e-4"))  # PPO keys do not matter
    assert finished_warmup(same) == out / "warmup"
    with pytest.raises(ConfigError, match="sft.steps"):
        finished_warmup(load_config("conf/train.yaml", overrides(data_dir, out, "sft.steps=5")))
    # The value head was fitted to the demonstrations' returns: other reward weights, another warm-up.
    with pytest.raises(ConfigError, match="reward.format_answer"):
        finished_warmup(load_config("conf/train.yaml", overrides(data_dir, out, "reward.format_answer=0")))


def test_reward_weights_belong_to_a_warm_up_only_through_its_value_fit():
    from agentr1.rundir import check_same_config, warmup_identity

    fitted = load_config("conf/train.yaml", ["sft.value_fit_episodes=64"])
    assert "reward.outcome_em" in warmup_identity(fitted)
    no_fit = load_config("conf/train.yaml", ["sft.value_fit_episodes=0"])  # as GRPO presets have it
    recorded = {**warmup_identity(no_fit), "reward.process_new_support": 0.1}  # as written before this rule
    outcome_only = load_config("conf/train.yaml", ["sft.value_fit_episodes=0", "reward.process_new_support=0",
                                                   "reward.format_answer=0"])
    assert not any(k.startswith("reward.") for k in warmup_identity(outcome_only))
    check_same_config(warmup_identity(outcome_only, recorded), warmup_identity(outcome_only), Path("w"), "")
    with pytest.raises(ConfigError, match="sft.lr"):
        check_same_config(warmup_identity(outcome_only, {**recorded, "sft.lr": 1.0}),
                          warmup_identity(outcome_only), Path("w"), "")


# ----------------------------------------------------------------------------- interrupted swaps


def _swap_interrupted_between_renames(final: Path) -> None:
    """What a kill -9 between replace_dir's two renames leaves: the old version aside, the new
    one complete in its temporary, nothing under the final name."""
    aside = final.parent / f".{final.name}.old-x1"
    aside.mkdir()
    os.rename(final, aside / "data")
    tmp = final.parent / f".{final.name}.tmp-x2"
    tmp.mkdir()
    (tmp / "v").write_text("new")


def _slow_writer(final: str, delay: float, out: str) -> None:
    def write(tmp: Path) -> None:
        (tmp / "a.jsonl").write_text("x\n")
        time.sleep(delay)  # still writing (a dataset being checked) when the other process starts
        (tmp / "b.jsonl").write_text("y\n")

    try:
        atomic_dir(final, write)
        Path(out).write_text("ok")
    except BaseException as err:  # noqa: BLE001 - reported to the test
        Path(out).write_text(f"{type(err).__name__}: {err}")


def test_two_processes_writing_one_directory_take_turns(tmp_path):
    """A second writer of the same directory (a nightly retrain and a manual pipeline making the
    same data.dir) once cleared the first one's half-written temporary as a leftover, and the first
    failed with FileNotFoundError: both now finish, one after the other, and leave one whole copy."""
    import multiprocessing

    final, ctx = tmp_path / "data", multiprocessing.get_context("fork")
    first = ctx.Process(target=_slow_writer, args=(str(final), 3.0, str(tmp_path / "a.out")))
    first.start()
    deadline = time.time() + 60
    while not list(tmp_path.glob(".data.tmp-*")) and time.time() < deadline:  # the first is mid-write
        time.sleep(0.05)
    second = ctx.Process(target=_slow_writer, args=(str(final), 0.0, str(tmp_path / "b.out")))
    second.start()
    first.join(60)
    second.join(60)
    assert (tmp_path / "a.out").read_text() == (tmp_path / "b.out").read_text() == "ok"
    assert sorted(p.name for p in final.iterdir()) == ["a.jsonl", "b.jsonl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.out", "b.out", "data"]


def test_recover_dir_puts_the_old_version_back_and_removes_leftovers(tmp_path):
    final = atomic_dir(tmp_path / "last", lambda d: (d / "v").write_text("old"))
    _swap_interrupted_between_renames(final)
    assert not final.exists()
    recover_dir(final)
    assert (final / "v").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]
    # After the second rename (only the old copy left): the new version stays, the old goes.
    aside = tmp_path / ".last.old-x3"
    (aside / "data").mkdir(parents=True)
    recover_dir(final)
    assert (final / "v").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["last"]
    # A name with glob characters matches only its own leftovers: `data[2]` is not `data2`.
    other = tmp_path / ".data2.tmp-x"  # another directory's write in progress
    other.mkdir()
    (tmp_path / ".data2.old-y" / "data").mkdir(parents=True)
    recover_dir(tmp_path / "data[2]")
    assert not (tmp_path / "data[2]").exists() and other.is_dir() and (tmp_path / ".data2.old-y" / "data").is_dir()


@pytest.mark.slow
def test_resume_from_either_side_of_an_interrupted_checkpoint_swap(data_dir, warm, tmp_path):
    one = run_with_warmup(warm, tmp_path / "one")
    cfg = load_config("conf/train.yaml", overrides(data_dir, one, "ppo.iterations=3"))
    ws = Workspace.build(cfg)
    reference = params(train_ppo(cfg, ws)[0])

    two = run_with_warmup(warm, tmp_path / "two")
    cfg2 = load_config("conf/train.yaml", overrides(data_dir, two, "ppo.iterations=3"))
    train_ppo(cfg2, ws, stop_after=2)
    _swap_interrupted_between_renames(two / LAST_DIR)  # the swap to iteration 3's checkpoint died
    resumed = params(train_ppo(cfg2, ws)[0])
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == ["best", "last"]  # nothing half-swapped left


# ----------------------------------------------------------------------------- kill -9


def _train_cmd(data_dir, out, iterations: int) -> list[str]:
    args = [sys.executable, "-m", "cli", "train", "--config", "conf/train.yaml", "--stage", "ppo"]
    for o in overrides(data_dir, out, f"ppo.iterations={iterations}", "rollout.backend=hf"):
        args += ["-o", o]
    return args


@pytest.mark.slow
def test_kill_9_during_ppo_then_the_same_command_ends_bit_identical(data_dir, warm, tmp_path):
    iterations = 4
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    whole = run_with_warmup(warm, tmp_path / "whole")
    subprocess.run(_train_cmd(data_dir, whole, iterations), cwd=REPO, env=env, check=True, capture_output=True)

    killed = run_with_warmup(warm, tmp_path / "killed")
    proc = subprocess.Popen(_train_cmd(data_dir, killed, iterations), cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = killed / LAST_DIR / "state.json"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if state.exists() and json.loads(state.read_text())["iteration"] >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert json.loads(state.read_text())["iteration"] < iterations
    subprocess.run(_train_cmd(data_dir, killed, iterations), cwd=REPO, env=env, check=True, capture_output=True)

    a = load_file(whole / "final" / "model.safetensors")
    b = load_file(killed / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["best", "last"]


# ----------------------------------------------------------------------------- the pipeline


@pytest.mark.slow
def test_a_diverged_one_iteration_pipeline_fails_tagged_and_registers_nothing(prefect_api, data_dir, flows_warm,
                                                                              tmp_path):
    from test_flows import form, registry_state, run_failing, seeded_run

    from flows.pipeline import pipeline
    from adapters import tracking

    before = registry_state()
    run = seeded_run(tmp_path, flows_warm)
    error, _ = run_failing(pipeline, form(data_dir, run, "ppo.iterations=1", "ppo.lr=1e30"))
    assert isinstance(error, TrainingDiverged) and "PPO iteration 1" in str(error)
    assert registry_state() == before, "a diverged run registered a model or moved the champion"
    assert not (run / "final").exists() and not (run / LAST_DIR).exists()
    runs = tracking.client().search_runs([tracking.experiment_id(tracking.EXPERIMENTS["pipeline"])],
                                         order_by=["attributes.start_time DESC"], max_results=1)
    assert "PPO iteration 1" in runs[0].data.tags[tracking.TAG_DIVERGED]


@pytest.mark.slow
def test_the_pipeline_command_says_a_divergence_in_one_line_and_exits_3(prefect_api, data_dir, flows_warm,
                                                                        tmp_path, capsys, monkeypatch):
    """`agentr1 pipeline` answers a divergence as `agentr1 train` does: exit 3, one line, no
    traceback from Prefect's logs (`agentr1 --traceback` keeps it)."""
    from prefect.settings import PREFECT_API_URL
    from test_flows import FAST, seeded_run

    from cli.main import EXIT_TRAINING_FAILED, main

    monkeypatch.setenv("PREFECT_API_URL", PREFECT_API_URL.value())
    run = seeded_run(tmp_path, flows_warm)
    overrides = [f"data.dir={data_dir}", *TINY, *FAST, "ppo.iterations=1", "ppo.lr=1e30"]
    code = main(["pipeline", "--output-dir", str(run), *[x for o in overrides for x in ("-o", o)]])
    err = capsys.readouterr().err
    assert code == EXIT_TRAINING_FAILED
    assert err.strip().splitlines()[-1].startswith("agentr1: error: training stopped: PPO iteration 1")
    assert "Traceback" not in err
