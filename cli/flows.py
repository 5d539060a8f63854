"""``agentr1 pipeline``: run a flow in this process and print where to look at it.

    agentr1 pipeline                                   # the end-to-end pipeline on conf/train.yaml
    agentr1 pipeline -o ppo.iterations=5 --output-dir runs/try
    agentr1 pipeline --flow retrain --margin 0.02
    agentr1 pipeline --flow evaluate --model champion --split dev
    agentr1 pipeline --preset quick --source hotpotqa --input hotpotqa_train.json -o data.dir=data-hotpotqa
    agentr1 ablate --preset quick                      # the ablation flow (flows/ablation.py)

When a Prefect server answers on the default local address (``make ui``) and
``PREFECT_API_URL`` is unset, the run goes to that server so it shows up live; otherwise
Prefect's ephemeral API stores it in ``$PREFECT_HOME`` (default ``~/.prefect``), where a
later ``make ui`` shows it. Prefect is imported only when the command runs, so the other
``agentr1`` commands stay fast.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import sys
import urllib.request
from typing import get_args

from agentr1 import errors
from agentr1.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK

LOCAL_PREFECT_API = "http://127.0.0.1:4200/api"
PROBE_TIMEOUT_S = 0.5
FLOWS = ("pipeline", "retrain", "evaluate")
# A temporary Prefect server can take a minute to come up on two busy cores (Prefect's default
# wait is 20 s: `make run` failed so while tests ran beside it); the ablation's workers use it too.
EPHEMERAL_STARTUP_S = "180"
OWN_LOGGER = "agentr1"  # the engine's and the tasks' loggers (agentr1.train, agentr1.tasks.*)
# Routine lines a flow run repeats, by logger: left out by default (-v keeps them), from the console
# and so from the flow run's log too, where the task runs and their states say the same.
# Prefect's loggers that report a failed flow or task run with its traceback.
ENGINE_LOGGERS = ("prefect.flow_runs", "prefect.task_runs", "prefect.flow_engine", "prefect.task_engine")
ROUTINE = {
    # The per-iteration validation task's end: the engine's own "iter N/M em ... reward ..." line
    # says more, once (the Prefect UI still lists every task run with its state).
    "prefect.task_runs": re.compile(r"validate-rollouts-\d+: Finished in state Completed"),
    # Every Great Expectations validation makes a temporary docs site (its logger is set to INFO
    # when imported, so a level set here would not hold).
    "great_expectations.data_context.types.base": re.compile(r"Created temporary directory"),
}


class _DropRoutine(logging.Filter):
    def __init__(self, pattern: re.Pattern):
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        task = getattr(record, "task_run_name", None)
        text = f"{task}: {record.getMessage()}" if task else record.getMessage()
        return not self.pattern.search(text)


class _NoTracebackForRefusals(logging.Filter):
    """Prefect logs a failed task or flow with its traceback; for a refusal a person can act on
    (agentr1/errors.py: bad data, a damaged checkpoint, divergence, a full disk) the message is
    the whole story, said once more as `agentr1: error: ...` at the end (-v keeps tracebacks)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and errors.exit_status(record.exc_info[1]) is not None:
            record.exc_info, record.exc_text = None, None
        return True


def console_setup(verbose: bool) -> None:
    """What a flow run started here prints: the run's own progress (the ``agentr1`` loggers, also
    sent to the Prefect run's log), Prefect's stage lines, and no third-party chatter (vLLM's
    per-iteration weight reloads and start-up warnings, progress bars of weight loading and
    artifact downloads), unless ``verbose``. Call before Prefect is imported: it reads
    ``PREFECT_LOGGING_EXTRA_LOGGERS`` once."""
    extra = os.environ.get("PREFECT_LOGGING_EXTRA_LOGGERS", "")
    if OWN_LOGGER not in extra.split(","):
        os.environ["PREFECT_LOGGING_EXTRA_LOGGERS"] = ",".join(filter(None, [extra, OWN_LOGGER]))
    logging.getLogger(OWN_LOGGER).setLevel(logging.INFO)  # Prefect's root logger passes WARNING only
    if verbose:
        return
    from cli.console import quiet_third_party

    quiet_third_party()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # MLflow sets its loggers' level when imported
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # torch's C++ NUMA notice when vLLM binds threads
    for name, pattern in ROUTINE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropRoutine) for f in logger.filters):  # once per process
            logger.addFilter(_DropRoutine(pattern))
    for name in ENGINE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoTracebackForRefusals) for f in logger.filters):
            logger.addFilter(_NoTracebackForRefusals())


