"""This project's GRPO against TRL's ``GRPOTrainer`` on the same multi-turn tool-use work.

Both sides, one after the other in one process, get:

- the **same model**: the policy of one warm-up checkpoint of the config's model, the
  from-scratch Qwen2 (``conf/train.yaml``) or SmolLM2-135M-Instruct (``conf/smollm2.yaml``)
  (``--checkpoint DIR``; by default the config's own run's ``output_dir/warmup`` when a finished
  one of that configuration is there, else a short warm-up trained here and kept in ``--out``
  for later runs), loaded fresh for each side, with the same layers trained: where the config
  trains only the top ``model.trainable_layers``, TRL's copy has the embeddings, the LM head and
  the layers below frozen as the project's (:func:`models.policy.freeze_below_top`);
- the **same environment**: this project's :class:`~agentr1.env.qa.env.QAEnv` (BM25 search over
  ``data/corpus.jsonl``, the same reward rules); TRL reaches it through ``environment_factory``
  (a ``search(query)`` tool that steps the same env with the same tool-call text) and a reward
  function that ends the episode with the final answer;
- the **same batch**: 64 episodes per iteration, 8 questions x 8 samples (GRPO groups), the
  config's turn limit (``env.max_turns``: at most ``max_turns - 1`` tool calls), tokens per turn
  (``env.max_turn_tokens``) and context (``env.max_context_tokens``), the same stop tokens;
- the **same updates**: per iteration ``ppo.epochs`` passes of ``64 / ppo.minibatch_size``
  optimizer steps (TRL: ``num_iterations`` = epochs, ``steps_per_generation`` = minibatches),
  the same clip range, KL coefficient to the warm-up policy, learning rate and AdamW, at the
  same precision (``ppo.mixed_precision``, ``auto`` resolved as the project resolves it: bf16
  autocast where the device computes bf16 natively).

Differences that are the frameworks' own, kept on purpose: a turn with no parseable tool call
ends a TRL episode, while the project's environment answers it with an error observation and
goes on to ``env.max_turns``. With a policy that calls the tool and answers (a finished
warm-up) the two sides do the same work (turns and sampled tokens per iteration are printed);
with a barely trained one they do not (3 warm-up steps: 4.0 turns and 11,839 sampled tokens per
iteration here against TRL's 1.0 and 2,991), and the script says so. TRL generates with
``model.generate`` (its default without a vLLM server), this project with its configured
rollout backend (``rollout.backend``, ``auto`` = vLLM where installed); TRL renders a tool turn
from its chat template (no end-of-turn token after a turn stopped at ``</tool_call>``, one token
less per tool call than the project's observation). With frozen lower layers the project runs
the frozen trunk once per batch and shares its activations between scoring and the update; TRL
runs the whole model at each pass (gradients stop at the frozen layers on both sides). The
project's side compiles its layers and loss statistics where the config says so
(``model.compile``: ``conf/smollm2.yaml`` since feba626), TRL's stays eager (its ``torch_compile``
would compile the whole model, generation included); the ratios in docs/benchmarks.md were
measured before that, eager on both sides, as ``-o model.compile=false`` still runs them. Start-up
(building the trainer or session, the vLLM engine) is timed apart from the iterations.

**An equal wall-clock budget** (``--budget-s S``): each side trains until its iterations have
taken ``S`` seconds (checked between iterations, so the iteration that crosses ``S`` completes;
start-up is not counted; ``--iterations`` is then only a cap), and then its policy, and the
warm-up both started from, are evaluated by the project's evaluator (:func:`run_eval`: greedy
and sampled, fresh vLLM engine or hf as configured) on ``eval.split``, its first
``eval.max_examples`` questions when set (``-o eval.max_examples=N``). Both sides are scored by
the same code on the same questions; what differs is only how many iterations each fitted in.

Printed: seconds per iteration (mean over the timed iterations; the first is reported apart when
there are more than one, as it warms caches) of wall clock and of this process's CPU time (all
its threads: on a shared machine the wall clock also counts waiting for a core), sampled
tokens/s and all model tokens/s (prompt, sampled and tool tokens of the batch per second of
iteration), and the ratios project / TRL. On a shared machine run it with ``OMP_NUM_THREADS=1``:
with several jobs on the cores, multi-threaded kernels spin and wait, and the two sides' times
then depend on what else ran meanwhile more than on the frameworks. Usage::

    python benchmarks/vs_trl.py [--config conf/smollm2.yaml] [--iterations 2] [--quick] [--checkpoint RUN/warmup] [-o key=value]
    python benchmarks/vs_trl.py --config conf/smollm2.yaml --budget-s 600 [-o eval.max_examples=100]

Needs the ``bench`` extra (``pip install -e '.[bench]'``: TRL), and for SmolLM2 ``make model``.
Nothing is downloaded: the model and tokenizer come from the local warm-up directory (a delta
checkpoint's base from ``model-cache/``; ``HF_HUB_OFFLINE=1`` is set).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is local; a hub lookup would be a bug
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is flagged experimental

import torch  # noqa: E402

from agentr1.config import load_config  # noqa: E402
from agentr1.rl.distributed import training_precision  # noqa: E402
from agentr1.env.protocol import format_tool_call  # noqa: E402
from agentr1.rollout.vllm_backend import shutdown_engines  # noqa: E402
from agentr1.recipe.evaluation import run_eval  # noqa: E402
from agentr1.recipe.ppo import PPOSession, iteration_records  # noqa: E402
from agentr1.recipe.warmup import finished_warmup, warmup  # noqa: E402
from agentr1.recipe.workspace import Workspace, load_policy  # noqa: E402
from agentr1.rundir import WARMUP_DIR  # noqa: E402
from cli.console import setup_logging  # noqa: E402

# GRPO groups: 8 questions x 8 samples make the 64-episode batch.
GROUP_SIZE = 8
EPISODES = 64
# Without the config's own warm-up, a short one (demonstration steps only) is trained and kept in --out.
WARMUP_STEPS, WARMUP_EPISODES = 150, 2000
# Turns per episode further apart than this mean the two sides did different work.
SAME_WORK_TOLERANCE = 0.1
# With --budget-s, the iterations a side may take at most (the budget ends it first).
BUDGET_ITERATIONS_CAP = 200


@dataclass
class Side:
    """Timings of one framework: start-up seconds and, per iteration, seconds and token counts."""

    name: str
    startup_s: float = 0.0
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    sampled_tokens: list[int] = field(default_factory=list)
    model_tokens: list[int] = field(default_factory=list)
    turns: list[float] = field(default_factory=list)
    em: list[float] = field(default_factory=list)
    policy: object = None  # the trained causal LM, kept for the evaluation after an equal budget

    def spent(self, budget_s: float | None) -> bool:
        """Whether the iterations so far have used up ``budget_s`` seconds (never, without one)."""
        return budget_s is not None and sum(self.seconds) >= budget_s

    def timed(self) -> list[int]:
        """Indices of the iterations the summary averages (all but the first when there are more)."""
        return list(range(1 if len(self.seconds) > 1 else 0, len(self.seconds)))

    def summary(self) -> dict[str, float]:
        idx = self.timed()
        sec = sum(self.seconds[i] for i in idx)
        return {
            "startup_s": round(self.startup_s, 2),
            "first_iter_s": round(self.seconds[0], 2),
            "s_per_iter": round(sec / len(idx), 3),
            "cpu_s_per_iter": round(sum(self.cpu_seconds[i] for i in idx) / len(idx), 3),
            "sampled_tokens_per_s": round(sum(self.sampled_tokens[i] for i in idx) / sec, 1),
            "model_tokens_per_s": round(sum(self.model_tokens[i] for i in idx) / sec, 1),
            "sampled_tokens_per_iter": round(statistics.mean(self.sampled_tokens[i] for i in idx), 1),
            "turns_per_episode": round(statistics.mean(self.turns[i] for i in idx), 2),
            "em": round(statistics.mean(self.em[i] for i in idx), 3),
        }


def bench_config(args):
    """The config both sides run: the given one, GRPO, 64 episodes in groups of 8."""
    overrides = [
        f"output_dir={args.out}", "ppo.estimator=grpo", f"ppo.group_size={GROUP_SIZE}",
        f"ppo.episodes_per_iter={EPISODES}", f"ppo.iterations={args.iterations}", "ppo.checkpoint_every=0",
        f"sft.steps={args.warmup_steps}", f"sft.episodes={WARMUP_EPISODES}", "sft.corpus_steps=0",
        "sft.value_fit_episodes=0", *args.override,
    ]
    return load_config(args.config, overrides)


def prepare_warmup(cfg, ws: Workspace, checkpoint: str | None, own) -> Path:
    """The policy both sides start from: ``checkpoint``, else the warm-up of the config's own run
    (``own``: the config as given, whose ``output_dir/warmup`` ``agentr1 train`` writes) when a
    finished one is there, else ``cfg.output_dir/warmup`` (trained now unless a finished warm-up
    of this configuration is already there: later runs reuse it)."""
    if checkpoint:
        return Path(checkpoint)
    if (theirs := finished_warmup(own)) is not None:
        return theirs
    out = finished_warmup(cfg)
    if out is None:
        t0 = time.perf_counter()
        warmup(cfg, ws)
        print(f"warm-up: {cfg.sft.steps} demonstration steps in {time.perf_counter() - t0:.1f}s "
              f"(kept in {cfg.output_dir} for the next run)", flush=True)
    return Path(cfg.output_dir) / WARMUP_DIR


# ----------------------------------------------------------------------------- this project


def run_project(cfg, ws: Workspace, warmup_dir: Path, scratch: Path, budget_s: float | None = None) -> Side:
    """PPO iterations (estimator ``grpo``) exactly as ``agentr1 train`` takes them, from
    ``warmup_dir``, in ``scratch`` (nothing is saved: the warm-up stays as it was), until
    ``ppo.iterations`` or ``budget_s`` seconds of iterations."""
    side = Side("agentr1")
    (scratch / WARMUP_DIR).symlink_to(warmup_dir.resolve(), target_is_directory=True)
    t0 = time.perf_counter()
    session = PPOSession(cfg.model_copy(update={"output_dir": str(scratch)}), ws)
    side.startup_s = time.perf_counter() - t0
    while len(side.seconds) < cfg.ppo.iterations and not side.spent(budget_s):
        t0, c0 = time.perf_counter(), time.process_time()
        m = session.iterate()
        side.seconds.append(time.perf_counter() - t0)
        side.cpu_seconds.append(time.process_time() - c0)
        side.sampled_tokens.append(round(m["rollout/action_tokens"] * EPISODES))
        side.model_tokens.append(round(m["rollout/length"] * EPISODES))
        side.turns.append(m["rollout/turns"])
        side.em.append(m["rollout/em"])
        print(f"  agentr1 iteration {len(side.seconds)}: {side.seconds[-1]:.2f}s, "
              f"em {m['rollout/em']:.3f}, turns {m['rollout/turns']:.2f}", flush=True)
    side.policy = session.policy.policy
    shutdown_engines()  # TRL's turn: free the vLLM engine's KV cache and weight copy
    return side


# ----------------------------------------------------------------------------- TRL


class QAToolEnv:
    """One TRL rollout's environment: this project's QAEnv behind a ``search`` tool.

    TRL calls ``reset(**row)`` per rollout and ``search(query=...)`` for each parsed tool
    call; the env receives the call as the same canonical text the project's policy emits
    (:func:`format_tool_call`), so search, observation and process reward are the project's.
    """

    env = None  # set by run_trl before the trainer is built: the shared QAEnv
    records: dict = {}

    def __init__(self):
        self.state = None
        self.reward = 0.0

    def reset(self, **row) -> None:
        self.state = self.env.reset(self.records[row["qid"]])
        self.reward = 0.0

    def search(self, query: str) -> str:
        """Search the document collection.

        Args:
            query: What to look for.

        Returns:
            The best-matching document.
        """
        res = self.env.step(self.state, format_tool_call(query))
        # outcome_reward is nonzero only when the env ends the episode here (its turn limit)
        self.reward += res.process_reward + res.outcome_reward
        return res.observation if res.observation is not None else ""

    def _finish(self, last_turn: str) -> float:
        """End the episode with its last assistant turn (the answer); the episode's total reward."""
        if not self.state.done:
            res = self.env.step(self.state, last_turn)
            self.reward += res.process_reward + res.outcome_reward
            if not res.done:  # no answer in the last turn: cut, scored as unanswered
                self.reward += self.env.finalize(self.state, "length").outcome_reward
        return self.reward


