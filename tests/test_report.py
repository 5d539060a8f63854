"""`agentr1 report`: a study's tables and plot regenerated from its MLflow runs, the spread over
warm-ups kept apart from the spread over PPO seeds, every number traced to its run."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from pathlib import Path

import pytest
from test_ablation import TINY_ABLATION

from agentr1.ablation import FULL
from agentr1.report import (Claim, Provenance, RunRecord, ablation_table, baselines_table, group_table, groups_of,
                            ordering, ordering_markdown, pipeline_table, provenance_markdown, provenance_summary, spread)
from agentr1.rundir import weights_digest
from adapters import tracking

ROOT = Path(__file__).resolve().parents[1]
OUTCOME = "ppo-outcome-only"
STUDY = "tiny-study"
WARMUP_SEEDS = (0, 1)


def record(variant: str, warmup: str, seed: int, em: float, start: float | None = None) -> RunRecord:
    return RunRecord(variant, warmup, seed, {"greedy/em": em, "sampled/em": em / 2},
                     Provenance(f"run-{variant}-{warmup}-{seed}", "c0ffee", "d4t4.dir", "cfg"),
                     start={"greedy/em": start, "sampled/em": start / 2} if start is not None else {})


def test_spread_over_warmups_and_over_seeds_in_closed_form():
    s = spread({"w0": [1.0, 3.0], "w1": [5.0, 7.0]})
    assert s.mean == 4.0
    assert math.isclose(s.over_warmups, statistics.stdev([2.0, 6.0]))  # of the per-warm-up means
    assert math.isclose(s.over_seeds, math.sqrt(2.0))  # both warm-ups' seed std, averaged
    assert math.isclose(s.overall, statistics.stdev([1.0, 3.0, 5.0, 7.0]))
    assert (s.warmups, s.runs) == (2, 4)
    one = spread({"w0": [0.5]})
    assert one.mean == 0.5 and math.isnan(one.over_warmups) and math.isnan(one.over_seeds)


def test_the_papers_claims_hold_beyond_within_or_not():
    recs = [record(FULL, w, s, em) for w, s, em in [("a", 0, 0.60), ("a", 1, 0.62), ("b", 0, 0.64), ("b", 1, 0.66)]]
    recs += [record(OUTCOME, w, s, em) for w, s, em in [("a", 0, 0.40), ("a", 1, 0.42), ("b", 0, 0.44), ("b", 1, 0.46)]]
    recs += [record("ppo-no-adv-mask", w, s, em) for w, s, em in [("a", 0, 0.20), ("a", 1, 0.90), ("b", 0, 0.55),
                                                                     ("b", 1, 0.60)]]
    claims = {(c.better, c.worse): c for c in ordering(recs)}
    assert claims[FULL, OUTCOME].verdict == "holds beyond one standard deviation"
    assert math.isclose(claims[FULL, OUTCOME].difference, 0.2)
    assert claims[FULL, "ppo-no-adv-mask"].verdict == "holds, within one standard deviation"  # 0.63 vs 0.5625
    assert claims["ppo-no-adv-mask", "ppo-no-masks"].verdict == "not measured"
    assert Claim("x", "y", "greedy/em", -0.1, 0.05).verdict == "does not hold (reversed)"
    assert Claim("x", "y", "greedy/em", 0.818 - 0.818, 0.02).verdict == "does not hold (equal means)"
    assert Claim("x", "y", "greedy/em", 1 / 1200, 0.02).verdict == "holds, within one standard deviation"
    # paired over the (warm-up, seed) cells both ran: full - no-adv-mask = 0.40, -0.28, 0.09, 0.06 (mean 0.0675)
    paired = claims[FULL, "ppo-no-adv-mask"]
    assert paired.paired == pytest.approx((0.40, -0.28, 0.09, 0.06))
    assert paired.paired_cell == f"+0.067 ± {statistics.stdev([0.40, -0.28, 0.09, 0.06]):.3f} (3/4)"
    assert claims["ppo-no-adv-mask", "ppo-no-masks"].paired_cell == "n/a"
    assert "| 0.200 | 0.026 | holds beyond one standard deviation | +0.200 ± 0.000 (4/4) |" in ordering_markdown(
        [claims[FULL, OUTCOME]])
    table = ablation_table(recs)
    assert f"(`{FULL}`) | 2 x 2/2 | **0.630** | 0.028 | 0.014 |" in table


def test_provenance_says_when_the_code_was_not_committed():
    clean, dirty = record("ppo", "a", 0, 0.5), record("ppo", "a", 1, 0.5)
    dirty = RunRecord(dirty.variant, dirty.warmup, dirty.seed, dirty.final,
                      Provenance("run-dirty", "c0ffee+dirty", "d4t4.dir", "cfg"))
    assert "code not fully recorded" not in provenance_summary([clean])
    assert "code not fully recorded" in provenance_summary([clean, dirty])
    assert "`c0ffee` (uncommitted changes)" in provenance_markdown([dirty])


def test_the_pipeline_table_gives_each_run_and_the_mean_gain():
    text = pipeline_table([record("pipeline", "seed 0", 0, 0.9, start=0.5), record("pipeline", "seed 1", 1, 0.7,
                                                                                  start=0.5)])
    assert "| 1 | 0 | 0.500 -> **0.900** (+0.400) |" in text
    assert "0.500 -> **0.800** ± 0.141 (gain 0.300 ± 0.141)" in text
    assert "`run-pipeline-seed 1-1`" in text


def test_the_baselines_table_puts_the_untrained_model_beside_the_agent():
    runs = [dataclasses.replace(record("pipeline", f"seed {s}", s, 0.9 - 0.2 * s, start=0.4),
                                baselines={"zero_shot": {"greedy/em": 0.0, "sampled/em": 0.0},
                                           "naive_rag": {"greedy/em": 0.1 + 0.1 * s, "sampled/em": 0.05}})
            for s in (0, 1)]
    lines = baselines_table(runs).splitlines()
    assert lines[0] == "| policy | test greedy/em | test sampled/em |"
    assert lines[2] == "| zero-shot (the instruct model as it comes) | 0.000 ± 0.000 | 0.000 ± 0.000 |"
    assert lines[3] == "| naive RAG (a search for the question, then the answer) | 0.150 ± 0.071 | 0.050 ± 0.000 |"
    assert lines[4].startswith("| warm-up (supervised, on the demonstrations) | 0.400 ± 0.000 |")
    assert lines[5] == "| after PPO | 0.800 ± 0.141 | 0.400 ± 0.071 |"
    assert "±" not in baselines_table(runs[:1])  # one run: no spread to show


def test_the_group_table_gives_each_benchmark_category_beside_the_baselines():
    """BFCL's leaderboard reports each category: so does a study whose environment groups its
    questions (greedy/<group>/em); hop counts are not groups."""
    def metrics(base: float) -> dict[str, float]:
        return {"greedy/em": base, "greedy/hops1/em": base, "greedy/simple_python/em": base + 0.1,
                "greedy/simple_python/n": 400.0, "greedy/live_simple/em": base - 0.1, "greedy/live_simple/n": 258.0}

    runs = [dataclasses.replace(record("pipeline", f"seed {s}", s, 0.5), final=metrics(0.5 + 0.1 * s),
                                start=metrics(0.4), baselines={"zero_shot": metrics(0.1)}) for s in (0, 1)]
    assert groups_of(runs) == ["simple_python", "live_simple"]
    lines = group_table(runs).splitlines()
    assert lines[0] == "| test greedy/em by group | questions | zero-shot | warm-up | after PPO |"
    assert lines[2] == "| simple_python | 400 | 0.200 ± 0.000 | 0.500 ± 0.000 | 0.650 ± 0.071 |"
    assert lines[3] == "| live_simple | 258 | 0.000 ± 0.000 | 0.300 ± 0.000 | 0.450 ± 0.071 |"
    assert groups_of([record("pipeline", "seed 0", 0, 0.5)]) == []


@pytest.fixture(scope="module")
def tiny_study(prefect_api, tmp_path_factory):
    """Two ablation flow runs, one per warm-up seed, tagged as one study: two RL variants x one
    PPO seed each, 2 PPO iterations, in this process (real runs in the tests' SQLite MLflow
    store). The spread over seeds is tested in closed form above."""
    import torch

    from flows.ablation import ablation
    from flows.forms import AblationParams

    before = torch.get_num_threads()  # the sequential runner sets this process's threads
    root = tmp_path_factory.mktemp("study")
    results = []
    for w in WARMUP_SEEDS:
        overrides = [f"data.dir={root / 'data'}", *TINY_ABLATION, f"variants=[{FULL},{OUTCOME}]", "seeds=[0]",
                     "runner.kind=sequential", "runner.threads_per_worker=1", f"seed={w}", f"study={STUDY}"]
        results.append(ablation(AblationParams(preset="quick", overrides=overrides, output_dir=str(root / f"w{w}"))))
    torch.set_num_threads(before)
    return root, results


@pytest.mark.slow
def test_report_regenerates_the_study_from_mlflow(tiny_study, capsys):
    from cli.main import main

    root, results = tiny_study
    out = root / "results"
    readme = root / "README.md"
    readme.write_text(f"# Results\n\n<!-- report:{STUDY} -->\nold numbers\n<!-- /report:{STUDY} -->\n\nThe end.\n")
    assert main(["report", "--study", STUDY, "--out", str(out), "--include", str(readme)]) == 0
    paths = json.loads(capsys.readouterr().out)
    text = (out / f"{STUDY}.md").read_text()
    assert paths["markdown"] == str(out / f"{STUDY}.md") and (out / f"{STUDY}.png").stat().st_size > 0
    assert f"agentr1 report --study {STUDY} --out {out} --include {readme}" in text
    included = readme.read_text()
    assert "old numbers" not in included and included.endswith("\n\nThe end.\n")
    assert f"(`{FULL}`) | 2 x 1/1 |" in included and f"[{STUDY}.md](results/{STUDY}.md)" in included
    assert f"![{STUDY}](results/{STUDY}.png)" in included

    c = tracking.client()
    parents = [c.get_run(r["run_id"]) for r in results]
    kids = [k for p in parents for k in c.search_runs([p.info.experiment_id],
                                                      f"tags.mlflow.parentRunId = '{p.info.run_id}'")]
    assert len(kids) == 4
    # The table's numbers are those of the runs, grouped by warm-up then by seed.
    em = {}
    for p in parents:
        for k in kids:
            if k.data.tags["mlflow.parentRunId"] == p.info.run_id and k.data.tags["ablation.variant"] == FULL:
                em.setdefault(p.info.run_id, []).append(k.data.metrics["final/greedy/em"])
    s = spread(em)
    assert s.warmups == 2 and f"(`{FULL}`) | 2 x 1/1 | **{s.mean:.3f}** | {s.over_warmups:.3f} | n/a |" in text
    # Two warm-ups (seed 0 and seed 1), told apart by their weights.
    digests = {p.data.tags[tracking.TAG_WARMUP_DIGEST] for p in parents}
    assert len(digests) == 2
    assert digests == {weights_digest(root / f"w{w}" / "warmup") for w in WARMUP_SEEDS}
    # ... and each warm-up is kept with its flow run, so the table can be re-derived from MLflow.
    assert {a.path for a in c.list_artifacts(parents[0].info.run_id, "warmup")} >= {"warmup/model.safetensors"}
    assert all(f"seed {w} ({weights_digest(root / f'w{w}' / 'warmup')[:8]})" in text for w in WARMUP_SEEDS)
    # Every run's provenance: MLflow id, git commit, DVC data hash (from the flow run), config hash.
    data_hash = parents[0].data.tags[tracking.TAG_DATA_HASH]
    for k in kids:
        row = next(line for line in text.splitlines() if k.info.run_id in line)
        assert k.data.tags[tracking.TAG_CONFIG_HASH][:12] in row and data_hash[:12] in row
        assert k.data.tags["mlflow.source.git.commit"][:12] in row  # the code's commit, wherever run from
    assert "4 MLflow runs" in text
    assert f"`{FULL}` > `{OUTCOME}` (greedy/em)" in text and f"`{FULL}` > `{OUTCOME}` (sampled/em)" in text
    assert "over 2 warm-up(s)" in text or "not defined for" in text


@pytest.mark.slow
def test_the_export_alone_regenerates_the_report_and_imports_into_another_store(tiny_study, tmp_path, monkeypatch,
                                                                               capsys):
    """agentr1 report writes the study's export beside its tables; `--from` renders the same bytes
    from that file in a process with no MLflow store at hand; `--import` makes runs in another
    store from which the report finds the same records."""
    import subprocess
    import sys

    from cli.main import main
    from agentr1.report import read_export

    root, _ = tiny_study
    out, again = tmp_path / "results", tmp_path / "again"
    readme, readme2 = tmp_path / "README.md", tmp_path / "README2.md"
    for f in (readme, readme2):
        f.write_text(f"<!-- report:{STUDY} -->\n<!-- /report:{STUDY} -->\n")
    assert main(["report", "--study", STUDY, "--out", str(out), "--include", str(readme)]) == 0
    export = Path(json.loads(capsys.readouterr().out)["export"])
    assert export == out / f"{STUDY}.jsonl" and len(export.read_text().splitlines()) == 1 + 4
    # A fresh process, pointed at a store that does not exist: it must not need one.
    nowhere = tmp_path / "no-store"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{nowhere / 'mlflow.db'}"}
    cmd = [sys.executable, "-m", "cli", "report", "--from", str(export), "--out", str(again),
           "--include", str(readme2)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not nowhere.exists()
    for name in (f"{STUDY}.md", f"{STUDY}.png"):
        assert (again / name).read_bytes() == (out / name).read_bytes(), name
    assert readme2.read_text().replace("again/", "results/") == readme.read_text()
    # Into another MLflow store, then the report of that store: the same runs, as published.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'other.db'}")
    assert main(["report", "--import", str(export)]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == 2 + 4  # a parent per warm-up, a run per cell
    assert main(["report", "--study", STUDY, "--out", str(tmp_path / "third")]) == 0
    capsys.readouterr()
    assert read_export(tmp_path / "third" / f"{STUDY}.jsonl").records == read_export(export).records
    # a second import would count every run twice: refused, nothing made
    assert main(["report", "--import", str(export)]) == 2
    assert "was imported into this store already" in capsys.readouterr().err
    assert main(["report", "--study", STUDY, "--out", str(tmp_path / "fourth")]) == 0
    capsys.readouterr()
    assert read_export(tmp_path / "fourth" / f"{STUDY}.jsonl").records == read_export(export).records


def test_a_broken_export_is_named_by_file_line_and_field(tmp_path):
    from agentr1.report import read_export

    bad = tmp_path / "x.jsonl"
    bad.write_text('{"format": "something else"}\n')
    with pytest.raises(ValueError, match=r"x.jsonl:1: field 'format'"):
        read_export(bad)
    bad.write_text('{"format": "agentr1-study/1", "study": "s", "kind": "pipeline", "command": "c", "runs": 1}\n'
                   '{"variant": "pipeline"}\n')
    with pytest.raises(ValueError, match=r"x.jsonl:2: a run line lacks"):
        read_export(bad)
    head = '{"format": "agentr1-study/1", "study": "s", "kind": "pipeline", "command": "c", "runs": 1}\n'
    run = {"variant": "pipeline", "warmup": "seed 0", "seed": 0, "final": {"greedy/em": 0.5},
           "provenance": {"run_id": "r", "git_commit": "c", "data_hash": "d", "config_hash": "h"}}
    for text, said in (("[]\n", "x.jsonl:1: field 'format'"),  # a header that is not an object
                       (head.replace('"command": "c", ', ""), "x.jsonl:1: field 'command'"),
                       (head.replace('"study": "s"', '"study": "../../evil"'), "x.jsonl:1: field 'study'"),
                       (head + json.dumps({**run, "final": {"greedy/em": "high"}}) + "\n", "x.jsonl:2: .*'greedy/em'"),
                       (head + json.dumps({**run, "curve": [{"iteration": 5, "greedy/em": [1]}]}) + "\n",
                        "x.jsonl:2: .*'greedy/em'")):
        bad.write_text(text)
        with pytest.raises(ValueError, match=said):
            read_export(bad)
    bad.write_text(head + json.dumps({**run, "history": [{"iteration": 1, "rollout/em": None}]}) + "\n")
    assert math.isnan(read_export(bad).records[0].history[0]["rollout/em"])  # null is how NaN is written


def test_an_ablation_run_again_in_its_directory_counts_each_cell_once():
    """Running a finished ablation again (to add a seed, or just again) makes a second parent run
    that logs every cell anew, reused from disk: the study counts each cell once, the newer run's."""
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    from adapters.report import collect_study

    c = tracking.client()
    exp = tracking.experiment_id(tracking.EXPERIMENTS["ablation"])

    def flow_run(seeds: list[int]) -> str:  # what flows/ablation.py leaves: a parent, one nested run per job
        parent = c.create_run(exp, tags={tracking.TAG_STUDY: "rerun-once", tracking.TAG_WARMUP_DIGEST: "ab" * 32})
        c.log_param(parent.info.run_id, "seed", "0")
        for s in seeds:
            kid = c.create_run(exp, tags={MLFLOW_PARENT_RUN_ID: parent.info.run_id, "ablation.variant": "ppo",
                                          "ablation.seed": str(s)}).info.run_id
            c.log_metric(kid, "final/greedy/em", [0.2, 0.4, 0.6, 0.8][s])
            c.set_terminated(kid, "FINISHED")
        c.set_terminated(parent.info.run_id, "FINISHED")
        return parent.info.run_id

    flow_run([0, 1, 2])
    newer = flow_run([0, 1, 2, 3])
    records = collect_study("rerun-once").records
    assert sorted(r.seed for r in records) == [0, 1, 2, 3]
    assert statistics.mean(r.final["greedy/em"] for r in records) == pytest.approx(0.5)
    assert {r.provenance.run_id for r in records} <= {k.info.run_id for k in c.search_runs(
        [exp], f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{newer}'")}


def test_a_study_whose_runs_used_different_splits_is_refused():
    """One table has one split in its label: a study mixing test and dev runs is an error naming
    both, not a table labelled with the first run's split."""
    from adapters.report import collect_study

    c = tracking.client()
    exp = tracking.experiment_id(tracking.EXPERIMENTS["pipeline"])
    for split in ("test", "dev"):
        run = c.create_run(exp, tags={tracking.TAG_STUDY: "mixed-splits"}).info.run_id
        c.log_param(run, "eval.split", split)
        c.set_terminated(run, "FINISHED")
    with pytest.raises(ValueError, match=r"mixed-splits: its runs were evaluated on different splits \(dev, test\)"):
        collect_study("mixed-splits")


def test_report_names_what_is_missing(capsys):
    from cli.main import main

    assert main(["report", "--study", "no-such-study", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert "no finished MLflow run is tagged agentr1.study=no-such-study" in err
    assert "agentr1 report --from docs/results/no-such-study.jsonl" in err  # a fresh clone's way to the numbers
    assert main(["report", "--study", "bad'name"]) == 2
    assert "expected a name of letters" in capsys.readouterr().err
    assert main(["report"]) == 2
    assert "give --study NAME, --run RUN_ID, --from EXPORT or --import EXPORT" in capsys.readouterr().err


def test_splicing_needs_the_markers_and_keeps_the_rest(tmp_path):
    from agentr1.report import splice

    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- report:s -->\nold\n<!-- /report:s -->\noutro\n")
    assert splice(doc, "s", "new table") is True
    assert doc.read_text() == "intro\n<!-- report:s -->\nnew table\n<!-- /report:s -->\noutro\n"
    assert splice(doc, "s", "new table") is False  # the same generation twice changes nothing
    with pytest.raises(ValueError, match="no '<!-- report:other -->'"):
        splice(doc, "other", "x")
    assert "other" not in doc.read_text()
    # markers shown as an example in a code block are text; the real block is filled
    shown = "```\n<!-- report:s -->\n<!-- /report:s -->\n```\n"
    doc.write_text(shown + "<!-- report:s -->\nold\n<!-- /report:s -->\n")
    splice(doc, "s", "new")
    assert doc.read_text() == shown + "<!-- report:s -->\nnew\n<!-- /report:s -->\n"
    # CRLF stays CRLF, outside the block and in it
    doc.write_bytes(b"intro\r\n<!-- report:s -->\r\nold\r\n<!-- /report:s -->\r\noutro\r\n")
    splice(doc, "s", "a\nb")
    assert doc.read_bytes() == b"intro\r\n<!-- report:s -->\r\na\r\nb\r\n<!-- /report:s -->\r\noutro\r\n"
    # two blocks of one report: which one is meant is not guessed
    twice = "<!-- report:s -->\nx\n<!-- /report:s -->\n" * 2
    doc.write_text(twice)
    with pytest.raises(ValueError, match="one block per report"):
        splice(doc, "s", "new")
    assert doc.read_text() == twice
