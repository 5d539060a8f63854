"""The training recipe end to end on a tiny world: warm-up, PPO, resume, evaluation, CLI."""
from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from cli.main import main
from agentr1.config import ConfigError, load_config
from agentr1.data.records import load_corpus_dir
from agentr1.recipe.ppo import train_ppo
from agentr1.recipe.stages import train
from agentr1.recipe.warmup import corpus_rows, demonstrations_needed, warmup
from agentr1.recipe.workspace import Workspace

TINY = [
    "data.synth.n_train=48", "data.synth.n_dev=4", "data.synth.n_test=12",
    "model.vocab_size=700", "model.hidden_size=32", "model.num_layers=2", "model.num_heads=2",
    "model.num_kv_heads=2", "model.intermediate_size=64",
    "sft.episodes=48", "sft.corpus_steps=2", "sft.steps=4", "sft.batch_size=8", "sft.warmup_steps=1",
    "ppo.iterations=4", "ppo.episodes_per_iter=8", "ppo.minibatch_size=4", "ppo.checkpoint_every=1",
    "env.max_turn_tokens=16", "env.max_context_tokens=300", "eval.render_examples=1",
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data") / "synth"
    Workspace.build(load_config("conf/train.yaml", [f"data.dir={d}", *TINY]))
    return d


def tiny_config(data_dir, out, *extra):
    return load_config("conf/train.yaml", [f"data.dir={data_dir}", f"output_dir={out}", *TINY, *extra])


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_resume_gives_the_same_parameters_as_one_run(data_dir, tmp_path):
    one = tiny_config(data_dir, tmp_path / "one")
    ws = Workspace.build(one)
    warm, _, _ = warmup(one, ws)
    warm_params = params(warm)
    model_a, _, _, hist_a = train_ppo(one, ws)

    two = tiny_config(data_dir, tmp_path / "two")
    shutil.copytree(tmp_path / "one" / "warmup", tmp_path / "two" / "warmup")
    train_ppo(two, ws, stop_after=2)
    assert json.loads((tmp_path / "two/checkpoints/last/state.json").read_text())["iteration"] == 2
    model_b, _, _, hist_b = train_ppo(two, ws)  # resumes from iteration 2

    a, b = params(model_a), params(model_b)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed run diverged from the uninterrupted one"
    assert any(not torch.equal(a[k], warm_params[k]) for k in a), "PPO changed nothing"
    assert [h["rollout/em"] for h in hist_a] == [h["rollout/em"] for h in hist_b]
    assert len(hist_b) == 4


def test_corpus_rows_hold_only_documents_of_training_questions(data_dir, tmp_path):
    from models.tokenizer import build_tokenizer

    cfg = tiny_config(data_dir, tmp_path)
    ws = Workspace.build(cfg)
    texts = {d.id: d.text for d in load_corpus_dir(data_dir)}
    tok = build_tokenizer(list(texts.values()), vocab_size=400)
    rows = corpus_rows(ws, tok, block=16)
    packed = tok.decode(rows.flatten().tolist())
    train_docs = {d for r in ws.splits["train"] for d in r.supporting_docs}
    held_out = {d for s in ("dev", "test") for r in ws.splits[s] for d in r.supporting_docs} - train_docs
    assert held_out and rows.shape[1] == 16
    assert not any(texts[d] in packed for d in held_out)
    assert sum(texts[d] in packed for d in train_docs) >= len(train_docs) - 2  # the tail row may be cut


def test_a_dataset_without_supporting_documents_skips_the_corpus_steps(data_dir, tmp_path, caplog):
    """A plug-in's environment without a corpus, trained with the default recipe (corpus steps
    on): the warm-up says it skips them and trains on the demonstrations alone (it crashed in the
    tokenizer on an empty text list)."""
    import dataclasses

    cfg = tiny_config(data_dir, tmp_path, "sft.corpus_steps=3", "sft.steps=2")
    ws = Workspace.build(cfg)
    ws.splits["train"] = [dataclasses.replace(r, supporting_docs=[]) for r in ws.splits["train"]]
    with caplog.at_level("WARNING", logger="agentr1"):
        _, tokenizer, _ = warmup(cfg, ws)
    assert corpus_rows(ws, tokenizer, block=16) is None
    stats = json.loads(next(tmp_path.glob("warmup/*stats*.json")).read_text())
    assert stats["corpus_steps"] == 0 and stats["steps"] == 2
    assert "sft.corpus_steps=3 skipped" in caplog.text


@pytest.mark.slow
def test_train_writes_summary_checkpoints_plot_and_trajectories(data_dir, tmp_path):
    cfg = tiny_config(data_dir, tmp_path / "run", "ppo.iterations=2", "sft.corpus_steps=2")
    summary = train(cfg)
    out = tmp_path / "run"
    for name in ("warmup/config.json", "warmup/value_head.safetensors", "final/config.json",
                 "checkpoints/last/trainer_state.pt", "learning_curve.png", "metrics.jsonl",
                 "eval_warmup.json", "eval_final.json", "trajectories_final.txt", "summary.json"):
        assert (out / name).exists(), name
    for mode in ("greedy", "sampled"):
        assert 0.0 <= summary["final"][f"{mode}/em"] <= 1.0
        assert f"{mode}/hops1/em" in summary["final"]
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [h["iteration"] for h in history] == [1.0, 2.0]
    for key in ("actor/ref_kl", "actor/pg_clipfrac", "actor/entropy", "critic/vf_loss",
                "critic/explained_variance", "reward/process", "perf/update_tokens_per_s"):
        assert key in history[0], key
    text = (out / "trajectories_final.txt").read_text()
    assert "⟦env" in text and "▶" in text
    assert json.loads((out / "warmup/warmup_stats.json").read_text())["corpus_steps"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_pp"])
def test_critic_free_estimators_run_with_the_masks_off(data_dir, tmp_path, estimator):
    cfg = tiny_config(data_dir, tmp_path, f"ppo.estimator={estimator}", "ppo.group_size=4",
                      "ppo.iterations=1", "ppo.loss_mask=false", "ppo.advantage_mask=false")
    ws = Workspace.build(cfg)
    warmup(cfg, ws)
    _, _, _, hist = train_ppo(cfg, ws)
    assert hist and all(torch.isfinite(torch.tensor(v)) for v in hist[0].values())


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["step_gae", "gigpo"])
def test_turn_level_estimators_train_with_the_masks_on(data_dir, tmp_path, estimator):
    cfg = tiny_config(data_dir, tmp_path, f"ppo.estimator={estimator}", "ppo.iterations=1", "ppo.group_size=4")
    ws = Workspace.build(cfg)
    warmup(cfg, ws)
    _, _, _, hist = train_ppo(cfg, ws)
    assert all(math.isfinite(v) for v in hist[0].values())
    if estimator == "step_gae":  # it trains the value head; GiGPO is critic-free (and the tiny
        # warm-up's groups may all score alike, giving it nothing to learn from here)
        assert hist[0]["critic/vf_loss"] > 0 and "critic/explained_variance" in hist[0]
        assert hist[0]["critic/advantages_abs"] > 0


def test_expert_plays_only_the_demonstrations_the_warm_up_reads():
    def needed(*overrides):
        return demonstrations_needed(load_config("conf/train.yaml", ["sft.episodes=20000", *overrides]))

    assert needed() == 20000  # trains on all of them
    assert needed("sft.steps=0", "sft.value_fit_episodes=2000") == 5000  # the tokenizer's sample
    assert needed("sft.steps=0", "sft.value_fit_episodes=8000") == 8000
    pretrained = ("model.kind=pretrained", "model.name_or_path=/some/dir", "sft.steps=0")
    assert needed(*pretrained, "sft.value_fit_episodes=300") == 300
    assert needed(*pretrained, "sft.value_fit_episodes=0") == 0  # no expert at all


def test_a_dev_split_the_data_lacks_is_named_before_anything_is_written(data_dir, tmp_path):
    from agentr1.data.records import DataError

    cfg = tiny_config(data_dir, tmp_path / "run", "ppo.dev_split=validation")  # ppo.dev_every is on by default
    with pytest.raises(DataError, match=r"validation\.jsonl.*no validation split.*ppo\.dev_every=0"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="ppo.lr"):
        load_config("conf/train.yaml", ["ppo.lr=-1"])
    with pytest.raises(ConfigError, match="ppo.no_such_knob"):
        load_config("conf/train.yaml", ["ppo.no_such_knob=1"])
    with pytest.raises(ConfigError, match="group_size"):
        load_config("conf/train.yaml", ["ppo.estimator=grpo"])
    # settings that would be read and silently do nothing
    for estimator in ("grpo", "rloo"):
        with pytest.raises(ConfigError, match="ppo.kl_in_reward: estimator .* no KL would act"):
            load_config("conf/train.yaml", [f"ppo.estimator={estimator}", "ppo.group_size=4", "ppo.kl_in_reward=true"])
    with pytest.raises(ConfigError, match="ppo.kl_in_reward: estimator 'gigpo' normalises"):
        load_config("conf/train.yaml", ["ppo.estimator=gigpo", "ppo.group_size=4", "ppo.kl_in_reward=true"])
    assert load_config("conf/train.yaml", ["ppo.kl_in_reward=true"]).ppo.kl_in_reward  # gae folds it per token
    with pytest.raises(ConfigError, match="eval.sampled_temperature"):
        load_config("conf/train.yaml", ["eval.sampled_temperature=0"])
    # the vLLM engine's bf16 copy with the hf backend: refused at load, naming the way out
    with pytest.raises(ConfigError, match="add -o rollout.dtype=auto"):
        load_config("conf/smollm2.yaml", ["rollout.backend=hf"])
    assert load_config("conf/smollm2.yaml", ["rollout.backend=hf", "rollout.dtype=auto"]).rollout.backend == "hf"


def test_cli_rejects_a_bad_override_with_exit_2(capsys):
    assert main(["train", "--config", "conf/train.yaml", "-o", "env.top_k=0"]) == 2
    assert "env.top_k" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_evaluate_prints_metrics(data_dir, tmp_path, capsys):
    cfg = tiny_config(data_dir, tmp_path / "run")
    ws = Workspace.build(cfg)
    warmup(cfg, ws)
    code = main(["evaluate", "--checkpoint", str(tmp_path / "run" / "warmup"), "--data", str(data_dir),
                 "--split", "test", "--out", str(tmp_path / "ev"), *sum((["-o", o] for o in TINY), [])])
    assert code == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["greedy/n"] == 12.0 and "sampled/em" in metrics
    assert (tmp_path / "ev" / "eval_test.json").exists()


@pytest.mark.parametrize("path", sorted(__import__("glob").glob("conf/*.yaml")))
def test_every_shipped_config_validates(path):
    cfg = load_config(path)
    assert cfg.model.kind in ("scratch", "pretrained")


def test_the_default_recipe_file_restates_the_code_defaults_exactly():
    """conf/train.yaml spells out every default for users to read and copy; agentr1/config.py is
    their one source. A value changed in one place only fails here, naming the key."""
    import yaml

    from agentr1.config import Config

    defaults = Config().model_dump(mode="json")
    mismatched, seen = [], 0

    def walk(written: dict, code: dict, path: str) -> None:
        nonlocal seen
        for key, value in written.items():
            if isinstance(value, dict) and isinstance(code.get(key), dict):
                walk(value, code[key], f"{path}{key}.")
                continue
            seen += 1
            if key not in code or code[key] != value:
                mismatched.append(f"{path}{key}: conf/train.yaml {value!r}, agentr1/config.py {code.get(key, '(none)')!r}")

    walk(yaml.safe_load(open("conf/train.yaml")), defaults, "")
    assert seen > 60 and mismatched == []


def test_auto_precision_is_bf16_only_where_the_device_has_it_natively(monkeypatch):
    from agentr1.rl import distributed

    cpu = torch.device("cpu")
    assert distributed.training_precision("bf16", cpu) == "bf16" and distributed.training_precision("no", cpu) == "no"
    for native, chosen in ((True, "bf16"), (False, "no")):
        monkeypatch.setattr(distributed, "native_bf16", lambda device, native=native: native)
        assert distributed.training_precision("auto", cpu) == chosen


STEERED = ("ppo.dev_every=2", "ppo.dev_examples=4", "ppo.kl_target=0.001", "ppo.kl_horizon=2",
           "ppo.lr_warmup_iters=2")


@pytest.mark.slow
def test_dev_selection_adaptive_kl_and_lr_warm_up_resume_exactly(data_dir, tmp_path):
    """The run's steering (dev evaluations keeping the best policy, the adaptive KL coefficient,
    the learning-rate warm-up) survives a stop and a resume: the same weights, history and best
    as one uninterrupted run; final/ is the best on dev, whose score no evaluation beat."""
    from agentr1.fsutil import MANIFEST
    from agentr1.rl.control import adapt_kl_coef

    one = tiny_config(data_dir, tmp_path / "one", *STEERED)
    ws = Workspace.build(one)
    warmup(one, ws)
    model_a, _, _, hist_a = train_ppo(one, ws)
    two = tiny_config(data_dir, tmp_path / "two", *STEERED)
    shutil.copytree(tmp_path / "one" / "warmup", tmp_path / "two" / "warmup")
    train_ppo(two, ws, stop_after=3)
    model_b, _, _, hist_b = train_ppo(two, ws)

    a, b = params(model_a), params(model_b)
    assert all(torch.equal(a[k], b[k]) for k in a), "a resumed steered run diverged from the uninterrupted one"
    def steady(history):  # what the run computed, without its timings
        return [{k: v for k, v in h.items() if not k.startswith(("time/", "perf/"))} for h in history]

    assert steady(hist_a) == steady(hist_b)
    assert [h["iteration"] for h in hist_a if "dev/score" in h] == [2.0, 4.0]
    assert [h["actor/lr"] for h in hist_a[:3]] == pytest.approx([one.ppo.lr / 2, one.ppo.lr, one.ppo.lr])
    for h, nxt in zip(hist_a, hist_a[1:]):  # the controller's closed form, iteration by iteration
        assert nxt["actor/kl_coef"] == pytest.approx(adapt_kl_coef(h["actor/kl_coef"], h["actor/ref_kl"], 0.001, 2))
    assert hist_a[0]["actor/kl_coef"] == one.ppo.kl_coef != hist_a[-1]["actor/kl_coef"]

    best_a = json.loads((tmp_path / "one/checkpoints/best/best.json").read_text())
    best_b = json.loads((tmp_path / "two/checkpoints/best/best.json").read_text())
    assert best_a == best_b
    assert best_a["score"] >= max(h["dev/score"] for h in hist_a if "dev/score" in h)
    assert best_a["iteration"] in (0, 2, 4)


@pytest.mark.slow
def test_dev_evaluations_leave_the_training_as_it_was(data_dir, tmp_path):
    """Dev selection is on by default, so it must not change what PPO learns: its episodes have
    their own seeds, and the last policy is the same with or without the evaluations."""
    plain = tiny_config(data_dir, tmp_path / "plain", "ppo.dev_every=0", "ppo.iterations=2")
    ws = Workspace.build(plain)
    warmup(plain, ws)
    model_a, _, _, hist_a = train_ppo(plain, ws)
    dev = tiny_config(data_dir, tmp_path / "dev", "ppo.dev_every=1", "ppo.dev_examples=4", "ppo.iterations=2")
    shutil.copytree(tmp_path / "plain" / "warmup", tmp_path / "dev" / "warmup")
    model_b, _, _, hist_b = train_ppo(dev, ws)
    a, b = params(model_a), params(model_b)
    assert all(torch.equal(a[k], b[k]) for k in a), "dev evaluations changed the trained weights"
    assert [h["iteration"] for h in hist_b if "dev/score" in h] == [1.0, 2.0]
    assert not any("dev/score" in h for h in hist_a)


@pytest.mark.slow
def test_final_is_the_best_on_dev_and_an_early_stop_ends_the_run(data_dir, tmp_path):
    """With dev selection the run's final/ is checkpoints/best (selected.json names the iteration,
    summary.json too); a KL stop ends the run at the first batch with any KL (the second: the first
    is sampled from the reference itself), with a checkpoint and a dev evaluation there (not on the
    schedule), and a rerun trains no further."""
    from models.policy import load_actor_critic

    cfg = tiny_config(data_dir, tmp_path / "run", "ppo.dev_every=3", "ppo.dev_examples=4", "ppo.stop_kl=1e-9",
                      "ppo.checkpoint_every=3")
    summary = train(cfg)
    out = tmp_path / "run"
    assert summary["iterations"] == 2
    assert json.loads((out / "checkpoints/last/state.json").read_text())["iteration"] == 2
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [h["actor/ref_kl"] <= 1e-9 for h in history] == [True, False]
    assert ["dev/score" in h for h in history] == [False, True]
    best = json.loads((out / "checkpoints/best/best.json").read_text())
    selected = json.loads((out / "final/selected.json").read_text())
    assert selected == summary["selected"] == {"by": "dev em", "iteration": best["iteration"],
                                                "dev_score": best["score"]}
    final, _ = load_actor_critic(out / "final")
    kept, _ = load_actor_critic(out / "checkpoints/best/policy")
    f, k = params(final), params(kept)
    assert all(torch.equal(f[n], k[n]) for n in f)
    assert len(train_ppo(cfg, Workspace.build(cfg))[3]) == 2, "a stopped run must not train on when run again"


def test_the_same_weights_on_the_same_data_are_evaluated_once(data_dir, tmp_path, monkeypatch):
    """final/ holding the warm-up's weights (the dev check kept iteration 0) reuses the warm-up's
    evaluation: the same files under the new tag and no episode played; other weights, another
    config or changed data are evaluated anew."""
    import agentr1.recipe.evaluation as evaluation
    from agentr1.rundir import EVALUATED_FILE

    cfg = tiny_config(data_dir, tmp_path / "run", "sft.steps=1")
    ws = Workspace.build(cfg)
    warmup(cfg, ws)
    warm = tmp_path / "run" / "warmup"
    first = evaluation.evaluate_dir(cfg, ws, warm, "warmup")
    assert first.trajectories and json.loads((tmp_path / "run" / EVALUATED_FILE).read_text())["warmup"]["split"] == "test"
    shutil.copytree(warm, tmp_path / "same")
    played = []
    monkeypatch.setattr(evaluation, "evaluate", lambda *a, **k: played.append(1) or first)
    again = evaluation.evaluate_dir(cfg, ws, tmp_path / "same", "final")
    assert not played and again.metrics == first.metrics and again.trajectories == {}
    run = tmp_path / "run"
    assert (run / "eval_final.json").read_bytes() == (run / "eval_warmup.json").read_bytes()
    assert (run / "trajectories_final.txt").read_text() == (run / "trajectories_warmup.txt").read_text()
    # Other weights (a warm-up of another seed) on the same data: evaluated.
    other = tiny_config(data_dir, tmp_path / "other", "sft.steps=1", "seed=1")
    warmup(other, ws)
    evaluation.evaluate_dir(cfg, ws, tmp_path / "other" / "warmup", "other")
    assert played == [1]
    # Another config (a sampled temperature) and the same weights: evaluated again.
    hot = tiny_config(data_dir, tmp_path / "run", "sft.steps=1", "eval.sampled_temperature=0.5")
    evaluation.evaluate_dir(hot, ws, warm, "hot")
    assert played == [1, 1]