# SmolLM2's ChatML template renders each message's content only; TRL renders the assistant's
# tool calls from a message's ``tool_calls``. This renders them after the content in the project's
# canonical call text (agentr1.env.protocol.format_call: one JSON object between the tags).
_CHATML_CONTENT = "message['content']"


def _chatml_with_tool_calls(template: str) -> str:
    """A ChatML template that renders content only, made to render ``tool_calls`` too (each as
    ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, as the project's policy writes
    them); a template of another shape is an error naming what this benchmark expects."""
    if template.count(_CHATML_CONTENT) != 1:
        raise SystemExit("vs_trl: the model's chat template renders no tool calls and is not a ChatML template "
                         f"with one {_CHATML_CONTENT}: give TRL a template that renders tool_calls")
    calls = ("{%- for call in message.get('tool_calls') or [] -%}"
             "{{ '<tool_call>' + ({'name': call['function']['name'], 'arguments': call['function']['arguments']}"
             " | tojson) + '</tool_call>' }}{%- endfor -%}")
    head, tail = template.split(_CHATML_CONTENT)
    # SmolLM2: "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    before, sep, after = tail.partition("+ '<|im_end|>'")
    if not sep:
        raise SystemExit("vs_trl: the ChatML template's content is not followed by + '<|im_end|>'")
    return head + "(message['content'] or '')" + before + "}}" + calls + "{{'<|im_end|>'" + after


