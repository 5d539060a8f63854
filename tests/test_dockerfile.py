"""The Dockerfile copies what the installed package and the shipped presets need (no Docker
engine here to build it: the file is read). `cli/` had been left out when the CLI moved there, so
the image's `agentr1` could not start."""
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _copied() -> tuple[list[str], int]:
    """The COPY sources in order, and the index of the first one after `pip install -e`."""
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    sources, install_at = [], None
    for line in lines:
        if line.startswith("COPY "):
            sources += line.split()[1:-1]
        elif "pip install" in line and "-e" in line and install_at is None:
            install_at = len(sources)
    assert install_at is not None, "no `pip install -e` in the Dockerfile"
    return sources, install_at


def test_every_package_is_copied_before_the_editable_install():
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    sources, install_at = _copied()
    for pattern in packages["include"]:
        name = pattern.rstrip("*")
        assert name in sources[:install_at], f"Dockerfile: package {name}/ is not copied before `pip install -e`"


def test_every_plugin_a_preset_loads_is_in_the_image():
    sources, _ = _copied()
    for preset in sorted((ROOT / "conf").glob("*.yaml")):
        for plugin in (yaml.safe_load(preset.read_text()) or {}).get("plugins") or []:
            if re.fullmatch(r"[\w.]+", plugin):  # a module name: an installed package's
                continue
            assert any(plugin == s or plugin.startswith(s.rstrip("/") + "/") for s in sources), \
                f"Dockerfile: {preset.name} loads {plugin}, which the image does not copy"
