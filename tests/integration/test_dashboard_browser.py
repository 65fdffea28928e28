"""Issue 39: `cloudtrain ui` in a real browser: Playwright driving Chromium (Debian's
`chromium`, which .ci/run installs) against the real command, over jobs launched on this
machine with the real CLI: the jobs view lists them and follows one to its end without a
reload, a job's page draws its curves from its metrics, compare overlays two jobs, the token
is required, and a hostile log is text.

With CLOUDTRAIN_SCREENSHOTS=DIR the tests leave their screenshots there (the README's is
one of them: docs/ui-jobs.png, docs/ui-job.png)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from labs.polling import wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (.ci/run installs it)")
SHOTS = os.environ.get("CLOUDTRAIN_SCREENSHOTS")


@pytest.fixture
def ui(ct_home, tmp_path):
    """The real `cloudtrain ui` on a free port: its address (with the token)."""
    log = open(tmp_path / "ui.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", "ui", "--no-browser"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=os.environ)

    def address():
        log.seek(0)
        m = re.search(r"(http://127\.0\.0\.1:\d+/\?token=\S+)", log.read())
        return m.group(1) if m else None

    url = wait_for(address, timeout=30, what="cloudtrain ui to print its address")
    yield url
    proc.terminate()
    proc.wait(timeout=10)
    log.seek(0)
    assert "Traceback" not in log.read()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert errors == []


def _shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / name), full_page=False)


def _row_state(page, job_id: str) -> str:
    return page.locator(f"tr[data-job='{job_id}'] td.state").inner_text()


def test_issue39_the_jobs_view_lists_jobs_and_follows_one_to_its_end(toy_recipes, ui, page,
                                                                      cli):
    """Issue 39: every launched job is listed; a running one turns succeeded in the page
    without a reload (the view polls the API)."""
    done = cli.launch("--recipe", "toy", "--name", "toy-done")
    cli.wait(done)
    running = cli.launch("--name", "sleeper", "--", "sleep", "4")
    page.goto(ui)
    page.wait_for_selector(f"tr[data-job='{running}']")
    assert page.locator(f"tr[data-job='{done}'] td.state").inner_text() == "succeeded"
    assert _row_state(page, running) in ("pending", "starting", "running")
    page.evaluate("window.__same_page = true")
    wait_for(lambda: _row_state(page, running) == "succeeded", timeout=60,
             what="the running job's row to say succeeded")
    assert page.evaluate("window.__same_page") is True  # no reload
    assert "2 jobs" in page.inner_text("header + main")
    _shot(page, "ui-jobs.png")


def test_issue39_a_job_s_page_draws_its_curves_from_its_metrics(toy_recipes, ui, page, cli):
    """Issue 39: a job's page: its loss and accuracy curves (two epochs each, the recipe's
    target line on accuracy), its timeline, plan, commands and log."""
    job = cli.launch("--recipe", "toy", "--set", "epochs=3", "--name", "toy-curves")
    cli.wait(job)
    page.goto(ui + f"#/job/{job}")
    page.wait_for_selector("[data-chart='loss'] .scatterlayer .trace")
    points = page.evaluate("""() => {
        const g = document.querySelector("[data-chart='loss']");
        return g.data.map(t => [t.name, t.y]);
    }""")
    assert points == [["train_loss", [1.0, 0.5, 1 / 3]]]
    acc = page.evaluate("""() => {
        const g = document.querySelector("[data-chart='accuracy']");
        return [g.data[0].y, g.layout.shapes.map(s => s.y0)];
    }""")
    assert acc == [[0.3, 0.6, 0.8999999999999999], [0.5]]
    text = page.inner_text("main")
    assert "cloudtrain launch --recipe toy --set epochs=3" in text
    assert "succeeded" in text and "args {" in page.inner_text("pre.log")
    _shot(page, "ui-job.png")


def test_issue39_compare_overlays_two_jobs(toy_recipes, ui, page, cli):
    """Issue 39: two jobs picked in the jobs view, compared: one chart with a curve of each,
    and each job's cost beside them."""
    a = cli.launch("--recipe", "toy", "--set", "epochs=2", "--name", "run-a")
    b = cli.launch("--recipe", "toy", "--set", "epochs=3", "--name", "run-b")
    cli.wait(a), cli.wait(b)
    page.goto(ui)
    for job in (a, b):
        page.locator(f"tr[data-job='{job}'] input[type=checkbox]").click()
    page.get_by_role("button", name="compare").click()
    page.wait_for_selector("[data-chart='loss'] .scatterlayer .trace")
    names = page.evaluate("""() => document.querySelector("[data-chart='loss']").data.map(
        t => [t.name, t.y.length])""")
    assert sorted(names) == [["run-a train_loss", 2], ["run-b train_loss", 3]]
    assert page.locator("table tbody tr").count() == 2


def test_issue39_the_token_is_required(ui, page):
    """Issue 39: the address without its token, or with another, shows nothing of the store;
    the API refuses a fetch without it."""
    bare = ui.split("?")[0]
    response = page.goto(bare)
    assert response.status == 403 and "token is required" in page.inner_text("body")
    response = page.goto(bare + "?token=guess")
    assert response.status == 403
    status = page.evaluate("fetch('/api/jobs').then(r => r.status)")
    assert status == 403


def test_issue39_a_hostile_log_cannot_inject_markup(ui, page, cli, ct_home):
    """Issue 39: a job that prints markup and terminal escapes: its page shows the markup as
    characters, no element is made from it, no script of it runs, the escapes are gone; a
    name with markup in the store (the CLI refuses one; a store is a file) is text too."""
    from cloudtrain.state import open_store

    evil = "<img src=x onerror=window.pwned=1><script>window.pwned=2</script>"
    job = cli.launch("--", "printf", "\\033]0;title\\007\\033[31m%s\\033[0m\\n", evil)
    cli.wait(job)
    with open_store(ct_home) as store, store.transaction() as db:
        db.execute("UPDATE jobs SET name = '<b>bold</b>' WHERE id = ?", (job,))
    page.goto(ui + f"#/job/{job}")
    log = page.locator("pre.log")
    wait_for(lambda: "pwned" in log.inner_text(), timeout=30, what="the log on the page")
    assert log.inner_text().strip() == evil
    assert log.locator("img, script").count() == 0
    assert page.evaluate("window.pwned") is None
    assert page.locator("h2").inner_text().startswith(f"{job} <b>bold</b>")
    assert page.locator("h2 b").count() == 0


def test_issue39_the_cost_page_charts_the_cost_report(toy_recipes, ui, page, cli):
    """Issue 39: the cost page draws cost-report by day, recipe and instance type, and what
    spot saved, from the same ledger."""
    cli.wait(cli.launch("--recipe", "toy", "--name", "cheap"))
    page.goto(ui + "#/cost")
    for by in ("day", "recipe", "instance", "spot"):
        page.wait_for_selector(f"[data-by='{by}'] .main-svg")
    recipes = page.evaluate("() => document.querySelector(\"[data-by='recipe']\").data[0].x")
    assert recipes == ["toy"]
    assert "spot saved $0.0000 over 0 instances" in page.inner_text("[data-by='spot']")