def trl_tokenizer(tokenizer, tools_in_prompt: bool):
    """A copy of the project's tokenizer set up as TRL needs it: left padding, a chat template
    that renders tool calls (the project's from-scratch template does; SmolLM2's ChatML renders
    content only, and gets :func:`_chatml_with_tool_calls`), and a response template to parse
    them (both render turns like Qwen3's, so TRL's Qwen3 parser reads them). With
    ``env.tools_in_prompt: false`` the template ignores tools, so TRL's prompts are the project's
    ids exactly."""
    from trl.chat_template_utils import qwen3_template, supports_tool_calling

    tok = copy.deepcopy(tokenizer)
    tok.padding_side = "left"
    if not supports_tool_calling(tok):
        tok.chat_template = _chatml_with_tool_calls(tok.chat_template)
    if not tools_in_prompt:
        tok.chat_template = "{%- set tools = none -%}" + tok.chat_template
    tok.response_template = qwen3_template
    return tok


def run_trl(cfg, ws: Workspace, warmup_dir: Path, scratch: Path, budget_s: float | None = None) -> Side:
    """TRL's GRPOTrainer on the same work; one iteration = one generation batch and its updates;
    until ``ppo.iterations`` or ``budget_s`` seconds of iterations."""
    from datasets import Dataset
    from transformers import AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from models.chat import ChatFormat
    from models.policy import freeze_below_top, load_causal_lm

    side = Side("trl")
    p, env_cfg = cfg.ppo, cfg.env
    tokenizer = AutoTokenizer.from_pretrained(warmup_dir)
    chat = ChatFormat(tokenizer, ws.tools)
    minibatches = EPISODES // p.minibatch_size

    # The same questions, iteration by iteration, as the project's (iteration_records).
    train = ws.split("train")
    rows = []
    for it in range(p.iterations):
        records, _ = iteration_records(train, EPISODES // GROUP_SIZE, 1, cfg.seed, it)
        rows += [{"prompt": [{"role": "user", "content": ws.env.user_prompt(r)}], "qid": r.id} for r in records]
    QAToolEnv.env = ws.env
    QAToolEnv.records = {r.id: r for r in train}
    prompt_len = max(len(chat.prompt_ids(ws.env.system_turn(), row["prompt"][0]["content"])) for row in rows)

    args = GRPOConfig(
        output_dir=str(scratch / "trl"), report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, use_cpu=ws.device.type == "cpu",
        bf16=training_precision(p.mixed_precision, ws.device) == "bf16", seed=cfg.seed,
        learning_rate=p.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=p.max_grad_norm,
        per_device_train_batch_size=p.minibatch_size, gradient_accumulation_steps=1,
        steps_per_generation=minibatches, num_iterations=p.epochs, num_generations=GROUP_SIZE,
        max_steps=p.iterations * minibatches * p.epochs, shuffle_dataset=False,
        beta=p.kl_coef, epsilon=p.clip_eps, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
        top_k=0, max_completion_length=env_cfg.max_context_tokens - prompt_len,
        max_tool_calling_iterations=env_cfg.max_turns - 1,
        generation_kwargs={"max_new_tokens": env_cfg.max_turn_tokens},
    )

    def episode_reward(completions, environments, **_) -> list[float]:
        """The project's reward of each episode, ended with its last assistant message."""
        last = [next((m.get("content") or "" for m in reversed(msgs) if m["role"] == "assistant"), "")
                for msgs in completions]
        rewards = [e._finish(text) for e, text in zip(environments, last)]
        side.turns.append(statistics.mean(e.state.turns for e in environments))
        side.em.append(statistics.mean(e.env.episode_metrics(e.state)["em"] for e in environments))
        return rewards

    t0 = time.perf_counter()
    policy = load_causal_lm(warmup_dir)
    if cfg.model.trainable_layers is not None:  # the layers the project trains, and no others
        freeze_below_top(policy, cfg.model.trainable_layers)
    # TRL stops a turn at, and cuts the completion after, the model's eos ids: make them the
    # project's stop tokens (</tool_call>, </answer>, the end of turn).
    policy.generation_config.eos_token_id = list(chat.stop_token_ids)
    trainer = GRPOTrainer(
        model=policy, reward_funcs=episode_reward, args=args,
        train_dataset=Dataset.from_list(rows), processing_class=trl_tokenizer(tokenizer, env_cfg.tools_in_prompt),
        environment_factory=QAToolEnv,
    )
    side.startup_s = time.perf_counter() - t0

    generate = trainer._generate_and_score_completions

    def counted(inputs):
        """The batch TRL builds once per iteration: count its sampled and model tokens."""
        out = generate(inputs)
        sampled = out["completion_mask"] * out.get("tool_mask", torch.ones_like(out["completion_mask"]))
        side.sampled_tokens.append(int(sampled.sum()))
        side.model_tokens.append(int(out["prompt_mask"].sum() + out["completion_mask"].sum()))
        return out

    trainer._generate_and_score_completions = counted
    steps_per_iter = minibatches * p.epochs
    marks: list[tuple[float, float]] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            marks.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, args, state, control, **k):
            if state.global_step % steps_per_iter == 0:
                marks.append((time.perf_counter(), time.process_time()))
                side.seconds.append(marks[-1][0] - marks[-2][0])
                side.cpu_seconds.append(marks[-1][1] - marks[-2][1])
                print(f"  trl iteration {len(side.seconds)}: {side.seconds[-1]:.2f}s", flush=True)
                control.should_training_stop = side.spent(budget_s)

    trainer.add_callback(Clock())
    trainer.remove_callback(PrinterCallback)  # its per-step dicts: the iterations' lines say what is needed
    trainer.train()
    side.policy = trainer.model
    return side