def use_local_server(api: str = LOCAL_PREFECT_API) -> bool:
    """Point Prefect at a running local server when no API is configured; True if it did."""
    if os.environ.get("PREFECT_API_URL"):
        return False
    try:
        with urllib.request.urlopen(f"{api}/health", timeout=PROBE_TIMEOUT_S) as resp:
            if resp.status != 200:
                return False
    except OSError:
        return False
    os.environ["PREFECT_API_URL"] = api
    return True


def start_temporary_server() -> None:
    """Start Prefect's temporary server now, in a session of its own, when the flow would start
    one (no API configured and none found by :func:`use_local_server`).

    A terminal's Ctrl-C, a closing terminal or ``kill -TERM -<pgid>`` reaches every process of
    the foreground group at once. A server in the group died with the flow, which then spent
    ~70 s retrying to record its Crashed state against it and left the flow run Running. Out of
    the group it outlives the flow's final state; Prefect's own ``atexit`` handler stops it as
    the process exits, and it dies with this process (``PR_SET_PDEATHSIG``) if that is killed.
    Prefect's clients find it as they would the one they start (it is the same instance)."""
    if os.environ.get("PREFECT_API_URL"):
        return
    import functools
    import subprocess
    import types

    from prefect.server.api import server as prefect_server
    from prefect.settings import PREFECT_SERVER_ALLOW_EPHEMERAL_MODE

    from agentr1.env.sandbox import death_signal

    if not PREFECT_SERVER_ALLOW_EPHEMERAL_MODE.value():
        return
    own_session = types.SimpleNamespace(
        Popen=functools.partial(subprocess.Popen, start_new_session=True, preexec_fn=death_signal(signal.SIGTERM)))
    server = prefect_server.SubprocessASGIServer()
    prefect_server.subprocess = own_session  # read by the server's Popen call only, while it starts
    try:
        server.start()
    finally:
        prefect_server.subprocess = subprocess


def flow_params(args: argparse.Namespace):
    """The flow and its parameter model from the command line."""
    from agentr1.presets import DataSource
    from flows.forms import EvaluateParams, PipelineParams, RetrainParams

    common = {"preset": args.preset, "overrides": args.override, "output_dir": args.output_dir}
    if args.flow == "evaluate":
        from flows.evaluate import evaluate

        return evaluate, EvaluateParams(**common, model=args.model, split=args.split)
    margin = {} if args.margin is None else {"margin": args.margin}
    # The form's data source: where the dataset comes from when data.dir holds none yet.
    source = {k: v for k, v in (("kind", args.source), ("input", args.input), ("dev_fraction", args.dev_fraction),
                                ("test_fraction", args.test_fraction)) if v is not None}
    common["data"] = DataSource(**source)
    common["study"] = args.study
    if args.flow == "retrain":
        from flows.retrain import retrain

        return retrain, RetrainParams(**common, **margin)
    from flows.pipeline import pipeline

    return pipeline, PipelineParams(**common, **margin)


def where_to_look(run_id: str, flow_run_id: str, output_dir: str) -> list[str]:
    from adapters.report import mlflow_run_url, mlflow_ui_command, prefect_ui_url

    prefect = prefect_ui_url()
    prefect_line = (f"{prefect}/runs/flow-run/{flow_run_id}" if prefect else
                    f"start `make ui`, then http://127.0.0.1:4200/runs/flow-run/{flow_run_id} "
                    f"(this run is stored in {os.environ.get('PREFECT_HOME', '~/.prefect')})")
    return [f"Run directory : {output_dir}",
            f"MLflow        : {mlflow_run_url(run_id)}  (UI: `make ui` or `{mlflow_ui_command()}`)",
            f"Prefect       : {prefect_line}"]


def summary_lines(kind: str, result: dict) -> list[str]:
    """Exact match before and after RL (or the evaluation) and the registry decision."""
    if kind == "evaluate":
        m = result["metrics"]
        return [f"{result['model']} ({result['label']}) on {result['split']}: exact match greedy "
                f"{m['greedy/em']:.3f}, sampled {m['sampled/em']:.3f}"]
    from agentr1.report import BASELINE_LABELS

    w, f, p = result["warmup"], result["final"], result["promotion"]
    its = result["iterations"]
    short = {b: label.split(" (")[0] for b, label in BASELINE_LABELS.items()}  # "naive RAG"
    rows = [*((f"{short.get(b, b)} (untrained)", m) for b, m in result.get("baselines", {}).items()),
            ("warm-up (before RL)", w), (f"after RL ({its} PPO iteration{'' if its == 1 else 's'})", f)]
    where = f"{result['split']} ({int(f['greedy/n'])} questions)" if "greedy/n" in f else result["split"]
    return [f"{'Exact match on ' + where:<40}greedy   sampled",
            *(f"  {name:<38}{m['greedy/em']:.3f}    {m['sampled/em']:.3f}" for name, m in rows),
            f"Registered {result['registered_model']} v{result['registered_version']}; champion is v{p['champion_after']} "
            f"({p['reason']})"]


