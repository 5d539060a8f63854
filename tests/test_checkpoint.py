"""Checkpoints hold tensors and plain data only: they resume exactly and never run code on load."""
from __future__ import annotations

import pickletools
import random
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from agentr1 import checkpoint as ckpt
from agentr1.config import load_config
from agentr1.rl.optim import MuonWithAdamW, muon_groups

REPO = Path(__file__).resolve().parents[1]
# The packages whose code may load a checkpoint a user was handed.
LOADING_PACKAGES = ("agentr1", "adapters", "tasks", "flows", "models")


class _Tiny(nn.Module):
    """Names its 2-D weight ``layers.0`` so ``muon_groups`` gives it a Muon group."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.layers = nn.ModuleList([nn.Linear(4, 4)])
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(self.layers[0](self.embed(x))).sum()


def _optimizer(kind: str, model: nn.Module):
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-2)
    return MuonWithAdamW(muon_groups(model, muon_lr=0.02, adamw_lr=1e-2))


def _trained(kind: str, steps: int = 3):
    torch.manual_seed(0)
    model = _Tiny()
    opt = _optimizer(kind, model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    for _ in range(steps):
        _step(model, opt, sched)
    return model, opt, sched


def _step(model, opt, sched) -> None:
    opt.zero_grad()
    model(torch.tensor([0, 1, 2, 4])).backward()
    opt.step()
    sched.step()


def _save(path: Path, opt, sched, iteration: int = 3) -> Path:
    return ckpt.save_checkpoint(path, lambda d: d.mkdir(), opt, sched, iteration, {"history": []})


def _draws() -> tuple:
    """A few values from every global stream, the cached-Gaussian paths included."""
    return (random.random(), random.gauss(0, 1), random.getrandbits(70),
            np.random.standard_normal(3).tolist(), np.random.randint(0, 10**6, 4).tolist(),
            torch.rand(4).tolist(), torch.randint(0, 10**6, (3,)).tolist())


def test_resume_restores_every_rng_stream(tmp_path):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    random.gauss(0, 1), np.random.standard_normal()  # leave a cached second Gaussian in both
    _, opt, sched = _trained("adamw")
    _save(tmp_path / "last", opt, sched)
    expected = _draws()
    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    assert _draws() != expected  # the streams really moved
    ckpt.set_rng_state(ckpt.load_trainer_state(tmp_path / "last")["rng"])
    assert _draws() == expected


@pytest.mark.parametrize("kind", ["adamw", "muon"])
def test_resume_restores_optimizer_and_scheduler_exactly(tmp_path, kind):
    model, opt, sched = _trained(kind)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    _save(tmp_path / "last", opt, sched)
    state = ckpt.load_trainer_state(tmp_path / "last")
    assert sorted(state) == ["iteration", "optimizer", "rng", "scheduler"] and state["iteration"] == 3

    fresh = _Tiny()
    fresh.load_state_dict(saved)
    opt2 = _optimizer(kind, fresh)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda step: 1.0 / (1 + step))
    opt2.load_state_dict(state["optimizer"])
    sched2.load_state_dict(state["scheduler"])
    assert sched2.get_last_lr() == sched.get_last_lr()
    for _ in range(2):  # the continued and the resumed run take identical steps
        _step(model, opt, sched)
        _step(fresh, opt2, sched2)
    for name, p in model.state_dict().items():
        assert torch.equal(p, fresh.state_dict()[name]), name


class _WritesMarker:
    """Unpickling this creates ``path`` (``open(path, "w")``): what a crafted checkpoint runs."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_crafted_checkpoint_is_refused_without_running_its_code(tmp_path):
    last = tmp_path / "last"
    last.mkdir()
    marker = tmp_path / "pwned"
    torch.save({"format": ckpt.TRAINER_FORMAT, "optimizer": {}, "scheduler": None, "iteration": 0,
                "rng": _WritesMarker(marker)}, last / ckpt.TRAINER_FILE)
    with pytest.raises(ckpt.UnsafeCheckpointError, match="cannot be loaded safely") as err:
        ckpt.load_trainer_state(last)
    assert str(last / ckpt.TRAINER_FILE) in str(err.value)
    assert not marker.exists()
    # The payload is armed, read without running it: the pickle inside the file tells the
    # unpickler to import open (io.open) and call it on the marker's path.
    with zipfile.ZipFile(last / ckpt.TRAINER_FILE) as archive:
        pickled = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(pickled)]
    names = [name for name, _ in ops]
    strings = [arg for _, arg in ops if isinstance(arg, str)]
    assert "REDUCE" in names and str(marker) in strings, strings
    assert any(name == "GLOBAL" and arg.split()[-1] == "open" for name, arg in ops), ops


