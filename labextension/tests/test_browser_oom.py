"""An out-of-memory error and a memory snapshot in a real JupyterLab 4,
in Debian's chromium driven by Playwright: the notification comes once, its
"Open report" shows the daemon's report in the panel; a snapshot handed to
the daemon is announced and drawn there; both fit a 250 px sidebar.
Screenshots go to $GPUMEM_ARTIFACTS (else a temp dir)."""

import os
from pathlib import Path

from harness import REPO, GiB, need, wait_for
from test_browser import (
    CHROMIUM,
    artifacts_dir,
    assert_as_of_now,
    assert_no_overflow,
    panel_shown,
    run_cell,
    set_panel_width,
    shot,
)
from test_server import require_extension

OOM_CELL = """import torch
raise torch.cuda.OutOfMemoryError(
    "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 80.00 GiB of which 9.00 GiB is free."
)"""

# What %gpumem snapshot does after torch.cuda.memory._dump_snapshot (no GPU
# here): a synthetic snapshot of the same shape, handed to the daemon.
SNAPSHOT_CELL = """import os, runpy, sys, tempfile
_d = os.path.realpath(tempfile.mkdtemp(prefix="gpumem-snap-"))
_p = os.path.join(_d, "snapshot.pickle")
sys.argv = ["synth_snapshot.py", _p, "50000"]
runpy.run_path(%r, run_name="__main__")
_st, _body = sys.modules["_gpumem_magics"].daemon.sidecar_post("/api/v1/snapshots", {"path": _p, "reason": "manual"}, 5)
print("handed over", _st, _body.decode())""" % str(REPO / "scripts" / "synth_snapshot.py")


def injected(stack, kernel_id):
    log = Path(stack.tmp / "gpumem.log")
    return log.exists() and any('"magics injected"' in ln and kernel_id in ln for ln in log.read_text().splitlines())


def test_oom_notification_and_report(stack):
    require_extension()
    need(os.path.exists(CHROMIUM), f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    out = artifacts_dir()
    lab = stack.server()
    lab.notebook("train.ipynb", [OOM_CELL, SNAPSHOT_CELL])
    lab.notebook("hold.ipynb", ["x = 1"])
    stack.start_daemon("--no-notebook-alerts")
    other = lab.start_session("hold.ipynb")
    console = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1500, "height": 900})
        page.on("console", lambda m: console.append((m.type, m.text)))
        page.on("pageerror", lambda e: console.append(("pageerror", str(e))))
        try:
            page.goto(lab.url + "lab/tree/train.ipynb?token=" + lab.token)
            page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=120_000)
            mine = wait_for(
                "train.ipynb's kernel",
                lambda: next((s["kernel"]["id"] for s in lab.sessions() if s["path"] == "train.ipynb"), None),
                timeout=60,
            )
            pm, po = stack.kernel_pid(mine), stack.kernel_pid(other)
            stack.set_gpu({pm: 10 * GiB, po: 60 * GiB})
            wait_for("the magics in train.ipynb's kernel", lambda: injected(stack, mine), timeout=60)

            def attributed():
                rep = stack.daemon_get("/api/v1/notebooks").json()
                return {nb["kernel_id"] for nb in rep["notebooks"] if nb["gpu_memory_bytes"]} >= {mine, other}

            wait_for("the daemon to attribute both kernels", attributed, timeout=30)

            # The cell fails; the report is under its traceback; one notification.
            text = run_cell(page, 0, "gpumem: out of memory")
            assert "hold.ipynb" in text and "60.0 GiB" in text and "advice:" in text, text
            toast = page.locator(".Toastify__toast", has_text="Out of memory in train.ipynb on GPU 0: 60.0 GiB held by your")
            toast.first.wait_for(timeout=15_000)
            for _ in range(3):  # three more polls: still one
                page.wait_for_event("request", lambda r: "gpumem/api/v1/state" in r.url, timeout=15_000)
            assert toast.count() == 1, "the notification was shown %d times" % toast.count()
            page.screenshot(path=str(out / "oom-01-notification.png"))

            # "Open report": the panel, in a 250 px sidebar, shows the
            # daemon's report, nothing wider than the panel.
            page.locator("[data-gpumem='status']").click()
            wait_for("the panel", lambda: panel_shown(page), timeout=10)
            set_panel_width(page, 250)
            toast.first.locator("button", has_text="Open report").click()
            report = page.locator("[data-gpumem='oom-report']")
            report.wait_for(timeout=10_000)
            assert_no_overflow(page, "the report at 250 px")
            rtext = report.inner_text()
            for want in [
                "Out of memory in train.ipynb on GPU 0",
                "asked for 20.0 GiB",
                "hold.ipynb",
                "60.0 GiB",
                "this kernel",
                "advice: hold.ipynb (yours",
            ]:
                assert want in rtext, (want, rtext)
            # Its figures' time, and ↻ adds what the GPU and the kernel hold now.
            as_of = page.locator("[data-gpumem='as-of']").inner_text()
            assert "figures of the error, read at " in as_of, as_of
            assert_as_of_now(page, as_of)
            page.locator("[data-gpumem='view-refresh']").click()
            page.locator("[data-gpumem='oom-now']", has_text="train.ipynb holds").wait_for(timeout=10_000)
            assert_no_overflow(page, "the report and its figures now at 250 px")
            shot(page, out, "oom-02-report.png", "panel-oom-250-light.png")

            # A snapshot handed to the daemon: announced, then drawn.
            assert "handed over 202" in run_cell(page, 1, "handed over", timeout=120)
            ready = page.locator(".Toastify__toast", has_text="Memory snapshot of train.ipynb is ready")
            ready.first.wait_for(timeout=60_000)
            ready.first.locator("button", has_text="Open").click()
            snap = page.locator("[data-gpumem='snapshot']")
            snap.wait_for(timeout=30_000)
            wait_for("the snapshot's plot", lambda: page.locator(".jp-gpumem-snapshot-plot canvas").count() >= 1, timeout=30)
            stacks = page.locator("[data-gpumem='snapshot-stacks']").inner_text()
            assert "marker.py:42 in <module>" in stacks, stacks
            href = page.locator("[data-gpumem='snapshot-download']").get_attribute("href")
            r = lab.get(href[len(lab.url) :] if href.startswith(lab.url) else href.lstrip("/"))
            assert r.status_code == 200 and r.content[:2] == b"\x80\x04", (r.status_code, r.content[:20])
            assert_no_overflow(page, "the snapshot at 250 px")
            page.screenshot(path=str(out / "oom-03-snapshot.png"))
        finally:
            page.screenshot(path=str(out / "oom-last.png"))
            browser.close()
    ours = [(t, m) for t, m in console if t in ("error", "pageerror") and "gpumem" in m.lower()]
    assert not ours, f"console errors from the extension: {ours}"