class Stopped(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) to a flow started here: unwinds like Ctrl-C (exit 128 + the signal)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def run_flow(args: argparse.Namespace, flow, params):
    """The flow's final state; under ``--json`` everything it prints goes to stderr, so stdout
    carries the JSON document alone.

    SIGTERM and SIGHUP unwind the flow like Ctrl-C: Prefect's engine turns the signal into a crash
    of the flow run (its own handler, which hands the signal back to the one it found: this one),
    the MLflow run ends KILLED, every ``finally`` runs, and the process exits through ``atexit``,
    which stops Prefect's temporary server. The default action would end the process on the spot
    and leave the server running and the flow run Running. A stop is a stop however the flow
    ended: Prefect can lose the signal on its way out (a task that was starting fails with
    ``ValueError('Task run is not set')``, and the flow run Failed), so the flow run is then set
    Crashed here and :class:`Stopped` raised."""
    from cli.console import stdout_to_stderr

    received: list[int] = []
    stops = (signal.SIGTERM, signal.SIGHUP)

    def stop(signum: int, frame) -> None:
        received.append(signum)
        raise Stopped(signum)

    # While a task or flow runs, Prefect's own SIGTERM handler is installed and raises its
    # TerminationSignal without calling this one; when that lands as a task starts, Prefect loses it
    # (the task fails with ValueError('Task run is not set')). The interpreter's wakeup fd sees every
    # signal, whichever Python handler runs: what arrived is read from it.
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)

    def arrived() -> list[int]:
        try:
            seen = os.read(wake_r, 1024)
        except BlockingIOError:
            seen = b""
        received.extend(s for s in seen if s in stops and s not in received)
        return received

    previous = {s: signal.signal(s, stop) for s in stops}
    try:
        with stdout_to_stderr() if args.json else contextlib.nullcontext():
            state = flow(params, return_state=True)
    except Exception as exc:
        if arrived():
            raise Stopped(received[0]) from exc
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        signal.set_wakeup_fd(old_wakeup)
        arrived()
        os.close(wake_r)
        os.close(wake_w)
    if received:
        if not state.is_crashed():
            _set_crashed(state.state_details.flow_run_id, signal.Signals(received[0]).name)
        raise Stopped(received[0])
    return state


def _set_crashed(flow_run_id, signame: str) -> None:
    """Mark a stopped flow run Crashed; a server that cannot be told is said, not raised (the
    stop is what the exit status reports)."""
    from prefect import get_client
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run_id, Crashed(message=f"stopped by {signame}"), force=True)
    except Exception as exc:  # noqa: BLE001 - any failure to reach the server
        logging.getLogger(OWN_LOGGER).warning("could not mark flow run %s Crashed: %s", flow_run_id, exc)



def cmd_pipeline(args: argparse.Namespace) -> int:
    console_setup(args.verbose)
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", EPHEMERAL_STARTUP_S)
    flow, params = flow_params(args)
    from flows.forms import resolve_config
    from adapters.validation import ValidationFailed

    resolve_config(params, args.flow)  # a bad preset, key or value: said now, not after the server has started
    server = use_local_server()
    start_temporary_server()
    state = run_flow(args, flow, params)
    try:
        result = state.result()  # a refusal (agentr1/errors.py) goes on to `agentr1`'s one-line error
    except ValidationFailed as exc:
        print(f"agentr1: validation failed, nothing was trained or registered:\n{exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return print_outcome(args, server, state, result, summary_lines(args.flow, result))


def print_outcome(args: argparse.Namespace, server: bool, state, result: dict, headline: list[str]) -> int:
    """The flow's result as JSON (``--json``), else ``headline`` and where to look at the run."""
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True, default=str))
        return EXIT_OK
    flow_run_id = str(state.state_details.flow_run_id)
    lines = headline + where_to_look(result["run_id"], flow_run_id, result["output_dir"])
    if not server and not os.environ.get("PREFECT_API_URL"):
        lines.append("(no Prefect server was running: the flow used Prefect's ephemeral API)")
    print("\n".join(lines))
    return EXIT_OK


def _add_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the flow's result as JSON instead")
    p.add_argument("-v", "--verbose", action="store_true", help="keep third-party output (vLLM, progress bars) "
                   "and every iteration's task ends in the console")