def test_old_pickled_checkpoint_is_refused_with_the_file_named(tmp_path):
    last = tmp_path / "last"
    last.mkdir()
    _, opt, sched = _trained("adamw", steps=1)
    old_rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "rng": old_rng,
                "iteration": 1}, last / ckpt.TRAINER_FILE)
    with pytest.raises(ckpt.UnsafeCheckpointError, match=re.escape(str(last / ckpt.TRAINER_FILE))):
        ckpt.load_trainer_state(last)


def test_a_safe_file_of_the_wrong_layout_names_the_field(tmp_path):
    last = tmp_path / "last"
    last.mkdir()
    torch.save({"format": ckpt.TRAINER_FORMAT, "optimizer": {}, "scheduler": None, "rng": {},
                "iteration": 2}, last / ckpt.TRAINER_FILE)
    with pytest.raises(ValueError, match="field 'rng'"):
        ckpt.load_trainer_state(last)


class _Warmup:
    """A callable LR factor with state: LambdaLR saves its ``__dict__``, here a numpy scalar."""

    def __init__(self):
        self.steps = np.float64(10.0)

    def __call__(self, step):
        return min(1.0, (step + 1) / float(self.steps))


def test_unsafe_scheduler_state_fails_at_save_naming_the_field_and_writes_nothing(tmp_path):
    _, opt, _ = _trained("adamw", steps=1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _Warmup())
    with pytest.raises(TypeError, match=r"\['scheduler'\]\['lr_lambdas'\]\[0\]\['steps'\] is a numpy"):
        _save(tmp_path / "last", opt, sched)
    assert list(tmp_path.iterdir()) == []


def _call_args(text: str, start: int) -> str:
    """The argument text of a call whose "(" ends just before ``start``."""
    depth = 1
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return text[start:]


def test_no_loader_unpickles_arbitrary_objects():
    offenders = []
    for package in LOADING_PACKAGES:
        for file in sorted((REPO / package).rglob("*.py")):
            text = file.read_text()
            if "weights_only=False" in text:
                offenders.append(f"{file.relative_to(REPO)}: weights_only=False")
            for m in re.finditer(r"torch\.load\(", text):
                call = _call_args(text, m.end())
                if "weights_only=True" not in call:
                    offenders.append(f"{file.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {call}")
    assert offenders == []


# ----------------------------------------------------------------------------- damaged checkpoints


def _flip(path, at: float = 0.75) -> None:
    """Flip one byte in the last quarter of a file (inside the tensor data of a safetensors file:
    the values stay finite, bit rot a load would not notice)."""
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


def _drop_a_tensor(path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    tensors.pop(sorted(tensors)[0])
    save_file(tensors, str(path))


DAMAGES = {
    "policy weights truncated": ("checkpoints/last/policy/model.safetensors",
                                 lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])),
    "policy weights missing": ("checkpoints/last/policy/model.safetensors", lambda p: p.unlink()),
    "policy weights bit rot": ("checkpoints/last/policy/model.safetensors", _flip),
    "policy missing a tensor": ("checkpoints/last/policy/model.safetensors", _drop_a_tensor),
    "value head missing": ("checkpoints/last/policy/value_head.safetensors", lambda p: p.unlink()),
    "value head bit rot": ("checkpoints/last/policy/value_head.safetensors", lambda p: _flip(p, 0.99)),
    "trainer state truncated": ("checkpoints/last/trainer_state.pt",
                                lambda p: p.write_bytes(p.read_bytes()[:100])),
    "trainer state missing": ("checkpoints/last/trainer_state.pt", lambda p: p.unlink()),
    "state.json corrupt": ("checkpoints/last/state.json", lambda p: p.write_text('{"iteration": 1, "hist')),
    "state.json missing": ("checkpoints/last/state.json", lambda p: p.unlink()),
    "model config corrupt": ("checkpoints/last/policy/config.json", lambda p: p.write_text("{not json")),
    "tokenizer missing": ("checkpoints/last/policy/tokenizer.json", lambda p: p.unlink()),
    "manifest missing": ("checkpoints/last/agentr1-manifest.json", lambda p: p.unlink()),
    "manifest corrupt": ("checkpoints/last/agentr1-manifest.json", lambda p: p.write_text("[")),
    "reference value head missing": ("warmup/value_head.safetensors", lambda p: p.unlink()),
}


