"""Cost of the JupyterLab extension, measured on a real stack (JupyterLab 4,
gpumem serve with the simulated GPU listing real kernels, Debian's chromium).

1. Tabs: N simulated tabs poll the server extension exactly as a tab does
   (GET state, then again with since=<newest point>+1&wait=1 as soon as the
   reply comes). Reported: requests per tab per second reaching the daemon
   (the server extension forwards each one), and the daemon's CPU (from
   /proc/<pid>/stat) as a share of one core.
2. Load: JupyterLab opening a notebook in chromium, with the extension and
   with it disabled (page_config disabledExtensions), alternated, median.

    python labextension/scripts/bench.py [--tabs 100] [--seconds 60] [--loads 7] [--out docs/benchmarks/jupyterlab-extension.md]
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import REPO, GiB, Stack


def cpu_seconds(pid):
    fields = Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def tabs(lab, n, seconds):
    counts = [0] * n
    errors = []

    async def tab(i, client, stop_at):
        since, after = 0, 0
        while time.monotonic() < stop_at:
            params = {"events_after": str(after)}
            if since:
                params.update(since=str(since), wait="1")
            r = await client.get(lab.url + "gpumem/api/v1/state", params=params)
            counts[i] += 1
            st = r.json()
            if st.get("status") != "ok":
                errors.append(st)
                await asyncio.sleep(1)
                continue
            after = st["last_event"]
            last = max([p[0] for s in st["series"]["gpus"] + st["series"]["notebooks"] for p in s["points"]] or [0])
            since = max(since, last + 1) if last else 0
            if not last:
                await asyncio.sleep(1)

    # One client (one connection) a tab, as each browser tab has its own.
    clients = [httpx.AsyncClient(headers=lab.headers(), timeout=30) for _ in range(n)]
    try:
        first = (await clients[0].get(lab.url + "gpumem/api/v1/state")).json()["daemon_requests"]
        start = time.monotonic()
        await asyncio.gather(*(tab(i, clients[i], start + seconds) for i in range(n)))
        wall = time.monotonic() - start
        last = (await clients[0].get(lab.url + "gpumem/api/v1/state")).json()["daemon_requests"]
    finally:
        for c in clients:
            await c.aclose()
    return counts, wall, errors, last - first - 1


def load_times(stack, lab, loads):
    from playwright.sync_api import sync_playwright

    cfg = Path(stack.env["JUPYTER_CONFIG_DIR"]) / "labconfig"
    cfg.mkdir(parents=True, exist_ok=True)
    page_config = cfg / "page_config.json"
    out = {"with": [], "without": [], "files": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"])
        for i in range(loads * 2 + 2):
            which = "with" if i % 2 == 0 else "without"
            page_config.write_text(json.dumps({"disabledExtensions": {"jupyterlab-gpumem": which == "without"}}))
            ctx = browser.new_context(viewport={"width": 1400, "height": 800})
            page = ctx.new_page()
            t0 = time.monotonic()
            page.goto(lab.url + "lab/tree/bench.ipynb?token=" + lab.token)
            page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=120_000)
            el = time.monotonic() - t0
            has = page.locator(".jp-gpumem-status").count() > 0
            assert has == (which == "with"), f"extension {which} but status item present={has}"
            # The extension's own files: from the first request's start to the last one's end.
            span = page.evaluate("""() => {
                const rs = performance.getEntriesByType('resource').filter(r => r.name.includes('jupyterlab-gpumem'));
                return rs.length ? Math.max(...rs.map(r => r.responseEnd)) - Math.min(...rs.map(r => r.startTime)) : 0;
            }""")
            if i >= 2:  # the first pair warms caches
                out[which].append(el)
                if which == "with":
                    out["files"].append(span / 1000)
            ctx.close()
        browser.close()
    page_config.unlink()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tabs", type=int, default=100)
    ap.add_argument("--kernels", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--loads", type=int, default=7)
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "jupyterlab-extension.md"))
    a = ap.parse_args()
    n_tabs = a.tabs
    assert a.loads > 0, "--loads must be at least 1"

    stack = Stack(tempfile.mkdtemp(prefix="gpumem-ext-bench-"))
    try:
        lab = stack.server()
        stack.start_daemon()
        kernels = []
        for i in range(a.kernels):
            lab.notebook("nb%d.ipynb" % i)
            kernels.append(lab.start_session("nb%d.ipynb" % i))
        lab.notebook("bench.ipynb")
        stack.set_gpu({stack.kernel_pid(k): (i + 1) * GiB for i, k in enumerate(kernels)})
        dpid = stack.daemon.p.pid
        # The daemon alone, no tab: its own sampling cost.
        c0, t0 = cpu_seconds(dpid), time.monotonic()
        time.sleep(min(a.seconds, 20))
        idle = (cpu_seconds(dpid) - c0) / (time.monotonic() - t0)
        c0, s0 = cpu_seconds(dpid), cpu_seconds(lab.proc.p.pid)
        counts, wall, errors, daemon_requests = asyncio.run(tabs(lab, a.tabs, a.seconds))
        busy = (cpu_seconds(dpid) - c0) / wall
        server = (cpu_seconds(lab.proc.p.pid) - s0) / wall
        per_tab = [c / wall for c in counts]
        loads = load_times(stack, lab, a.loads)
    finally:
        stack.close()

    med_with, med_without = (
        statistics.median(loads["with"]),
        statistics.median(loads["without"]),
    )
    lines = [
        "# JupyterLab extension: cost",
        "",
        "Generated by `labextension/scripts/bench.py` on %s (%d CPUs, load average %.2f at the end)."
        % (
            time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            os.cpu_count(),
            os.getloadavg()[0],
        ),
        "Stack: JupyterLab 4 from .venv/current with jupyterlab_gpumem, gpumem serve (1 s interval) with the",
        "simulated GPU listing %d real kernels, Debian's chromium." % a.kernels,
        "",
        "## Open tabs",
        "",
        "%d simulated tabs, each polling as the extension does (long poll: answered after the daemon's next" % a.tabs,
        f"sample), for {wall:.0f} s. The server extension shares one daemon request among the tabs that",
        "ask the same question at the same time.",
        "",
        "| figure | value |",
        "|---|---|",
        "| requests per tab per second to the server extension (mean; min-max) | "
        f"{statistics.mean(per_tab):.2f}; {min(per_tab):.2f}-{max(per_tab):.2f} |",
        f"| requests to the daemon per second, all tabs | {daemon_requests / wall:.2f} |",
        f"| requests to the daemon per tab per second | {daemon_requests / wall / n_tabs:.3f} |",
        "| daemon CPU, no tab (sampling alone) | %.2f%% of a core |" % (100 * idle),
        "| daemon CPU, %d tabs | %.2f%% of a core |" % (a.tabs, 100 * busy),
        "| JupyterLab server CPU, %d tabs (server extension + Jupyter) | %.1f%% of a core |" % (a.tabs, 100 * server),
        "| replies that were not ok | %d |" % len(errors),
        "",
        "## JupyterLab load",
        "",
        "Time from navigation to a notebook's first cell shown, in chromium, %d loads each (after a warm-up pair)," % a.loads,
        "alternating with and without the extension (disabled through page_config). The machine is shared:",
        "the spread of each row is the noise to read the difference against. The extension's own files",
        "(its remoteEntry and chunks, fetched in parallel with JupyterLab's) are timed by the Performance API.",
        "",
        "| | median | all (s) |",
        "|---|---|---|",
        "| with the extension | {:.0f} ms | {} |".format(1000 * med_with, ", ".join(f"{x:.2f}" for x in loads["with"])),
        "| without | {:.0f} ms | {} |".format(1000 * med_without, ", ".join(f"{x:.2f}" for x in loads["without"])),
        "| difference | %+.0f ms | |" % (1000 * (med_with - med_without)),
        "| the extension's files, first request to last byte | {:.0f} ms | {} |".format(
            1000 * statistics.median(loads["files"]),
            ", ".join(f"{x:.3f}" for x in loads["files"]),
        ),
        "",
    ]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
