"""DVC: data.dvc pins the dataset `make data` regenerates, dvc.yaml's pipeline is well formed.

The dataset is generated once per module (about 4 s) from the flags the Makefile's ``data``
target uses, and hashed the way ``dvc add`` does; a generator change fails here before it
silently invalidates everyone's pinned data.
"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = ("validate", "warmup", "ppo", "evaluate")
MODEL_STAGE = "model"  # SmolLM2 from the package index (conf/smollm2.yaml); no stage of PIPELINE reads it
DATA_STAGE = "data.dvc"
DVC_TIMEOUT_S = 120
# Config sections no stage lists as params, and why: data/ is pinned by data.dvc (its dir is
# forced with -o data.dir=data) and output_dir is forced to the pipeline's own run directory.
UNTRACKED_SECTIONS = {"data", "output_dir"}
# DVC 3.67's own index code trips networkx/pygtrie deprecations; nothing of ours.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:dvc")


def _makefile_synth_args(variable: str = "DATA_SYNTH"):
    """The `agentr1 data synth` arguments of `make data` (``DATA_SQL_SYNTH``: `make data-sql`),
    parsed by the CLI's own parser."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{variable}\s*:=\s*(.*)$", text, re.MULTILINE)
    assert match, f"Makefile: no `{variable} := ...` line (the flags `make data` generates data/ with)"
    return build_parser().parse_args(["data", "synth", "--out", "unused", *shlex.split(match.group(1))])


def _dvc(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    # stdin closed: a DVC prompt ("commit anyway?") answers no instead of hanging the test.
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=DVC_TIMEOUT_S)


def _lookup(tree: dict, dotted: str):
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def _pinned(name: str = "data") -> dict:
    """``<name>.dvc``'s single output entry (md5 of the directory manifest, size, nfiles)."""
    outs = yaml.safe_load((ROOT / f"{name}.dvc").read_text())["outs"]
    assert len(outs) == 1 and outs[0]["path"] == name, outs
    return outs[0]


def _regenerate(out: Path, variable: str = "DATA_SYNTH") -> Path:
    """The dataset the Makefile's ``variable`` flags make on a clean clone, into ``out``."""
    a = _makefile_synth_args(variable)
    argv = ["data", "synth", "--out", str(out), "--kind", a.kind, "--seed", str(a.seed), "--n-train", str(a.n_train),
            "--n-dev", str(a.n_dev), "--n-test", str(a.n_test),
            "--hop-weights", ",".join(str(w) for w in a.hop_weights), "--names", a.names]
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def pinned() -> dict:
    return _pinned()


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    """data/ as `make data` makes it on a clean clone, in a temp dir."""
    return _regenerate(tmp_path_factory.mktemp("dvc") / "data")


@pytest.fixture(scope="module")
def dvc_repo() -> dict:
    """The stages of the real repo's dvc.yaml, resolved by DVC itself, and its DAG edges."""
    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        stages = {s.addressing: s for s in repo.index.stages}
        edges = {(a.addressing, b.addressing) for a, b in repo.index.graph.edges()}
    return {"stages": stages, "edges": edges}


def test_conf_synth_matches_make_data():
    """conf/train.yaml describes the same world as the pinned data (the trainer regenerates
    from it when data/ is missing)."""
    a = _makefile_synth_args()
    synth = yaml.safe_load((ROOT / "conf" / "train.yaml").read_text())["data"]["synth"]
    assert synth == {"seed": a.seed, "n_train": a.n_train, "n_dev": a.n_dev, "n_test": a.n_test, "names": a.names}
    # ... and so does `agentr1 data synth --out data` with no flags (the README's example).
    bare = build_parser().parse_args(["data", "synth", "--out", "unused"])
    assert vars(bare) | {"out": "unused"} == vars(a) | {"out": "unused"}


@pytest.mark.slow
def test_regenerated_data_hashes_to_data_dvc(regenerated, pinned):
    _check_pinned(regenerated, pinned)


