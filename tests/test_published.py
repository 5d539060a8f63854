"""Every published table is re-derived from the repository alone.

Each study in docs/results/ has its export (``<study>.jsonl``, written by ``agentr1 report``);
``agentr1 report --from`` on that file must give back the committed markdown and plot byte for
byte, and the summary block in every document that includes the study (README.md, docs/*.md,
between ``<!-- report:<study> -->`` markers) exactly as committed. No MLflow store is read.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agentr1.report import EXPORT_SUFFIX, markers, read_export, render_study

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
EXPORTS = sorted(RESULTS.glob(f"*{EXPORT_SUFFIX}"))
# Studies whose runs predate the exports (issue 31): their MLflow store stayed on the machine that
# ran them, and the table is regenerated when the study is re-run from a clean tree.
AWAITING_EXPORT: dict[str, str] = {}  # study -> why its table has no export yet (every table has one now)


def _including(study: str) -> list[Path]:
    begin, _ = markers(study)
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [d for d in docs if begin in d.read_text(encoding="utf-8")]


def test_every_published_table_has_its_export():
    tables = {p.stem for p in RESULTS.glob("*.md") if p.name != "README.md"}
    missing = tables - {p.name.removesuffix(EXPORT_SUFFIX) for p in EXPORTS} - set(AWAITING_EXPORT)
    assert not missing, f"docs/results tables without an export: {sorted(missing)} (agentr1 report writes it)"
    assert not set(AWAITING_EXPORT) & {p.name.removesuffix(EXPORT_SUFFIX) for p in EXPORTS}, \
        "a study now has its export: take it off AWAITING_EXPORT"


@pytest.mark.parametrize("export", EXPORTS, ids=lambda p: p.name)
def test_published_study_regenerates_byte_for_byte(export, tmp_path):
    study = read_export(export)
    docs = _including(study.name)
    # The same layout as the repository, so that links from each document come out the same.
    for doc in docs:
        (tmp_path / doc.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(doc, tmp_path / doc.relative_to(ROOT))
    out = tmp_path / RESULTS.relative_to(ROOT)
    paths = render_study(study, out, [tmp_path / d.relative_to(ROOT) for d in docs], export)
    for kind, path in paths.items():
        committed = RESULTS / path.name
        assert path.read_bytes() == committed.read_bytes(), \
            f"{committed.relative_to(ROOT)} differs from `agentr1 report --from {export.relative_to(ROOT)}`"
    for doc in docs:
        assert (tmp_path / doc.relative_to(ROOT)).read_text(encoding="utf-8") == doc.read_text(encoding="utf-8"), \
            f"{doc.relative_to(ROOT)}: the {study.name} block differs from its export's"
