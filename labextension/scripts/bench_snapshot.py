"""How long the GPU memory panel takes to draw a reduced memory snapshot of
900,000 trace entries, in Debian's chromium, on a real stack (JupyterLab 4,
gpumem serve with the simulated GPU). A kernel hands the daemon a synthetic
snapshot (scripts/synth_snapshot.py, the shape torch writes) as
%gpumem snapshot does after dumping; the daemon reduces it; the notification's
"Open" draws it. Reported: the daemon's reduction (seconds, JSON bytes), the
panel's drawing (from the reply to the plot and tables in the page: what
drawSnapshot takes) and from the click to the plot visible (fetch included),
median of --runs.

    python labextension/scripts/bench_snapshot.py [--entries 900000] [--runs 5] [--out docs/benchmarks/snapshot-panel.md]
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import REPO, Stack, wait_for  # noqa: E402
from test_browser import CHROMIUM, run_cell  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=900_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    tmp = tempfile.mkdtemp(prefix="gpumem-bench-snapshot-")
    stack = Stack(tmp)
    lab = stack.server()
    cell = (
        "import os, runpy, sys, tempfile\n"
        "_p = os.path.join(os.path.realpath(tempfile.mkdtemp()), 'snapshot.pickle')\n"
        "sys.argv = ['synth_snapshot.py', _p, '%d']\n"
        "runpy.run_path(%r, run_name='__main__')\n"
        "_st, _b = sys.modules['_gpumem_magics'].daemon.sidecar_post('/api/v1/snapshots', {'path': _p, 'reason': 'manual'}, 5)\n"
        "print('handed over', _st, _b.decode())" % (a.entries, str(REPO / "scripts" / "synth_snapshot.py"))
    )
    again = (
        "_st, _b = sys.modules['_gpumem_magics'].daemon.sidecar_post('/api/v1/snapshots', {'path': _p, 'reason': 'manual'}, 5)\n"
        "print('handed over', _st, _b.decode())"
    )
    lab.notebook("bench.ipynb", [cell, again])
    stack.start_daemon()
    draws, opens = [], []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1500, "height": 900})
            page.goto(lab.url + "lab/tree/bench.ipynb?token=" + lab.token)
            page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=120_000)
            kid = wait_for("the kernel", lambda: lab.sessions()[0]["kernel"]["id"], timeout=60)
            log = Path(stack.tmp / "gpumem.log")
            wait_for("the magics", lambda: '"magics injected"' in log.read_text() and kid in log.read_text(), timeout=60)
            out = run_cell(page, 0, "handed over", timeout=600)
            sid = json.loads(out.split("handed over 202 ", 1)[1].strip().splitlines()[0])["id"]
            info = wait_for(
                "the reduction",
                lambda: (lambda s: s if s["snapshot"]["status"] != "reducing" else None)(
                    stack.daemon_get("/api/v1/kernels/%s/snapshots/%s" % (kid, sid)).json()
                ),
                timeout=600,
            )
            red_json = len(json.dumps(info["reduction"]))
            reduce_s = info["snapshot"].get("reduce_seconds")
            for i in range(a.runs):
                if i:  # the same file handed over again: a new snapshot, a new notification
                    run_cell(page, 1, "handed over 202", timeout=120)
                ready = page.locator(".Toastify__toast", has_text="is ready")
                ready.first.wait_for(timeout=120_000)
                t0 = time.monotonic()
                ready.first.locator("button", has_text="Open").click()
                page.locator("[data-gpumem='snapshot'] .jp-gpumem-snapshot-plot canvas").first.wait_for(timeout=60_000)
                page.locator("[data-draw-ms]").first.wait_for(timeout=60_000)
                opens.append(time.monotonic() - t0)
                draws.append(int(page.locator("[data-draw-ms]").first.get_attribute("data-draw-ms")) / 1000)
                wait_for("the toast to go", lambda r=ready: r.count() == 0, timeout=30)
            browser.close()
    finally:
        stack.close()
    line = (
        "%d trace entries: the daemon reduced them in %.2f s to %d bytes of JSON; the panel drew them in %.3f s "
        "(median of %d; max %.3f), %.3f s from the click (the fetch included)"
        % (a.entries, reduce_s or -1, red_json, statistics.median(draws), len(draws), max(draws), statistics.median(opens))
    )
    print(line)
    if a.out:
        Path(a.out).write_text(
            "# Drawing a reduced memory snapshot in the panel\n\n"
            "`python labextension/scripts/bench_snapshot.py --entries %d --runs %d`, %s, Debian's chromium (headless).\n\n%s\n"
            % (a.entries, a.runs, time.strftime("%Y-%m-%d"), line)
        )


if __name__ == "__main__":
    main()