@pytest.mark.slow
def test_regenerated_sql_data_hashes_to_data_sql_dvc(tmp_path):
    """data-sql.dvc pins conf/sql.yaml's world, its database included (~30 s to generate)."""
    a = _makefile_synth_args("DATA_SQL_SYNTH")
    synth = yaml.safe_load((ROOT / "conf" / "sql.yaml").read_text())["data"]["synth"]
    assert synth == {"seed": a.seed, "n_train": a.n_train, "n_dev": a.n_dev, "n_test": a.n_test, "names": a.names}
    _check_pinned(_regenerate(tmp_path / "data-sql", "DATA_SQL_SYNTH"), _pinned("data-sql"))


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["bfcl-smollm2", "calculator-smollm2"])
def test_converted_real_data_hashes_to_its_dvc_pin(preset, tmp_path, monkeypatch):
    """data-bfcl.dvc and data-calculator.dvc pin what the presets' data.sources convert to (BFCL
    from the bfcl-eval package, SVAMP and MAWPS + ASDiv-A from ../shared/realdata)."""
    from agentr1.config import load_config
    from agentr1.recipe.workspace import ensure_data

    name = load_config(ROOT / "conf" / f"{preset}.yaml").data.dir
    cfg = load_config(ROOT / "conf" / f"{preset}.yaml", [f"data.dir={tmp_path / name}"])
    for source in cfg.data.sources:  # relative inputs are the repository's, as `dvc repro` runs them
        if source.input and not Path(source.input).is_absolute():
            if not (ROOT / source.input).exists():
                pytest.skip(f"{source.input}: the shared real data is not on this machine")
    monkeypatch.chdir(ROOT)
    _check_pinned(ensure_data(cfg), _pinned(name))


def _check_pinned(regenerated: Path, pinned: dict) -> None:
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db import HashFileDB
    from dvc_objects.fs.local import LocalFileSystem

    from dvc.ignore import DvcIgnoreFilter

    from agentr1.data.records import MARKER_FILE

    fs = LocalFileSystem()
    odb = HashFileDB(fs, str(regenerated.parent / "odb"))
    # Hashed with the repository's .dvcignore, as `dvc add` / `dvc commit` do: it leaves out the
    # generator's marker, which must not change the pinned hash.
    assert (regenerated / MARKER_FILE).is_file()
    shutil.copy2(ROOT / ".dvcignore", regenerated.parent / ".dvcignore")
    ignore = DvcIgnoreFilter(fs, str(regenerated.parent))
    _, meta, obj = build(odb, str(regenerated), fs, pinned.get("hash", "md5"), dry_run=True, ignore=ignore)
    assert (meta.nfiles, meta.size) == (pinned["nfiles"], pinned["size"])
    assert obj.hash_info.value == pinned["md5"], (
        f"the synthetic generator no longer reproduces {regenerated.name}.dvc: if the change is intended, "
        f"regenerate {regenerated.name}/ and run `dvc add {regenerated.name}`")


def test_pipeline_is_validate_warmup_ppo_evaluate(dvc_repo):
    stages, edges = dvc_repo["stages"], dvc_repo["edges"]
    pins = {f.name for f in ROOT.glob("*.dvc") if f.is_file()}  # data.dvc, data-sql.dvc, the real benchmarks' pins
    assert {DATA_STAGE, "data-sql.dvc", "data-bfcl.dvc", "data-calculator.dvc"} <= pins
    assert set(stages) == {*pins, MODEL_STAGE, *PIPELINE}
    assert not {b for a, b in edges if a == MODEL_STAGE}
    upstream = {name: {b for a, b in edges if a == name} - {DATA_STAGE} for name in PIPELINE}
    assert upstream == {"validate": set(), "warmup": {"validate"}, "ppo": {"warmup"},
                        "evaluate": {"ppo", "warmup"}}
    for name in PIPELINE:  # every stage reads the pinned data
        assert (name, DATA_STAGE) in edges, name


