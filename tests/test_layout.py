"""The code's layout holds what docs/design.md promises: ``tasks/`` holds Prefect task modules
only, each environment kind is one folder that declares itself, and no module grows past what
one reader holds (600 lines)."""
import ast
import importlib
from pathlib import Path

import pytest

from agentr1.env import registry

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("agentr1", "adapters", "tasks", "flows", "models", "cli")
MAX_LINES = 600


def _decorators(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        for d in getattr(node, "decorator_list", []):
            target = d.func if isinstance(d, ast.Call) else d
            names.add(target.id if isinstance(target, ast.Name) else getattr(target, "attr", ""))
    return names


@pytest.mark.parametrize("module", sorted(p.name for p in (REPO / "tasks").glob("*.py") if p.name != "__init__.py"))
def test_every_module_in_tasks_defines_a_prefect_task(module):
    assert "task" in _decorators(REPO / "tasks" / module), f"tasks/{module} defines no @task: it belongs elsewhere"


def test_no_module_is_longer_than_one_reader_holds():
    long = [f"{p.relative_to(REPO)}: {n}" for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert long == []


@pytest.mark.parametrize("kind", [k for k in registry.environment_kinds() if k != "tools"])
def test_each_built_in_kind_is_one_folder_holding_its_builder_generator_converters_and_tools(kind):
    package = importlib.import_module(f"agentr1.env.{kind}")
    assert registry.env_kind(kind) is package.KIND  # the registry's entry is the one the folder declares
    home = f"agentr1.env.{kind}."
    spec = package.KIND
    targets = [spec.build, *([spec.synth] if spec.synth else []), *spec.converters.values(),
               *(t.make for t in getattr(package, "TOOLS", ()))]
    assert all(isinstance(t, str) and t.startswith(home) for t in targets), targets
    assert Path(package.__file__).parent == REPO / "agentr1" / "env" / kind
