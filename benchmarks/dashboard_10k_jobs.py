"""`cloudtrain ui` with 10,000 jobs in the store (issue 39).

Goals: the jobs view loads in under 1 s, a job's page in under 0.5 s, in a real browser
(Chromium driven by Playwright, as the tests do): from navigation to its rows drawn, and to
its curves drawn. Printed for a cold browser (plotly.js not cached yet) and warm ones; also
the API's own answers (requests to the real server), which is this machine's share.

Usage: python benchmarks/dashboard_10k_jobs.py [--jobs N] [--runs R]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from status_10k_jobs import figures, fill  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        fill(home, args.jobs, 0)
        newest = json.loads(subprocess.run(
            [sys.executable, "-m", "cloudtrain", "status", "-a", "--json", "--limit", "1"],
            env={**os.environ, "CLOUDTRAIN_HOME": str(home)}, capture_output=True, text=True,
            check=True).stdout)[0]["id"]
        jobdir = home / "jobs" / newest
        jobdir.mkdir(parents=True)
        (jobdir / "metrics.jsonl").write_text("".join(
            json.dumps({"epoch": e, "train_loss": 2 / e, "test_acc": e / 20,
                        "time": 1_800_000_000 + 30 * e}) + "\n" for e in range(1, 21)))
        (jobdir / "output.log").write_text("".join(f"epoch {e}\n" for e in range(1, 2001)))
        import sqlite3

        db = sqlite3.connect(home / "state.db")
        db.execute("UPDATE jobs SET jobdir = ?, host = ? WHERE id = ?",
                   (str(jobdir), json.dumps({"kind": "local"}), newest))
        db.commit()
        db.close()
        env = {**os.environ, "CLOUDTRAIN_HOME": str(home)}
        proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", "ui", "--no-browser"],
                                env=env, stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stderr.readline()
            url = re.search(r"(http://\S+)", line).group(1)
            token = url.split("token=")[1]
            base = url.split("/?")[0]

            def get(path: str) -> float:
                t = time.perf_counter()
                req = urllib.request.Request(base + path, headers={"X-Cloudtrain-Token": token})
                urllib.request.urlopen(req).read()
                return time.perf_counter() - t

            for path in ("/api/jobs", f"/api/jobs/{newest}", f"/api/metrics?jobs={newest}",
                         f"/api/jobs/{newest}/log"):
                get(path)
                times = [get(path) for _ in range(args.runs)]
                print(f"api      GET {path:<36} {args.jobs} jobs: {figures(times)}")
            if chromium is None:
                print("browser  not measured: no chromium (apt-get install chromium)")
                return
            from playwright.sync_api import sync_playwright

            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
                context = browser.new_context()
                page = context.new_page()
                for what, target, ready in (
                        ("jobs view", url, "table.jobs tbody tr"),
                        ("job page", url + f"#/job/{newest}",
                         "[data-chart='loss'] .scatterlayer .trace")):
                    times = []
                    for run in range(args.runs + 1):
                        page.goto("about:blank")
                        t = time.perf_counter()
                        page.goto(target)
                        page.wait_for_selector(ready)
                        times.append(time.perf_counter() - t)
                    goal = "1 s" if what == "jobs view" else "0.5 s"
                    print(f"browser  {what:<10} first (a fresh browser) "
                          f"{times[0]:.3f} s; warm, {args.runs} runs: "
                          f"{figures(times[1:])} (goal < {goal})")
                browser.close()
        finally:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