@pytest.fixture(scope="module")
def checkpointed_run(tmp_path_factory):
    """A tiny run with its warm-up and one PPO checkpoint."""
    from test_trainer import TINY

    from agentr1.recipe.ppo import train_ppo
    from agentr1.recipe.warmup import warmup
    from agentr1.recipe.workspace import Workspace

    root = tmp_path_factory.mktemp("ckrun")
    cfg = load_config("conf/train.yaml", [f"data.dir={root / 'data'}", f"output_dir={root / 'run'}", *TINY,
                                          "ppo.iterations=1", "rollout.backend=hf"])
    ws = Workspace.build(cfg)
    warmup(cfg, ws)
    train_ppo(cfg, ws)
    return cfg, ws


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_checkpoint_is_refused_naming_the_file(damage, checkpointed_run, tmp_path):
    """Each damage stops the resume before any weight is loaded, with one line that names the file
    (or the manifest that cannot vouch for it) and what to do; nothing resumes from fresh weights."""
    from agentr1.fsutil import DamagedError
    from agentr1.recipe.ppo import PPOSession

    cfg, ws = checkpointed_run
    run = tmp_path / "run"
    shutil.copytree(cfg.output_dir, run)
    rel, damage_fn = DAMAGES[damage]
    damage_fn(run / rel)
    with pytest.raises(DamagedError) as info:
        PPOSession(cfg.model_copy(update={"output_dir": str(run)}), ws)
    message = str(info.value)
    assert "\n" not in message and (str(run / rel) in message or "agentr1-manifest.json" in message), message
    assert "move" in message or "delete" in message or "restore" in message


def test_a_checkpoint_without_a_weight_is_never_filled_at_random(checkpointed_run, tmp_path):
    """Without a manifest to vouch for it (a directory from elsewhere), a policy lacking a tensor is
    still refused: transformers would initialise the tensor at random and only warn."""
    from agentr1.fsutil import MANIFEST, DamagedError
    from models.policy import load_actor_critic

    cfg, _ = checkpointed_run
    policy = tmp_path / "policy"
    shutil.copytree(Path(cfg.output_dir) / "warmup", policy)
    (policy / MANIFEST).unlink()
    _drop_a_tensor(policy / "model.safetensors")
    with pytest.raises(DamagedError, match=r"lacks \d+ weight"):
        load_actor_critic(policy)


def test_the_cli_says_a_damaged_checkpoint_in_one_line_and_exits_2(checkpointed_run, tmp_path, capsys):
    from test_trainer import TINY

    from cli.main import EXIT_BAD_INPUT, main

    cfg, _ = checkpointed_run
    run = tmp_path / "run"
    shutil.copytree(cfg.output_dir, run)
    (run / ".agentr1-run").touch()  # the fixture's run was made below the CLI, which claims its directory
    _flip(run / "checkpoints/last/policy/model.safetensors")
    overrides = [f"data.dir={cfg.data.dir}", f"output_dir={run}", *TINY, "ppo.iterations=2", "rollout.backend=hf"]
    assert main(["train", "--stage", "ppo", *[x for o in overrides for x in ("-o", o)]]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("agentr1: error: ") and "model.safetensors: its sha256 differs" in err[-1]
    assert "Traceback" not in "\n".join(err)
