"""What a person sees in the two web UIs, in a real browser (Playwright driving the system's
Chromium): Prefect's deployments and their Run forms, a pipeline run triggered from the form,
and that run in MLflow (its metrics, learning curve, registered model and traces).

The servers start as `make ui` and `make serve` start them, on free ports, with every store in
this session's temp dir (tests/conftest.py: PREFECT_HOME, MLFLOW_TRACKING_URI). `make test-ui`
runs this file; `make test` leaves it out (marker ``ui``). With ``AGENTR1_SCREENSHOTS=DIR`` the
checked pages are also written as PNGs into DIR (`make screenshots` -> docs/img/).

The run is conf/quick.yaml (a warm-up that makes real search calls) for one PPO iteration on 4
test questions: ~1 min on 2 cores.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from flows.serve import deployment_specs

pytestmark = pytest.mark.ui

CHROMIUM = os.environ.get("AGENTR1_CHROMIUM", "/usr/bin/chromium")
try:
    from playwright.sync_api import Page, expect, sync_playwright
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # the `ui` extra: `make test-ui` installs it
    sync_playwright = None
if sync_playwright is None:
    pytest.skip("the playwright package is missing: `make test-ui` installs it (pyproject extra `ui`)",
                allow_module_level=True)
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"no Chromium at {CHROMIUM}: `apt-get install -y chromium` (or set AGENTR1_CHROMIUM)",
                allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]
VIEWPORT = {"width": 1280, "height": 800}
SERVER_STARTUP_S = 240  # both servers and the served deployments, on two busy cores
FLOW_RUN_TIMEOUT_S = 600
PAGE_TIMEOUT_MS = 60_000  # MLflow's pages load ~10 MB of JavaScript
ASSISTANT_WAIT_MS = 5_000
ASSISTANT = "mlflow.assistant.chat_panel"  # its elements' data-component-id prefix
expect.set_options(timeout=PAGE_TIMEOUT_MS)
POLL_S = 5
STOP_GRACE_S = 20
# `make` without remaking the venv or data/: `make test-ui` has just made them.
MAKE = ["make", "-s", "-o", ".venv/.installed", "-o", "data/corpus.jsonl"]
PIPELINE = "pipeline"
PIPELINE_DEPLOYMENT = "manual"
PIPELINE_EXPERIMENT = "agentr1-pipeline"
TOOL_SPAN = "search"  # the search agent's one tool (conf/quick.yaml: env.kind qa)
TRACES_TRIED = 6  # evaluation traces opened to find one whose episode called the tool
LEARNING_CURVE = "plots/learning_curve.png"  # adapters/tracking.log_plot
CURVE_MIN_PX = 400
SCREENSHOTS = os.environ.get("AGENTR1_SCREENSHOTS")


# ----------------------------------------------------------------------------- servers and browser


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, body: dict | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """A `make` target in a session of its own, so stopping it stops every server it started."""
    return subprocess.Popen(MAKE + args, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the target's whole process group (make, the servers, the flow runs it started),
    SIGKILL to what is left after a grace period (the MLflow UI takes ~10 s to go)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            proc.poll()  # reaps make, so that a group of one zombie reads as gone
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        else:
            continue
        break
    proc.wait()


def wait_until(ready, what: str, timeout_s: float, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
            pytest.fail(f"{what} not up after {timeout_s:.0f} s\n{tails}")
        time.sleep(2)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """`make ui` and `make serve` on free ports; yields (Prefect UI URL, MLflow UI URL, work dir)."""
    work = tmp_path_factory.mktemp("ui")
    prefect_port, mlflow_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # `make serve` derives it from the port
    env.update(PREFECT_PORT=str(prefect_port), MLFLOW_PORT=str(mlflow_port))
    prefect, mlflow = f"http://127.0.0.1:{prefect_port}", f"http://127.0.0.1:{mlflow_port}"
    logs = [work / "ui.log", work / "serve.log"]
    procs = [start(["ui", f"PREFECT_PORT={prefect_port}", f"MLFLOW_PORT={mlflow_port}"], logs[0], env)]
    try:
        wait_until(lambda: answers(f"{prefect}/api/health"), "Prefect server", SERVER_STARTUP_S, logs)
        procs.append(start(["serve", f"PREFECT_PORT={prefect_port}"], logs[1], env))
        n = len(deployment_specs())
        wait_until(lambda: len(http_json(f"{prefect}/api/deployments/filter", {})) == n,
                   f"{n} served deployments", SERVER_STARTUP_S, logs)
        wait_until(lambda: answers(f"{mlflow}/health"), "MLflow UI", SERVER_STARTUP_S, logs)
        yield prefect, mlflow, work
    finally:
        for proc in reversed(procs):
            stop(proc)


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


@pytest.fixture
def page(browser) -> Page:
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    p = context.new_page()
    yield p
    context.close()


def shoot(page: Page, name: str) -> None:
    """The page as ``$AGENTR1_SCREENSHOTS/<name>.png`` when screenshots are asked for."""
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"))


# ----------------------------------------------------------------------------- Prefect


def deployments(prefect: str) -> dict[str, dict]:
    """{"flow/name": the deployment as the API has it} (its id and its form's schema)."""
    flows = {f["id"]: f["name"] for f in http_json(f"{prefect}/api/flows/filter", {})}
    return {f"{flows[d['flow_id']]}/{d['name']}": d for d in http_json(f"{prefect}/api/deployments/filter", {})}


def form_fields(schema: dict) -> list[tuple[str, str]]:
    """(title, description) of every field a Run form shows, nested models included."""
    defs = schema.get("definitions") or schema.get("$defs") or {}

    def model(node: dict) -> dict | None:
        for ref in [node.get("$ref"), *(n.get("$ref") for n in node.get("allOf", []) + node.get("anyOf", []))]:
            if ref:
                return defs[ref.rsplit("/", 1)[-1]]
        return None

    out: list[tuple[str, str]] = []

    def walk(properties: dict) -> None:
        for name, prop in properties.items():
            sub = model(prop)
            title = prop.get("title") or name.replace("_", " ").title()  # the form's label for an untitled $ref
            out.append((title, prop.get("description") or (sub or {}).get("description") or ""))
            if sub is not None:
                walk(sub.get("properties", {}))

    walk(schema.get("properties", {}))
    return out


def as_rendered(markdown: str) -> str:
    """A description as its markdown renders to text: inline code loses its backticks."""
    return " ".join(markdown.replace("`", "").split())


def prefect_property(page: Page, title: str):
    """The form field whose own label starts with ``title`` (not an enclosing model's)."""
    return page.locator("xpath=//div[contains(concat(' ', @class, ' '), ' schema-form-property ')]"
                        "[./div[@class='p-label__header']//span[@class='schema-form-property__label']"
                        f"[starts-with(normalize-space(), '{title}')]]").first


SHOWN_FIELDS_JS = """() => Array.from(document.querySelectorAll('.schema-form-property')).map(el => {
  const label = el.querySelector(':scope > .p-label__header .schema-form-property__label');
  const desc = el.querySelector(':scope > .p-label__header .schema-form-property__description');
  return [label ? label.innerText : '', desc ? desc.innerText : ''];
})"""


def test_every_deployment_is_listed(stack, page):
    prefect, _, _ = stack
    page.goto(f"{prefect}/deployments")
    shown = {d["name"]: d.get("entrypoint") for d in deployment_specs()}
    for name, entrypoint in shown.items():
        flow = entrypoint.rsplit(":", 1)[-1]
        row = page.locator("tr", has=page.get_by_text(name, exact=True))
        expect(row.first).to_be_visible()
        expect(row.first).to_contain_text(flow)
    expect(page.get_by_text(f"{len(shown)} Deployments")).to_be_visible()
    shoot(page, "prefect_deployments")


def test_every_run_form_shows_its_fields_with_their_descriptions(stack, page):
    """Each field of each deployment's Run form, with its description as written (markdown that
    swallowed an ``<angle-bracket>`` placeholder would show less than the schema says). The form
    renders each description's markdown after its field appears: read until all are there."""
    prefect, _, _ = stack
    found = deployments(prefect)
    assert len(found) == len(deployment_specs())
    for full_name, dep in sorted(found.items()):
        fields = form_fields(dep["parameter_openapi_schema"])
        missing = [title for title, desc in fields if not desc.strip()]
        assert not missing, f"{full_name}: fields without a description: {missing}"
        page.goto(f"{prefect}/deployments/deployment/{dep['id']}/run")
        page.locator(".schema-form-property").first.wait_for()
        deadline = time.monotonic() + PAGE_TIMEOUT_MS / 1000
        while True:
            shown = [(re.sub(r"\s*\(Optional\)$", "", label.strip()), " ".join(desc.split()))
                     for label, desc in page.evaluate(SHOWN_FIELDS_JS)]
            wrong = [f"field {title!r} should read {as_rendered(desc)!r}; the form shows "
                     f"{[d for t, d in shown if t == title] or 'no such field'}"
                     for title, desc in fields if (title, as_rendered(desc)) not in shown]
            if not wrong or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if full_name == f"{PIPELINE}/{PIPELINE_DEPLOYMENT}":
            shoot(page, "prefect_form")
        assert not wrong, f"{full_name}: " + "\n".join(wrong)


@pytest.fixture(scope="module")
def form_run(stack, browser) -> dict:
    """The pipeline run a person starts from the Run form of pipeline/manual: preset quick, a data
    dir and run dir of this session, one PPO iteration, 4 test questions. Waits until it ends;
    returns its name, final state and MLflow ids."""
    prefect, mlflow, work = stack
    dep = deployments(prefect)[f"{PIPELINE}/{PIPELINE_DEPLOYMENT}"]
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    page = context.new_page()
    try:
        page.goto(f"{prefect}/deployments/deployment/{dep['id']}/run")
        page.locator(".schema-form-property").first.wait_for()
        prefect_property(page, "Preset").locator("textarea, input").first.fill("quick")
        overrides = prefect_property(page, "Overrides")
        for i, item in enumerate([f"data.dir={work / 'data'}", "eval.max_examples=4", "ppo.trace_episodes=2"]):
            overrides.get_by_role("button", name="Add item").click()
            overrides.locator("textarea, input").nth(i).fill(item)
        output_dir = prefect_property(page, "Output Dir")
        output_dir.get_by_role("button", name="str", exact=True).click()
        output_dir.locator("textarea, input").first.fill(str(work / "run"))
        iterations = prefect_property(page, "Ppo Iterations")
        iterations.get_by_role("button", name="int", exact=True).click()
        iterations.locator("input").first.fill("1")
        page.get_by_role("button", name="Submit").click()
        # The toast that says it was scheduled offers "View run"; it slides in and intercepts clicks
        # while it moves, so the test reads the run it links to from the API and opens that page.
        expect(page.get_by_text("View run", exact=True).first).to_be_visible()
        newest = http_json(f"{prefect}/api/flow_runs/filter",
                           {"deployments": {"id": {"any_": [dep["id"]]}}, "sort": "EXPECTED_START_TIME_DESC",
                            "limit": 1})[0]
        page.goto(f"{prefect}/runs/flow-run/{newest['id']}")
        run_name = newest["name"]
        badge = page.locator(".page-heading-flow-run__meta .state-badge").first
        deadline = time.monotonic() + FLOW_RUN_TIMEOUT_S
        while (state := badge.inner_text().strip()) not in {"Completed", "Failed", "Crashed", "Cancelled"}:
            if time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
            page.reload()
            badge.wait_for()
        shoot(page, "prefect_flow_run")
        experiment = http_json(f"{mlflow}/ajax-api/2.0/mlflow/experiments/get-by-name?"
                               + urllib.parse.urlencode({"experiment_name": PIPELINE_EXPERIMENT}))["experiment"]
        runs = http_json(f"{mlflow}/ajax-api/2.0/mlflow/runs/search",
                         {"experiment_ids": [experiment["experiment_id"]],
                          "filter": f"attributes.run_name = '{PIPELINE}-{run_name}'"}).get("runs", [])
        return {"name": run_name, "state": state, "experiment_id": experiment["experiment_id"],
                "run_id": runs[0]["info"]["run_id"] if runs else None,
                "log": (work / "serve.log").read_text()[-3000:] if (work / "serve.log").exists() else ""}
    finally:
        context.close()


def test_a_run_triggered_from_the_form_finishes(form_run):
    assert form_run["state"] == "Completed", f"flow run {form_run['name']}: {form_run['state']}\n{form_run['log']}"
    assert form_run["run_id"], f"no MLflow run named {PIPELINE}-{form_run['name']}"


# ----------------------------------------------------------------------------- MLflow


@pytest.fixture
def mlflow_run(stack, form_run) -> tuple[str, str]:
    """(MLflow UI URL, the run page's path)."""
    if not form_run["run_id"]:
        pytest.fail(f"the form's run left no MLflow run (state {form_run['state']})")
    return stack[1], f"#/experiments/{form_run['experiment_id']}/runs/{form_run['run_id']}"


def close_assistant(page: Page) -> None:
    """MLflow's assistant panel opens beside every page; screenshots are of the page."""
    if not SCREENSHOTS:
        return
    panel = page.locator(f"[data-component-id='{ASSISTANT}.beta']").first  # the panel's title tag
    try:  # it slides in after the page, or not at all
        panel.wait_for(timeout=ASSISTANT_WAIT_MS)
    except PlaywrightTimeout:
        return
    buttons = page.locator(f"button[data-component-id^='{ASSISTANT}.']")
    close = page.locator(f"button[data-component-id='{ASSISTANT}.close']")
    (close if close.count() else buttons.last).click()
    panel.wait_for(state="hidden")


def test_the_run_page_shows_its_metrics(mlflow_run, page):
    mlflow, run = mlflow_run
    run_id = run.rsplit("/", 1)[-1]
    metrics = {m["key"]: m["value"] for m in
               http_json(f"{mlflow}/ajax-api/2.0/mlflow/runs/get?run_id={run_id}")["run"]["data"]["metrics"]}
    page.goto(f"{mlflow}/{run}")
    for key in ("eval/warmup/greedy/em", "eval/final/greedy/em", "eval/final/greedy/n_calls"):
        assert key in metrics, f"the run logged no {key}"
        expect(page.get_by_text(key, exact=True).first).to_be_visible()
        value = repr(metrics[key]).removesuffix(".0")  # as the page writes numbers: 0, 1.75
        # The Metrics table reads "key, value, model" row by row.
        assert re.search(rf"^{re.escape(key)}\n{re.escape(value)}$", page.inner_text("body"), re.M), (
            f"the Metrics table does not show {key} = {value}")
    close_assistant(page)
    shoot(page, "mlflow_run")


def test_the_run_shows_its_learning_curve(mlflow_run, page):
    mlflow, run = mlflow_run
    page.goto(f"{mlflow}/{run}/artifacts/{LEARNING_CURVE}")
    expect(page.get_by_text(LEARNING_CURVE, exact=True).first).to_be_visible()  # the artifact's header
    # The image itself, loaded: wider than anything else on the page (the logo is ~80 px).
    page.wait_for_function(f"() => Array.from(document.images).some(i => i.complete && i.naturalWidth >= {CURVE_MIN_PX})")
    close_assistant(page)
    shoot(page, "mlflow_learning_curve")


def test_the_registered_model_carries_the_champion_alias(mlflow_run, page):
    mlflow, run = mlflow_run
    run_id = run.rsplit("/", 1)[-1]
    versions = http_json(f"{mlflow}/ajax-api/2.0/mlflow/model-versions/search?"
                         + urllib.parse.urlencode({"filter": f"run_id='{run_id}'"})).get("model_versions", [])
    assert versions, "the run registered no model version"
    name, version = versions[0]["name"], versions[0]["version"]
    page.goto(f"{mlflow}/#/models/{urllib.parse.quote(name)}")
    expect(page.get_by_text(name, exact=True).first).to_be_visible()
    row = page.locator(f"xpath=//*[self::tr or @role='row'][.//*[normalize-space()='Version {version}']]")
    expect(row.first).to_contain_text("champion")
    close_assistant(page)
    shoot(page, "mlflow_model")


def span_names(page: Page) -> list[str]:
    return [t.strip() for t in page.locator("[data-testid^='span-title-row-']").all_inner_texts()]


def select_span(page: Page, name: str, tab: str = "Inputs / Outputs") -> None:
    """Select a span in the trace's tree and a tab of its detail pane."""
    page.locator("[data-testid^='span-title-row-']", has_text=re.compile(f"^{re.escape(name)}$")).first.click()
    page.get_by_text(tab, exact=True).first.click()


def shows(page: Page, *texts: str) -> None:
    for text in texts:
        expect(page.get_by_text(text, exact=True).first).to_be_visible()


def test_a_trace_shows_each_turn_its_tool_call_result_and_rewards(mlflow_run, page):
    """One episode's trace: the ``episode`` span, a span per turn, after a tool-call turn the tool's
    span with its arguments in and the result out, and the rewards as attributes."""
    mlflow, run = mlflow_run
    page.goto(f"{mlflow}/{run}/traces")
    page.locator("text=/^tr-[0-9a-f]+$/").first.wait_for()
    trace_ids = [t.strip() for t in page.locator("text=/^tr-[0-9a-f]+$/").all_inner_texts()]
    seen = []
    for trace_id in trace_ids[:TRACES_TRIED]:
        page.goto("about:blank")
        page.goto(f"{mlflow}/{run}/traces?selectedEvaluationId={trace_id}")
        page.locator("[data-testid^='span-title-row-']").first.wait_for()
        seen.append(names := span_names(page))
        if TOOL_SPAN in names:
            break
    else:
        pytest.fail(f"none of {len(seen)} traces shows a {TOOL_SPAN!r} span; their spans: {seen}")
    assert names[0] == "episode" and "turn 1" in names, names
    turns = [n for n in names if re.fullmatch(r"turn \d+", n)]
    assert turns == [f"turn {k}" for k in range(1, len(turns) + 1)], names
    assert names.index("turn 1") < names.index(TOOL_SPAN), names

    close_assistant(page)  # before choosing a span: closing it lays the trace out anew
    select_span(page, TOOL_SPAN)
    shows(page, "query", "result")  # the call's argument in, what the policy read back out
    shoot(page, "mlflow_trace")
    select_span(page, TOOL_SPAN, "Attributes")
    shows(page, "process_reward")
    select_span(page, "turn 1", "Attributes")
    shows(page, "process_reward", "sampled_tokens")
    select_span(page, "episode", "Attributes")
    shows(page, "reward.outcome", "reward.process")