def evaluate_after_budget(cfg, ws: Workspace, warmup_dir: Path, sides: list[Side], scratch: Path) -> dict:
    """The warm-up's and each side's trained policy's greedy and sampled metrics on the config's
    eval split, all by :func:`run_eval` (its files go to ``scratch``)."""
    from models.policy import ActorCritic

    warm, tokenizer, chat = load_policy(ws, warmup_dir)
    out = cfg.model_copy(update={"output_dir": str(scratch / "eval")})
    policies = [("warm-up", warm)] + [(s.name, ActorCritic(s.policy)) for s in sides]
    scores = {}
    for name, model in policies:
        t0 = time.perf_counter()
        metrics = run_eval(out, ws, model.eval(), tokenizer, chat, name).metrics
        shutdown_engines()
        scores[name] = {k: round(metrics[k], 3) for k in ("greedy/em", "sampled/em")}
        print(f"  {name}: greedy EM {metrics['greedy/em']:.3f}, sampled EM {metrics['sampled/em']:.3f} "
              f"on {int(metrics['greedy/n'])} {cfg.eval.split} questions ({time.perf_counter() - t0:.0f}s)", flush=True)
    return scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="conf/train.yaml")
    ap.add_argument("--iterations", type=int, default=2, help="iterations per side (the first is reported apart)")
    ap.add_argument("--quick", action="store_true", help="1 iteration per side")
    ap.add_argument("--checkpoint", help="a warm-up directory (default: the config's output_dir/warmup when "
                                         "agentr1 train finished one, else a short warm-up trained here)")
    ap.add_argument("--out", help="where the short warm-up is kept between runs (default: "
                                  "runs/bench-vs-trl/<config name>)")
    ap.add_argument("--warmup-steps", type=int, default=WARMUP_STEPS)
    ap.add_argument("--budget-s", type=float, help="train each side for this many seconds of iterations, then "
                                                   "evaluate both (and the warm-up) on eval.split")
    ap.add_argument("-o", "--override", action="append", default=[])
    args = ap.parse_args()
    setup_logging()  # the warm-up's progress; vLLM (imported later) and TRL's version notes quiet
    warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions")
    if args.quick:
        args.iterations = 1
    if args.budget_s is not None:
        args.iterations = BUDGET_ITERATIONS_CAP
    args.out = args.out or str(Path("runs/bench-vs-trl") / Path(args.config).stem)
    cfg = bench_config(args)
    ws = Workspace.build(cfg)
    warmup_dir = prepare_warmup(cfg, ws, args.checkpoint, own=load_config(args.config, args.override))
    with tempfile.TemporaryDirectory(prefix="vs_trl-") as scratch:
        print(f"threads {torch.get_num_threads()}, rollout backend {cfg.rollout.backend}, "
              f"{EPISODES} episodes/iteration ({EPISODES // GROUP_SIZE} questions x {GROUP_SIZE}), "
              f"{cfg.ppo.epochs} epochs x {EPISODES // cfg.ppo.minibatch_size} minibatches", flush=True)
        sides = [run_project(cfg, ws, warmup_dir, Path(scratch), args.budget_s),
                 run_trl(cfg, ws, warmup_dir, Path(scratch), args.budget_s)]
        scores = None if args.budget_s is None else evaluate_after_budget(cfg, ws, warmup_dir, sides, Path(scratch))
    results = {s.name: s.summary() for s in sides}
    ours, trl = results["agentr1"], results["trl"]
    results["ratio_agentr1_over_trl"] = {
        "s_per_iter": round(ours["s_per_iter"] / trl["s_per_iter"], 3),
        "cpu_s_per_iter": round(ours["cpu_s_per_iter"] / trl["cpu_s_per_iter"], 3),
        "model_tokens_per_s": round(ours["model_tokens_per_s"] / trl["model_tokens_per_s"], 3),
    }
    print(json.dumps(results, indent=1))
    print("\n| framework | start-up s | first iter s | s/iter | CPU s/iter | turns/episode | EM | sampled tok/iter | "
          "sampled tok/s | model tok/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in ("agentr1", "trl"):
        r = results[name]
        print(f"| {name} | {r['startup_s']:.1f} | {r['first_iter_s']:.2f} | {r['s_per_iter']:.2f} | "
              f"{r['cpu_s_per_iter']:.2f} | {r['turns_per_episode']:.2f} | {r['em']:.3f} | "
              f"{r['sampled_tokens_per_iter']:.0f} | "
              f"{r['sampled_tokens_per_s']:.0f} | {r['model_tokens_per_s']:.0f} |")
    if scores is not None:
        results["after_budget"] = scores
        print(f"\nAfter {args.budget_s:.0f} s of iterations each, {cfg.eval.split} EM (greedy / sampled):")
        print("| policy | iterations | seconds of iterations | greedy EM | sampled EM |\n|---|---:|---:|---:|---:|")
        for name, n, sec in (("warm-up", 0, 0.0), *((s.name, len(s.seconds), sum(s.seconds)) for s in sides)):
            print(f"| {name} | {n} | {sec:.0f} | {scores[name]['greedy/em']:.3f} | {scores[name]['sampled/em']:.3f} |")
    ratio = results["ratio_agentr1_over_trl"]
    print(f"\nagentr1 / TRL seconds per iteration: {ratio['s_per_iter']:.3f} wall clock, "
          f"{ratio['cpu_s_per_iter']:.3f} CPU time (goal <= 0.5)")
    if abs(ours["turns_per_episode"] / trl["turns_per_episode"] - 1) > SAME_WORK_TOLERANCE:
        print(f"NOT THE SAME WORK: {ours['turns_per_episode']:.2f} turns per episode against TRL's "
              f"{trl['turns_per_episode']:.2f} (a policy that does not call the tool properly: TRL ends such "
              "episodes, the project's environment goes on); compare tokens/s, or start from a trained "
              "warm-up (--checkpoint RUN/warmup)")


if __name__ == "__main__":
    main()