def test_stages_write_where_their_outs_say(dvc_repo):
    """The trainer writes under output_dir; each train stage must point it at its outs' dir."""
    for name in PIPELINE:
        stage = dvc_repo["stages"][name]
        run_dirs = {Path(o.def_path).parts[:2] for o in stage.outs}
        assert len(run_dirs) == 1, (name, run_dirs)
        run_dir = "/".join(run_dirs.pop())
        cmd = stage.cmd if isinstance(stage.cmd, str) else stage.cmd[0]
        if "agentr1 train" in cmd:
            assert f"-o output_dir={run_dir}" in cmd and "-o data.dir=data" in cmd, (name, cmd)


def test_params_exist_in_config_and_cover_it():
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    named: set[str] = set()
    for name, stage in spec.items():
        for entry in stage.get("params", []):
            assert isinstance(entry, dict), f"dvc.yaml: stage {name}: params should name their file"
            for file, keys in entry.items():
                conf = yaml.safe_load((ROOT / file).read_text())
                for key in keys:
                    _lookup(conf, key)  # KeyError names the key DVC would report missing
                    named.add(key.split(".")[0])
    conf = yaml.safe_load((ROOT / "conf" / "train.yaml").read_text())
    assert set(conf) - UNTRACKED_SECTIONS <= named, "a config section that no stage lists reruns nothing"


def _clean_clone(dst: Path, data: Path) -> Path:
    """What a clone holds after `make data`: pipeline files, code, config and the regenerated data."""
    for name in ("dvc.yaml", "data.dvc", ".dvcignore"):
        shutil.copy2(ROOT / name, dst / name)
    (dst / ".dvc").mkdir()
    shutil.copy2(ROOT / ".dvc" / "config", dst / ".dvc" / "config")
    # No git here: DVC's own no-SCM mode (config.local is what `dvc config --local` writes).
    (dst / ".dvc" / "config.local").write_text("[core]\n    no_scm = true\n")
    for tree in ("agentr1", "models", "conf"):
        shutil.copytree(ROOT / tree, dst / tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copytree(data, dst / "data")
    return dst


@pytest.mark.slow  # ~15 s: regenerates the data set, then `make data-check` and `dvc repro --dry`
def test_make_data_check_and_repro_dry_run(regenerated, dvc_repo, tmp_path):
    clone = _clean_clone(tmp_path, regenerated)
    # The check `make data` runs: refuses (exit 1) unless data/ hashes to data.dvc.
    check = _dvc(clone, "commit", "--quiet", DATA_STAGE)
    assert check.returncode == 0, check.stderr
    # `repro --dry` stats the upstream outputs a stage depends on, even though nothing runs
    # (DVC issue 9021): stand-ins for those let it walk the whole pipeline.
    stages = dvc_repo["stages"]
    produced = {o.def_path for s in stages.values() if s.addressing != DATA_STAGE for o in s.outs}
    for dep in {d.def_path for s in stages.values() for d in s.deps} & produced:
        path = clone / dep
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}") if path.suffix else path.mkdir()
    dry = _dvc(clone, "repro", "--dry")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    ran = re.findall(r"Running stage '([^']+)'", dry.stdout)
    assert tuple(r for r in ran if r != MODEL_STAGE) == PIPELINE and MODEL_STAGE in ran, dry.stdout


@pytest.mark.slow  # the regenerated data set's fixture: ~15 s
def test_changed_data_fails_the_check(regenerated, tmp_path):
    clone = _clean_clone(tmp_path, regenerated)
    with open(clone / "data" / "qa" / "test.jsonl", "a") as f:
        f.write("\n")
    check = _dvc(clone, "commit", "--quiet", DATA_STAGE)
    assert check.returncode == 1, check.stderr
    assert (clone / DATA_STAGE).read_text() == (ROOT / DATA_STAGE).read_text()  # refused, not rewritten
