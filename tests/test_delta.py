"""A policy trained from a catalog build is saved as what training changed (models/delta.py),
loads back equal, and a base that is missing or holds other weights is refused in one line."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_models import _corpus, make_tiny_qwen

from agentr1.fsutil import DamagedError
from models.delta import BASE_FILE, DELTA_FILE, DIGEST_FILE, WEIGHTS_FILE
from models.policy import BASE_ATTR, load_actor_critic, save_actor_critic, train_top_layers


@pytest.fixture
def base(tmp_path):
    """A tiny instruct model as a catalog build (the build record is what marks one)."""
    return make_tiny_qwen(tmp_path / "cache" / "tiny-base", _corpus(0, 300))


def trained(base):
    """The base as an actor-critic, its top layer and value head changed as training would."""
    model, tokenizer = load_actor_critic(base)
    train_top_layers(model, 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01)
    return model, tokenizer


def test_only_what_training_changed_is_saved_and_it_loads_back_equal(base, tmp_path):
    model, tokenizer = trained(base)
    out = save_actor_critic(model, tokenizer, tmp_path / "final")
    assert not (out / WEIGHTS_FILE).exists() and (out / DELTA_FILE).is_file()
    delta = load_file(str(out / DELTA_FILE))
    top = f"model.layers.{len(model.policy.model.layers) - 1}."
    assert delta and all(k.startswith(top) or k == "model.norm.weight" for k in delta), sorted(delta)
    assert (out / DELTA_FILE).stat().st_size < (base / WEIGHTS_FILE).stat().st_size / 2
    record = json.loads((out / BASE_FILE).read_text())
    assert record["name"] == "tiny-base" and len(record["sha256"]) == 64

    again, _ = load_actor_critic(out)
    want, got = model.state_dict(), again.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert getattr(again.policy, BASE_ATTR).sha256 == record["sha256"]  # a checkpoint of it is a delta too


def test_a_base_with_other_weights_is_refused_in_one_line(base, tmp_path):
    model, tokenizer = trained(base)
    out = save_actor_critic(model, tokenizer, tmp_path / "final")
    weights = load_file(str(base / WEIGHTS_FILE))
    weights["model.embed_tokens.weight"][0, 0] += 1.0
    save_file(weights, str(base / WEIGHTS_FILE), metadata={"format": "pt"})  # its digest file is now stale
    with pytest.raises(DamagedError, match="the delta would apply to other weights") as err:
        load_actor_critic(out)
    assert "\n" not in str(err.value)


def test_a_missing_base_is_refused_with_what_to_do(base, tmp_path):
    model, tokenizer = trained(base)
    out = save_actor_critic(model, tokenizer, tmp_path / "final")
    shutil.rmtree(base)
    with pytest.raises(DamagedError, match="agentr1 model build tiny-base"):
        load_actor_critic(out)


def test_the_base_is_hashed_once_while_its_weights_stay_as_they_were(base):
    load_actor_critic(base)
    digest = (base / DIGEST_FILE).read_text().split()
    assert len(digest) == 3 and len(digest[0]) == 64
    (base / DIGEST_FILE).write_text(f"{'0' * 64} {digest[1]} {digest[2]}\n")  # taken as is: not hashed again
    model, _ = load_actor_critic(base)
    assert getattr(model.policy, BASE_ATTR).sha256 == "0" * 64


def test_a_policy_not_from_a_catalog_build_is_saved_whole(tmp_path):
    path = make_tiny_qwen(tmp_path / "plain", _corpus(0, 300), catalog_build=False)
    model, tokenizer = load_actor_critic(path)
    out = save_actor_critic(model, tokenizer, tmp_path / "final")
    assert (out / WEIGHTS_FILE).is_file() and not (out / DELTA_FILE).exists()


def test_export_writes_a_standalone_copy_that_loads_without_the_base(base, tmp_path, capsys):
    from cli.main import main

    model, tokenizer = trained(base)
    final = save_actor_critic(model, tokenizer, tmp_path / "final")
    assert main(["model", "export", str(final), "--out", str(tmp_path / "whole")]) == 0
    whole = tmp_path / "whole"
    assert (whole / WEIGHTS_FILE).is_file() and not (whole / DELTA_FILE).exists() and not (whole / BASE_FILE).exists()
    shutil.rmtree(base)
    again, _ = load_actor_critic(whole)
    want, got = model.state_dict(), again.state_dict()
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert main(["model", "export", str(final), "--out", str(whole)]) == 2  # never over what is there
    assert "exists and is not empty" in capsys.readouterr().err