def add_pipeline(subparsers: argparse._SubParsersAction) -> None:
    from agentr1.presets import DEFAULT_PRESET, DataSource  # pydantic forms only: no Prefect, no MLflow

    p = subparsers.add_parser("pipeline", help="run a Prefect flow here (pipeline, retrain, evaluate); prints a summary")
    p.add_argument("--flow", choices=FLOWS, default="pipeline")
    p.add_argument("--preset", default=DEFAULT_PRESET,
                   help=f"conf/<preset>.yaml or a YAML path (default: {DEFAULT_PRESET})")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="set a config value by dotted key, e.g. -o ppo.iterations=5 (repeatable)")
    p.add_argument("--output-dir", default=None, help="run directory (default: runs/<flow>/<UTC time>)")
    p.add_argument("--margin", type=float, default=None, help="pipeline/retrain: promotion margin")
    p.add_argument("--source", choices=get_args(DataSource.model_fields["kind"].annotation), default=None,
                   help="pipeline/retrain: where the data comes from when data.dir holds none (default: synthetic)")
    p.add_argument("--input", default=None, help="pipeline/retrain: the HotpotQA / MuSiQue file to convert")
    p.add_argument("--dev-fraction", type=float, default=None, help="pipeline/retrain: share of converted records in dev")
    p.add_argument("--test-fraction", type=float, default=None,
                   help="pipeline/retrain: share of converted records in test")
    p.add_argument("--study", default=None, help="pipeline/retrain: tag the run as part of this study "
                   "(agentr1 report --study NAME sums its runs up)")
    p.add_argument("--model", default="champion", help="evaluate: a policy dir, version, alias or models:/ URI")
    p.add_argument("--split", default="test", help="evaluate: the split")
    _add_output_args(p)
    p.set_defaults(func=cmd_pipeline)


# ---------------------------------------------------------------- ablate


def cmd_ablate(args: argparse.Namespace) -> int:
    from flows.ablation import AblationFailed, ablation
    from flows.forms import AblationParams

    return _run_study(args, ablation, lambda: AblationParams(preset=args.preset, overrides=args.override,
                                                             output_dir=args.output_dir), AblationFailed)


def _run_study(args: argparse.Namespace, flow, make_params, failed: type[Exception]) -> int:
    """Run a flow that writes a results table (the ablation, the suite) and print the table."""
    console_setup(args.verbose)
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", EPHEMERAL_STARTUP_S)
    server = use_local_server()
    from adapters.validation import ValidationFailed

    start_temporary_server()
    state = run_flow(args, flow, make_params())
    try:
        result = state.result()
    except ValidationFailed as exc:
        print(f"agentr1: validation failed, nothing was trained:\n{exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except failed as exc:
        print(f"agentr1: {exc}", file=sys.stderr)
        return EXIT_FAILED
    with open(result["results_md"], encoding="utf-8") as f:
        headline = [f.read(), f"Report        : {result['results_md']}"
                    + (f" (plot {result['plot']})" if "plot" in result else "")]
    return print_outcome(args, server, state, result, headline)


def add_ablate(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ablate", help=("the paper's mask / reward / estimator ablation (a Prefect flow); "
                                              "prints the results table"))
    p.add_argument("--preset", default="quick", help="conf/ablation/<preset>.yaml or a YAML path (default: quick)")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help=("an ablation key (seeds=[0,1], variants=[ppo,ppo-vanilla], runner.max_workers=2, "
                         "curve.every=5, warmup=DIR) or a training-config key (ppo.iterations=10, data.dir=DIR); "
                         "repeatable"))
    p.add_argument("--output-dir", default=None, help="ablation root (default: the preset's); the same dir resumes")
    _add_output_args(p)
    p.set_defaults(func=cmd_ablate)


# ---------------------------------------------------------------- suite


def cmd_suite(args: argparse.Namespace) -> int:
    from flows.suite import SuiteFailed, suite
    from flows.forms import SuiteParams

    return _run_study(args, suite, lambda: SuiteParams(preset=args.preset, overrides=args.override,
                                                       output_dir=args.output_dir), SuiteFailed)


def add_suite(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("suite", help=("the default recipe on every task of a suite (a Prefect flow); prints "
                                             "warm-up and final EM per task and the mean gain"))
    p.add_argument("--preset", default="default", help="conf/suite/<preset>.yaml or a YAML path (default: default)")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a suite key (seeds=[0], study=NAME) or a training key for every task (ppo.iterations=10); "
                        "repeatable")
    p.add_argument("--output-dir", default=None, help="suite root (default: the preset's); the same dir resumes")
    _add_output_args(p)
    p.set_defaults(func=cmd_suite)
