"""What a user does in a real JupyterLab 4, in Debian's chromium driven by
Playwright: finding the panel (palette, View menu, status bar), reading it
at the default sidebar width and at 250 and 600 px in light and dark
themes without anything sticking out, its actions, the alert that follows
the GPU, a free that returned nothing, the GPU work and "Why?" of a
notebook, a two-GPU notebook drawn per GPU, and "GPU n/a" without a driver
or a daemon. Screenshots go to
$GPUMEM_ARTIFACTS (else a temp dir); GPUMEM_UPDATE_SCREENSHOT=1 also
writes the README's and the docs' screenshots under docs/screenshots."""

import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from harness import REPO, GiB, need, simgpu, wait_for
from test_server import require_extension

CHROMIUM = os.environ.get("GPUMEM_CHROMIUM", "/usr/bin/chromium")
VIEWPORT = {"width": 1280, "height": 800}
PANEL = "#jp-gpumem-panel"

MARKER_CELL = """import builtins, gc, torch
weights = torch.zeros(1024, 1024)  # 4 MiB, on the CPU: Variables lists it
gc.disable()  # only an explicit gc.collect() (what Free cache runs) finds the cycle below
class _Marker:
    def __del__(self):
        builtins._gpumem_test_collected = True
_m = _Marker(); _m.self = _m; del _m
print("ready")"""
CHECK_CELL = 'print("collected:", getattr(__import__("builtins"), "_gpumem_test_collected", False))'
# A worker in a session of its own: it outlives a kernel restart (an orphan).
# A second one plays a job that computes: reclaim leaves it running.
WORKER_CELL = """import subprocess
worker = subprocess.Popen(["sleep", "600"], start_new_session=True)
job = subprocess.Popen(["sleep", "601"], start_new_session=True)
print("worker", worker.pid, "job", job.pid)"""


# Processes the journey started outside every kernel's process group: ended
# at the end if the daemon did not end them.
spawned = []


def worker_ended(pid):
    """Gone, or a zombie its parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def artifacts_dir():
    d = os.environ.get("GPUMEM_ARTIFACTS") or tempfile.mkdtemp(prefix="gpumem-ext-artifacts-")
    Path(d).mkdir(parents=True, exist_ok=True)
    return Path(d)


def shot(page, out, name, docs_name=None):
    """A screenshot for the artifacts and, with GPUMEM_UPDATE_SCREENSHOT, for the docs."""
    page.screenshot(path=str(out / name))
    if docs_name and os.environ.get("GPUMEM_UPDATE_SCREENSHOT"):
        d = REPO / "docs" / "screenshots"
        d.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(d / docs_name))


def run_cell(page, index, expect_text, timeout=60):
    """Runs the index-th cell of the visible notebook and waits for its output."""
    cell = page.locator(".jp-NotebookPanel:visible .jp-Cell").nth(index)
    prompt = cell.locator(".jp-InputArea-prompt")
    before = prompt.inner_text()
    # A run asked for in the first seconds after the notebook opens is
    # dropped by JupyterLab (no execute_request goes out, the prompt stays
    # blank): ask again until the prompt shows the cell queued or run.
    for attempt in range(8):
        cell.locator(".jp-InputPrompt").click()
        page.locator(".jp-NotebookPanel:visible .jp-Toolbar [data-command='notebook:run-cell-and-select-next']").click()
        try:
            page.wait_for_function(
                "([el, before]) => /\\[(\\*|\\d+)\\]/.test(el.innerText) && el.innerText !== before",
                arg=[prompt.element_handle(), before],
                timeout=4_000,
            )
            break
        except Exception:
            if attempt == 7:
                raise
    cell.locator(".jp-OutputArea-output", has_text=expect_text).first.wait_for(timeout=timeout * 1000)
    return "\n".join(cell.locator(".jp-OutputArea-output").all_inner_texts())


def browser_page(pw, console):
    browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
    page = browser.new_page(viewport=VIEWPORT)
    page.on("console", lambda m: console.append((m.type, m.text, time.monotonic())))
    page.on("pageerror", lambda e: console.append(("pageerror", str(e), time.monotonic())))
    # JupyterLab itself asks "Select Kernel" now and then when a notebook
    # opens on a loaded box (its session starts the kernel while a first
    # initialisation, made before the kernelspecs arrived, asks for one:
    # the kernel is up and idle behind the dialog, and no kernel died in
    # the server's log). A user answers with the preselected kernel; so
    # does the test, before any action it would block, and says so.
    kernel_dialog = page.locator(".jp-Dialog", has_text="Select Kernel")

    def accept_kernel(dialog):
        console.append(("info", "answered JupyterLab's Select Kernel dialog with its preselected kernel", time.monotonic()))
        dialog.locator(".jp-mod-accept").click()

    page.add_locator_handler(kernel_dialog, accept_kernel)
    return browser, page


def open_lab(page, lab, notebook):
    page.goto(lab.url + f"lab/tree/{notebook}?token=" + lab.token)
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=120_000)
    page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=120_000)


def panel_shown(page):
    return page.locator(PANEL).is_visible()


def close_right_sidebar(page):
    """Collapses the right sidebar if the panel shows (a click on its active tab)."""
    if panel_shown(page):
        page.locator(".jp-SideBar.jp-mod-right li[data-id='jp-gpumem-panel']").click()
        wait_for("the panel to close", lambda: not panel_shown(page), timeout=10)


def open_from_palette(page):
    page.keyboard.press("Control+Shift+C")
    box = page.locator(".lm-CommandPalette-input")
    box.wait_for(timeout=10_000)
    box.fill("gpu memory")
    item = page.locator(".lm-CommandPalette-item", has_text="GPU memory: Open panel")
    item.first.wait_for(timeout=10_000)
    item.first.click()


def panel_width(page):
    return page.evaluate(f"document.querySelector('{PANEL}').getBoundingClientRect().width")


def set_panel_width(page, width):
    """Drags the right sidebar's handle until the panel is width px wide."""
    for _ in range(4):
        now = panel_width(page)
        if abs(now - width) <= 1:
            return
        handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle:not(.lm-mod-hidden)").last
        box = handle.bounding_box()
        x, y = box["x"] + box["width"] / 2, box["y"] + 300
        page.mouse.move(x, y)
        page.mouse.down()
        page.mouse.move(x + (now - width), y, steps=4)
        page.mouse.up()
    assert abs(panel_width(page) - width) <= 1, f"the panel is {panel_width(page)} px wide, wanted {width}"


OVERFLOW_JS = """(sel) => {
  const panel = document.querySelector(sel);
  const pr = panel.getBoundingClientRect();
  const bad = [];
  if (panel.scrollWidth > panel.clientWidth + 1) {
    bad.push(`the panel scrolls sideways: ${panel.scrollWidth} px of content in ${panel.clientWidth}`);
  }
  for (const e of panel.querySelectorAll('*')) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (r.right > pr.right + 1 || r.left < pr.left - 1) {
      const what = `${e.tagName.toLowerCase()}.${String(e.className.baseVal ?? e.className)}`;
      const span = (x) => `${Math.round(x.left)}..${Math.round(x.right)}`;
      bad.push(`${what} spans ${span(r)}, the panel ${span(pr)}`);
    }
  }
  return {width: pr.width, bad: bad.slice(0, 12)};
}"""


# Every text the panel shows, measured by the browser: an element whose
# text is cut (its scrollWidth over its clientWidth where it does not
# scroll), or a text whose box (a Range over it) leaves the box of the
# nearest ancestor that clips it. A notebook's name may be cut with an
# ellipsis: its full path is its title. The y axes are a canvas: each
# plot's left edge must leave room for its widest label, measured in the
# axis's font, and the axis's tick and gap.
CLIP_JS = """(sel) => {
  const panel = document.querySelector(sel);
  const bad = [];
  const shown = (e) => { const r = e.getBoundingClientRect(); return r.width > 0 || r.height > 0; };
  const name = (e) => `${e.tagName.toLowerCase()}.${String(e.className.baseVal ?? e.className).split(' ')[0]}`;
  const mayCut = (e) => e.matches('.jp-gpumem-name[title], .jp-gpumem-sr, .jp-gpumem-sr *');
  const clips = (e) => { const s = getComputedStyle(e); return s.overflowX !== 'visible' || s.overflowY !== 'visible'; };
  const walker = document.createTreeWalker(panel, NodeFilter.SHOW_TEXT);
  for (let t = walker.nextNode(); t; t = walker.nextNode()) {
    const e = t.parentElement;
    if (!t.textContent.trim() || !e || !shown(e) || mayCut(e) || e.closest('svg, select')) continue;
    const s = getComputedStyle(e);
    if (s.overflowX !== 'visible' && s.overflowX !== 'auto' && s.overflowX !== 'scroll' && e.scrollWidth > e.clientWidth + 1) {
      bad.push(`${name(e)} "${t.textContent.trim().slice(0, 40)}" is cut: ${e.scrollWidth} px of text in ${e.clientWidth}`);
      continue;
    }
    const range = document.createRange();
    range.selectNodeContents(t);
    const r = range.getBoundingClientRect();
    for (let a = e; a && a !== panel.parentElement; a = a.parentElement) {
      if (a !== panel && !clips(a)) continue;
      const b = a.getBoundingClientRect();
      // Out of a box that scrolls up and down is scrolled, not cut; sideways it is.
      const scrollsY = ['auto', 'scroll'].includes(getComputedStyle(a).overflowY);
      const outY = !scrollsY && (r.top < b.top - 1 || r.bottom > b.bottom + 1);
      if (r.left < b.left - 1 || r.right > b.right + 1 || outY) {
        bad.push(`${name(e)} "${t.textContent.trim().slice(0, 40)}" overflows ${name(a)}: ` +
          `text ${Math.round(r.left)}..${Math.round(r.right)} x ${Math.round(r.top)}..${Math.round(r.bottom)}, ` +
          `box ${Math.round(b.left)}..${Math.round(b.right)} x ${Math.round(b.top)}..${Math.round(b.bottom)}`);
      }
      break;
    }
  }
  const ctx = document.createElement('canvas').getContext('2d');
  for (const g of panel.querySelectorAll('.jp-gpumem-gpu[data-y-labels]')) {
    const over = g.querySelector('.u-over');
    if (!over || !shown(over)) continue;
    ctx.font = g.dataset.axisFont;
    const labels = g.dataset.yLabels.split('|');
    const widest = Math.max(...labels.map((l) => ctx.measureText(l).width));
    const room = over.getBoundingClientRect().left - g.querySelector('.jp-gpumem-plot').getBoundingClientRect().left;
    if (room < widest + Number(g.dataset.axisPad)) {
      const px = Math.ceil(widest);
      bad.push(`GPU ${g.dataset.gpu}'s y axis is ${Math.round(room)} px for labels ${labels.join(', ')} (${px} px)`);
    }
  }
  return bad.slice(0, 12);
}"""


# The colour a GPU's plot draws at (x, y) of its plotting area, as CSS writes it.
BAND_PIXEL_JS = """([sel, x, y]) => {
  const g = document.querySelector(sel);
  const canvas = g.querySelector('canvas');
  const c = canvas.getBoundingClientRect(), o = g.querySelector('.u-over').getBoundingClientRect();
  const k = canvas.width / c.width;
  const px = [Math.round((o.left - c.left + x) * k), Math.round((o.top - c.top + y) * k)];
  const [r, gr, b] = canvas.getContext('2d').getImageData(px[0], px[1], 1, 1).data;
  return `rgb(${r}, ${gr}, ${b})`;
}"""


def assert_as_of_now(page, text, slack=300):
    """The time a view says it read its figures ("as of 14:05:12") is the
    browser's time of day now, give or take slack seconds."""
    import re

    m = re.search(r"(\d\d):(\d\d):(\d\d)", text)
    assert m, f"no time of day in {text!r}"
    now = page.evaluate("(() => { const d = new Date(); return d.getHours() * 3600 + d.getMinutes() * 60 + d.getSeconds(); })()")
    then = int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])
    gap = min((now - then) % 86400, (then - now) % 86400)
    assert gap <= slack, f"{text!r} is {gap} s from the browser's time of day"


def assert_no_overflow(page, what):
    got = page.evaluate(OVERFLOW_JS, PANEL)
    assert not got["bad"], f"{what}: something is wider than the panel ({got['width']:.0f} px):\n" + "\n".join(got["bad"])
    cut = page.evaluate(CLIP_JS, PANEL)
    assert not cut, f"{what}: a text is cut or overflows its box ({got['width']:.0f} px):\n" + "\n".join(cut)
    return got["width"]


def use_theme(stack, theme):
    d = stack.settings / "@jupyterlab" / "apputils-extension"
    d.mkdir(parents=True, exist_ok=True)
    (d / "themes.jupyterlab-settings").write_text(json.dumps({"theme": theme}))


def write_gpus(stack, gpus):
    """The simulated GPU file with several GPUs: [(total, {pid: bytes})]."""
    stack.write_gpus(
        [
            simgpu.gpu(total, [simgpu.proc(pid, b) for pid, b in procs.items()], name="Simulated H200", uuid=f"GPU-{i}")
            for i, (total, procs) in enumerate(gpus)
        ]
    )


def copy_logs(stack, out):
    for p in [stack.tmp / "gpumem.log"] + [s.proc.log for s in stack.servers]:
        if os.path.exists(p):
            shutil.copy(p, out / Path(p).name)


def need_browser():
    require_extension()
    need(
        os.path.exists(CHROMIUM),
        f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)",
    )


def test_user_journey(stack):
    need_browser()
    from playwright.sync_api import sync_playwright

    out = artifacts_dir()
    lab = stack.server()
    lab.notebook("train.ipynb", [MARKER_CELL, CHECK_CELL, WORKER_CELL])
    lab.notebook("eval.ipynb", ["x = 1"])
    stack.start_daemon()
    other = lab.start_session("eval.ipynb")

    console = []  # (type, text, when)
    with sync_playwright() as pw:
        browser, page = browser_page(pw, console)
        state_requests = []
        page.on(
            "request",
            lambda r: "gpumem/api/v1/state" in r.url and state_requests.append(time.monotonic()),
        )
        try:
            _journey(stack, lab, other, page, out, console, state_requests)
        finally:
            page.screenshot(path=str(out / "last.png"))
            copy_logs(stack, out)
            browser.close()
            for pid in spawned:
                try:
                    # Still our worker (not a reused pid)?
                    if Path("/proc/%d/cmdline" % pid).read_bytes() in (b"sleep\x00600\x00", b"sleep\x00601\x00"):
                        os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, FileNotFoundError):
                    pass


def _journey(stack, lab, other, page, out, console, state_requests):
    open_lab(page, lab, "train.ipynb")

    # Open a notebook and run a cell: the status bar shows the simulated figure.
    run_cell(page, 0, "ready")
    mine = next(s["kernel"]["id"] for s in lab.sessions() if s["path"] == "train.ipynb")
    pm, po = stack.kernel_pid(mine), stack.kernel_pid(other)
    stack.set_gpu({pm: 2 * GiB, po: 1 * GiB})
    status = page.locator("[data-gpumem='status']")
    label = page.locator(".jp-gpumem-status-label")
    label.filter(has_text="GPU 2.0 GiB (simulated)").wait_for(timeout=10_000)
    # The label is this notebook; the bar says both parts, and the tooltip says which is which.
    title = status.get_attribute("title")
    assert "this notebook 2.0 GiB (dark), everyone 3.0 GiB of 80.0 GiB" in title, title
    assert page.locator(".jp-gpumem-status-name").inner_text() == "train.ipynb"
    assert "idle" not in title.lower(), title
    shot(page, out, "01-status-bar.png")

    # Findable: the palette's command opens the panel, the View menu has
    # it, and so does a click on the status bar item.
    close_right_sidebar(page)
    open_from_palette(page)
    wait_for("the palette's command to open the panel", lambda: panel_shown(page), timeout=10)
    close_right_sidebar(page)
    page.locator(".lm-MenuBar-item", has_text="View").click()
    page.locator(".lm-Menu-item[data-command='gpumem:open-panel']").wait_for(timeout=10_000)
    page.keyboard.press("Escape")
    status.click()
    wait_for("a click on the status bar item to open the panel", lambda: panel_shown(page), timeout=10)
    icon = page.locator(".jp-SideBar.jp-mod-right li[data-id='jp-gpumem-panel']")
    icon_label = icon.get_attribute("title") or icon.get_attribute("aria-label") or ""
    assert "GPU memory" in icon_label and "GPU" in icon.inner_text(), "the sidebar icon is not labelled"

    rows = page.locator("[data-gpumem='notebook-row']")
    wait_for("two notebooks in the panel", lambda: rows.count() == 2, timeout=10)
    names = sorted(rows.locator(".jp-gpumem-name").all_inner_texts())
    assert names == ["eval.ipynb", "train.ipynb"], names

    # Change the simulated file: the status bar and the plot follow within 2 s.
    gpu = page.locator(".jp-gpumem-gpu[data-gpu='0']")
    wait_for(
        "the plot to show 3 GiB stacked",
        lambda: gpu.get_attribute("data-stack-top") == str(3 * GiB),
        timeout=10,
    )
    t0 = time.monotonic()
    stack.set_gpu({pm: 3 * GiB, po: 1 * GiB})
    label.filter(has_text="GPU 3.0 GiB").wait_for(timeout=5_000)
    t_status = time.monotonic() - t0
    wait_for(
        "the plot to follow",
        lambda: gpu.get_attribute("data-stack-top") == str(4 * GiB),
        timeout=5,
    )
    t_plot = time.monotonic() - t0
    (out / "latency.txt").write_text(f"status bar {t_status:.2f} s, plot {t_plot:.2f} s after the file changed\n")
    print(f"status bar followed in {t_status:.2f} s, plot in {t_plot:.2f} s")
    assert t_status <= 2.0 and t_plot <= 2.0, f"status bar {t_status:.2f} s, plot {t_plot:.2f} s: over 2 s"
    # Ticks at round binary steps: 4 GiB of data reads 0, 2, 4 GiB.
    assert gpu.get_attribute("data-y-ticks") == ",".join(str(x * GiB) for x in (0, 2, 4)), gpu.get_attribute("data-y-ticks")

    # Two notebooks on the GPU: a legend names each band, in its row's
    # colour; the band at the bottom is drawn in its row's swatch colour
    # (opaque: blue over orange read as grey), and each row's sparklines
    # say which is memory and which SM.
    legend = gpu.locator("[data-gpumem='plot-legend']")
    wait_for("the plot's legend", lambda: legend.is_visible(), timeout=10)
    assert sorted(legend.locator("li[data-kernel-id]").all_inner_texts()) == ["eval.ipynb", "train.ipynb"], legend.inner_text()
    assert "GPU used (everyone)" in legend.inner_text(), legend.inner_text()
    over = gpu.locator(".u-over").bounding_box()
    page.mouse.move(over["x"] + over["width"] - 3, over["y"] + over["height"] - 4)
    hover = gpu.locator(".jp-gpumem-plot-hover")
    wait_for("the band under the pointer named", lambda: hover.is_visible() and ":" in hover.inner_text(), timeout=5)
    under = hover.inner_text().split(":")[0]
    page.mouse.move(0, 0)
    band = page.evaluate(BAND_PIXEL_JS, [".jp-gpumem-gpu[data-gpu='0']", over["width"] - 3, over["height"] - 4])
    row_of = page.locator("[data-gpumem='notebook-row']", has_text=under)
    colour = "(e) => getComputedStyle(e).backgroundColor"
    swatch = row_of.locator(".jp-gpumem-swatch").evaluate(colour)
    legend_swatch = legend.locator("li", has_text=under).locator(".jp-gpumem-swatch").evaluate(colour)
    assert band == swatch == legend_swatch, f"{under}: band {band}, row swatch {swatch}, legend {legend_swatch}"
    for r in range(rows.count()):
        labels = rows.nth(r).locator(".jp-gpumem-spark-label").all_inner_texts()
        assert labels == ["memory", "SM"], labels

    # Nothing sticks out: at the default width, at 250 px and at 600 px.
    default = assert_no_overflow(page, "the default sidebar")
    print(f"default sidebar: {default:.0f} px")
    shot(page, out, "02-panel-default.png", "panel-250-light.png")
    set_panel_width(page, 250)
    assert_no_overflow(page, "a 250 px sidebar")
    shot(page, out, "02-panel-250.png")
    set_panel_width(page, 600)
    assert_no_overflow(page, "a 600 px sidebar")
    shot(page, out, "02-panel-600.png", "panel-600-light.png")
    set_panel_width(page, 250)

    # The plot window's selector: 5 minutes, then back to 15.
    page.locator("[data-gpumem='window']").select_option(str(5 * 60))
    assert_no_overflow(page, "a 250 px sidebar, 5 min window")
    page.locator("[data-gpumem='window']").select_option(str(15 * 60))

    # Free cache (from the row's actions menu) reaches the kernel: its
    # gc.collect() finds the marker cycle. The simulated GPU does not move:
    # the notification says nothing was returned, and is no success.
    assert "collected: False" in run_cell(page, 1, "collected:")
    row = page.locator(f"[data-gpumem='notebook-row'][data-kernel-id='{mine}']")

    def menu(command):
        row.locator("[data-gpumem='notebook-actions']").click()
        page.locator(f".lm-Menu-item[data-command='{command}']").click()

    menu("gpumem:free-cache")
    freed = page.locator(".Toastify__toast", has_text="Free cache in train.ipynb: returned nothing to the GPU")
    freed.wait_for(timeout=60_000)
    assert "3.0 GiB" in freed.inner_text(), freed.inner_text()
    assert "success" not in (freed.get_attribute("class") or ""), freed.get_attribute("class")
    assert "collected: True" in run_cell(page, 1, "collected: True")

    # Variables: nothing on a GPU here (CPU torch), so what other devices hold, said so.
    menu("gpumem:show-variables")
    table = page.locator("[data-gpumem='vars-table']")
    table.wait_for(timeout=60_000)
    assert "weights" in table.inner_text(), table.inner_text()
    vars_text = page.locator("[data-gpumem='vars']").inner_text()
    assert "No variable holds GPU memory. These hold memory on other devices:" in vars_text, vars_text
    assert_no_overflow(page, "the variables at 250 px")
    assert page.locator("[data-gpumem='vars'] [data-gpumem='as-of']").inner_text().startswith("as of ")
    shot(page, out, "03-variables.png", "panel-variables-250-light.png")

    # GPU work: the SM figure the daemon charges, under the row; "SM
    # unknown" on a GPU that cannot say, never 0.
    stack.set_gpu({pm: 3 * GiB, po: 1 * GiB}, sm_by_pid={pm: 42})
    work = row.locator("[data-gpumem='gpu-work']")
    wait_for("the SM figure in the row", lambda: work.inner_text() == "42% SM", timeout=15)
    no_util = simgpu.gpu(
        80 * GiB,
        [simgpu.proc(pm, 3 * GiB), simgpu.proc(po, GiB)],
        name="Simulated H200",
        uuid="GPU-0",
        utilization_unknown=True,
    )
    stack.write_gpus([no_util])
    wait_for("SM unknown in the row", lambda: work.inner_text() == "SM unknown", timeout=15)
    stack.set_gpu({pm: 3 * GiB, po: 1 * GiB})

    # Why? from the actions menu: the daemon's text below the rows, within
    # the 250 px sidebar (it scrolls inside its own box).
    menu("gpumem:why")
    why = page.locator("[data-gpumem='why']")
    wait_for("the why text", lambda: why.inner_text() not in ("", "Reading…"), timeout=60)
    why_text = why.inner_text()
    assert "failed" not in why_text and "3.0 GiB" in why_text, why_text
    assert_no_overflow(page, "why at 250 px")
    # A row per holder, name first, the fix on its own line; the time its
    # figures were read; refresh reads again, close closes.
    assert why.locator("[data-gpumem='why-rows'] .jp-gpumem-list-row").count() >= 1, why_text
    view = page.locator("[data-gpumem='vars']")
    as_of = view.locator("[data-gpumem='as-of']")
    assert as_of.inner_text().startswith("as of "), as_of.inner_text()
    assert_as_of_now(page, as_of.inner_text())
    shot(page, out, "03-why.png", "panel-why-250-light.png")
    view.locator("[data-gpumem='view-refresh']").click()
    wait_for("why read again", lambda: why.locator("[data-gpumem='why-rows']").count() == 1, timeout=60)
    view.locator("[data-gpumem='view-close']").click()
    wait_for("the view closed", lambda: view.inner_text().strip() == "", timeout=5)

    # Restart kernel… of a notebook whose tab is not open says why it cannot.
    page.locator(f"[data-gpumem='notebook-row'][data-kernel-id='{other}'] [data-gpumem='notebook-actions']").click()
    restart = page.locator(".lm-Menu-item[data-command='gpumem:restart-kernel']")
    assert "open its notebook" in restart.inner_text(), restart.inner_text()
    assert "lm-mod-disabled" in (restart.get_attribute("class") or "")
    page.keyboard.press("Escape")

    # Free workers: nothing of this kernel's holds GPU memory but itself,
    # and it is never ended: the notification says none ended, not a success.
    menu("gpumem:free-workers")
    workers = page.locator(".Toastify__toast", has_text="Free workers of train.ipynb: ended 0 worker processes")
    workers.wait_for(timeout=120_000)
    assert "success" not in (workers.get_attribute("class") or ""), workers.get_attribute("class")
    assert stack.kernel_pid(mine) == pm, "Free workers ended the kernel"

    # Over the alert threshold (80%): one notification, naming the biggest holder.
    stack.set_gpu({pm: 70 * GiB, po: 1 * GiB})
    alert = page.locator(".Toastify__toast", has_text="% full")
    alert.first.wait_for(timeout=10_000)
    assert "train.ipynb 70.0 GiB" in alert.first.inner_text(), alert.first.inner_text()
    stack.set_gpu({pm: 71 * GiB, po: 1 * GiB})
    label.filter(has_text="GPU 71.0 GiB").wait_for(timeout=10_000)
    # The open notification says the daemon's new figure, in place.
    alert.filter(has_text="train.ipynb 71.0 GiB").wait_for(timeout=10_000)
    for _ in range(2):  # two more polls: the alert stays one
        page.wait_for_event("request", lambda r: "gpumem/api/v1/state" in r.url, timeout=10_000)
    assert alert.count() == 1, "the alert was shown %d times" % alert.count()
    shot(page, out, "04-alert.png", "jupyterlab-gpumem.png")
    # The GPU drops back: the alert says so, then goes away.
    stack.set_gpu({pm: 5 * GiB, po: 1 * GiB})
    back = page.locator(".Toastify__toast", has_text="GPU 0 is back under the alert threshold: 6.0 GiB of 80.0 GiB used")
    back.wait_for(timeout=10_000)
    assert alert.count() == 0, "the stale alert still stands"
    back.wait_for(state="detached", timeout=20_000)

    # Restart kernel (JupyterLab's own, with its confirmation) from the
    # actions menu: the daemon ends the orphaned worker, and a
    # notification says so once.
    words = run_cell(page, 2, "worker").split()
    worker, job = int(words[-3]), int(words[-1])
    spawned.extend([worker, job])
    stack.set_gpu({pm: 2 * GiB, worker: int(1.5 * GiB), job: GiB, po: 1 * GiB}, sm_by_pid={job: 90})
    procs = row.locator("[data-field='procs']")
    wait_for("the workers counted in the notebook", lambda: procs.get_attribute("data-count") == "3", timeout=10)
    # Free workers asks first when a worker computes, naming it and its SM %.
    wait_for("the job's SM figure in the row", lambda: work.inner_text() == "90% SM", timeout=15)
    menu("gpumem:free-workers")
    ask = page.locator(".jp-Dialog", has_text="Free workers of train.ipynb")
    ask.wait_for(timeout=10_000)
    assert f"pid {job} computes at 90% SM on GPU 0" in ask.inner_text(), ask.inner_text()
    ask.locator("button", has_text="Cancel").click()
    ask.wait_for(state="detached", timeout=10_000)
    menu("gpumem:restart-kernel")
    page.locator(".jp-Dialog .jp-mod-accept").click()
    toast = page.locator(
        ".Toastify__toast",
        has_text="Ended 1 orphan of train.ipynb holding 1.5 GiB after the restart",
    )
    toast.wait_for(timeout=30_000)
    wait_for("the worker to be ended", lambda: worker_ended(worker), timeout=10)
    assert toast.count() == 1
    orphans = row.locator("[data-field='orphans']")
    wait_for("the panel to count the ended orphan", lambda: orphans.get_attribute("data-count") == "1", timeout=10)
    # The job that computes is left running: it stays in its notebook's
    # row, marked, and is not "Everyone else" (the same user).
    left = row.locator(f"[data-gpumem='left-running'][data-pid='{job}']")
    left.wait_for(timeout=30_000)
    assert "left running" in left.inner_text(), left.inner_text()
    # (The simulated file still lists the old kernel's pid and the ended
    # worker: those are everyone else's, the first of a user no longer
    # known. The job's 1.0 GiB is not among them.)
    others = page.locator(".jp-gpumem-others").inner_text()
    assert "1.0 GiB" not in others and "unknown user" in others, others
    assert_no_overflow(page, "a job left running at 250 px")
    shot(page, out, "05-reclaim.png", "panel-left-running-250-light.png")
    # "End it" says what it did, with the figures of the sample after.
    kept = page.locator(".Toastify__toast", has_text=f"(pid {job},")
    kept.first.locator("button", has_text="End it").click()
    ended = page.locator(".Toastify__toast", has_text=f"Ended pid {job} of train.ipynb (it held 1.0 GiB); GPU 0 now")
    ended.wait_for(timeout=30_000)
    wait_for("the job to be ended", lambda: worker_ended(job), timeout=10)
    stack.set_gpu({pm: 2 * GiB, po: 1 * GiB})
    left.wait_for(state="detached", timeout=15_000)

    # gpumem serve stops: the panel says so, the status bar says "GPU n/a"
    # and why, the console stays clean, no tight loop.
    stop_at = time.monotonic()
    stack.stop_daemon()
    status_line = page.locator("[data-gpumem='panel-status']")
    status_line.filter(has_text="gpumem serve is not running").wait_for(timeout=10_000)
    label.filter(has_text="GPU n/a").wait_for(timeout=10_000)
    assert "gpumem serve is not running" in status.get_attribute("title"), status.get_attribute("title")
    # The failed poll, then the next one, backed off.
    page.wait_for_event("request", lambda r: "gpumem/api/v1/state" in r.url, timeout=15_000)
    gaps = [b - a for a, b in itertools.pairwise(state_requests) if a > stop_at]
    assert gaps and min(gaps) >= 4.0, f"polls after the daemon stopped came {gaps} s apart: a tight loop"
    bad = [(t, m) for t, m, when in console if when >= stop_at and t in ("error", "pageerror", "warning")]
    assert not bad, f"console after gpumem serve stopped: {bad}"
    ours = [(t, m) for t, m, _ in console if t in ("error", "pageerror") and "gpumem" in m.lower()]
    assert not ours, f"console errors from the extension: {ours}"
    assert_no_overflow(page, "the panel without the daemon")
    # Said once: the daemon line does not repeat the status line.
    daemon_line = page.locator("[data-gpumem='daemon-status']")
    assert not daemon_line.is_visible(), daemon_line.inner_text()
    assert page.locator(PANEL).inner_text().count("gpumem serve is not running") == 1, page.locator(PANEL).inner_text()
    assert not page.locator("[data-gpumem='window']").is_visible(), "a plot window selector without plots"
    shot(page, out, "06-no-daemon-250.png", "panel-no-daemon-250-light.png")
    shot(page, out, "06-no-daemon.png")


LONG = "a-notebook-with-a-rather-long-name-for-a-sidebar-{}.ipynb"


def test_dark_two_gpus_many_notebooks(stack):
    """Dark theme, a 250 px sidebar and the 1280x800 page: five notebooks
    with long names, one of them on two GPUs: nothing sticks out, and each
    GPU's plot draws that notebook's bytes on that GPU only."""
    need_browser()
    from playwright.sync_api import sync_playwright

    out = artifacts_dir()
    use_theme(stack, "JupyterLab Dark")
    lab = stack.server()
    names = [LONG.format(i) for i in range(4)] + ["two-gpus.ipynb"]
    for n in names:
        lab.notebook(n, ["x = 1"])
    stack.start_daemon()
    kernels = {n: lab.start_session(n) for n in names}
    pids = {n: stack.kernel_pid(k) for n, k in kernels.items()}
    two = pids["two-gpus.ipynb"]
    gpu0 = {pids[n]: (i + 1) * GiB for i, n in enumerate(names[:4])}
    gpu0[two] = 20 * GiB
    write_gpus(stack, [(80 * GiB, gpu0), (80 * GiB, {two: 41 * GiB})])

    console = []
    with sync_playwright() as pw:
        browser, page = browser_page(pw, console)
        try:
            open_lab(page, lab, "two-gpus.ipynb")
            page.locator(".jp-gpumem-status-label", has_text="GPU 61.0 GiB (simulated)").wait_for(timeout=30_000)
            assert page.evaluate("document.body.dataset.jpThemeLight") == "false", "not the dark theme"
            # The status item names the notebook its figure is of; on a tab
            # that is not a notebook (the launcher) it names none and shows
            # no notebook's figure; back on the notebook, its figure again.
            status_name = page.locator(".jp-gpumem-status-name")
            assert status_name.inner_text() == "two-gpus.ipynb", status_name.inner_text()
            page.keyboard.press("Control+Shift+L")
            page.locator(".jp-Launcher").first.wait_for(timeout=20_000)
            page.locator(".jp-gpumem-status-label", has_text="GPU").filter(has_not_text="GiB").wait_for(timeout=10_000)
            assert not status_name.is_visible(), status_name.inner_text()
            page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="two-gpus.ipynb").click()
            page.locator(".jp-gpumem-status-label", has_text="GPU 61.0 GiB (simulated)").wait_for(timeout=10_000)
            page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="Launcher").locator(".lm-TabBar-tabCloseIcon").click()
            page.locator(".jp-Launcher").first.wait_for(state="detached", timeout=10_000)
            page.locator("[data-gpumem='status']").click()
            wait_for("the panel", lambda: panel_shown(page), timeout=10)
            rows = page.locator("[data-gpumem='notebook-row']")
            wait_for("five notebooks", lambda: rows.count() == 5, timeout=20)
            g0 = page.locator(".jp-gpumem-gpu[data-gpu='0']")
            g1 = page.locator(".jp-gpumem-gpu[data-gpu='1']")
            want0 = sum(gpu0.values())
            wait_for("GPU 0's stack", lambda: g0.get_attribute("data-stack-top") == str(want0), timeout=20)
            wait_for("GPU 1's stack", lambda: g1.get_attribute("data-stack-top") == str(41 * GiB), timeout=20)
            # GPU 1 holds only the two-GPU notebook's 41 GiB there, not its 61 GiB total.
            assert g1.get_attribute("data-bands") == kernels["two-gpus.ipynb"], g1.get_attribute("data-bands")
            ticks = g1.get_attribute("data-y-ticks")
            assert ticks == ",".join(str(x * GiB) for x in (0, 16, 32, 48)), ticks
            assert "41.0 GiB / 80.0 GiB used" in g1.locator("[data-gpumem='gpu-figure']").inner_text()
            # No legend: resting the pointer on a band names its notebook.
            over = g1.locator(".u-over")
            box = over.bounding_box()
            page.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] - 4)
            hover = g1.locator(".jp-gpumem-plot-hover")
            hover.filter(has_text="two-gpus.ipynb: 41.0 GiB").wait_for(timeout=5_000)
            page.mouse.move(0, 0)
            # A long name is cut with an ellipsis, the full path on hover.
            name = rows.locator(".jp-gpumem-name", has_text="a-notebook-with").first
            assert name.get_attribute("title").endswith(".ipynb")
            default = assert_no_overflow(page, "dark, the default sidebar")
            print(f"default sidebar: {default:.0f} px")
            shot(page, out, "10-dark-default.png", "panel-two-gpus-dark.png")
            set_panel_width(page, 250)
            cut = page.evaluate(
                "(s) => { const e = document.querySelector(s); return e.scrollWidth > e.clientWidth; }",
                ".jp-gpumem-name[title*='a-notebook-with']",
            )
            assert cut, "at 250 px the long name should be cut"
            assert_no_overflow(page, "dark, a 250 px sidebar")
            shot(page, out, "11-dark-250.png", "panel-250-dark.png")
            set_panel_width(page, 600)
            assert_no_overflow(page, "dark, a 600 px sidebar")
            shot(page, out, "12-dark-600.png", "panel-600-dark.png")
            # 3-digit ticks: 100 GiB on GPU 1 reads up to "128 GiB", 400 MiB
            # on a third GPU up to "512 MiB", every digit kept at 250 px.
            write_gpus(stack, [(80 * GiB, gpu0), (141 * GiB, {two: 100 * GiB}), (141 * GiB, {two: 400 << 20})])
            g2 = page.locator(".jp-gpumem-gpu[data-gpu='2']")
            wait_for("GPU 1's 3-digit axis", lambda: g1.get_attribute("data-y-labels") == "0|64 GiB|128 GiB", timeout=20)
            wait_for("GPU 2's 3-digit axis", lambda: g2.get_attribute("data-y-labels") == "0|256 MiB|512 MiB", timeout=20)
            set_panel_width(page, 250)
            assert_no_overflow(page, "dark, 3-digit axes at 250 px")
            shot(page, out, "12-dark-axes-250.png", "panel-axes-250-dark.png")
            set_panel_width(page, 600)
            assert_no_overflow(page, "dark, 3-digit axes at 600 px")
            write_gpus(stack, [(80 * GiB, gpu0), (80 * GiB, {two: 41 * GiB})])
            # The settings: in the Settings Editor, and they take effect.
            page.keyboard.press("Control+,")
            page.locator(".jp-PluginList-entry", has_text="GPU memory").first.wait_for(timeout=20_000)
            r = lab.get("lab/api/settings/jupyterlab-gpumem:plugin")
            assert set(r.json()["schema"]["properties"]) == {"refreshSeconds", "windowMinutes", "showStatusItem"}, r.text
            raw = json.dumps({"showStatusItem": False, "windowMinutes": 60})
            headers = dict(lab.headers(), **{"Content-Type": "application/json"})
            put = httpx.put(lab.url + "lab/api/settings/jupyterlab-gpumem:plugin", json={"raw": raw}, headers=headers, timeout=30)
            assert put.status_code == 204, put.text
            page.reload()
            tab = page.locator(".jp-SideBar.jp-mod-right li[data-id='jp-gpumem-panel']")
            tab.wait_for(timeout=120_000)
            if not panel_shown(page):
                tab.click()
            window = page.locator("[data-gpumem='window']")
            wait_for("the window setting", lambda: window.input_value() == "3600", timeout=20)
            page.locator(".jp-gpumem-gpu[data-gpu='1'] canvas").wait_for(timeout=20_000)
            # Less than 15 minutes of history: the 1 h plot draws it at the sampling interval.
            wait_for("GPU 0's stack in the 1 h window", lambda: g0.get_attribute("data-stack-top") == str(want0), timeout=20)
            assert_no_overflow(page, "dark, a 1 h window")
            shot(page, out, "13-dark-1h.png")
            status = page.locator("[data-gpumem='status']")
            assert status.count() == 1 and not status.is_visible(), "the status item shows though the setting hides it"
            ours = [(t, m) for t, m, _ in console if t in ("error", "pageerror") and "gpumem" in m.lower()]
            assert not ours, f"console errors from the extension: {ours}"
        finally:
            page.screenshot(path=str(out / "dark-last.png"))
            copy_logs(stack, out)
            browser.close()


def test_no_driver_says_na(stack):
    """Without an NVIDIA driver (no simulated GPU either) the status bar
    says "GPU n/a", never "GPU 0 B", and its tooltip says why."""
    need_browser()
    ldconfig = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    if "libnvidia-ml.so.1" in ldconfig:
        import pytest

        pytest.skip("this host has an NVIDIA driver: the no-driver page does not apply")
    from playwright.sync_api import sync_playwright

    out = artifacts_dir()
    lab = stack.server()
    lab.notebook("cpu.ipynb", ["x = 1"])
    stack.env.pop("GPUMEM_FAKE_GPU")  # the real driver, absent here
    stack.start_daemon()
    stack.kernel_pid(lab.start_session("cpu.ipynb"))
    console = []
    with sync_playwright() as pw:
        browser, page = browser_page(pw, console)
        try:
            open_lab(page, lab, "cpu.ipynb")
            label = page.locator(".jp-gpumem-status-label")
            label.filter(has_text="GPU n/a").wait_for(timeout=30_000)
            status = page.locator("[data-gpumem='status']")
            wait_for("the reason in the tooltip", lambda: "no NVIDIA driver" in (status.get_attribute("title") or ""), timeout=10)
            assert "0 B" not in label.inner_text()
            status.click()
            wait_for("the panel", lambda: panel_shown(page), timeout=10)
            page.locator("[data-gpumem='panel-status']", has_text="no NVIDIA driver").wait_for(timeout=10_000)
            assert not page.locator("[data-gpumem='window']").is_visible(), "a plot window selector without plots"
            # No notebook holds "0 B" either: there is no figure.
            fig = page.locator("[data-gpumem='notebook-row'] [data-field='now']")
            fig.filter(has_text="n/a").wait_for(timeout=10_000)
            assert "no NVIDIA driver" in fig.get_attribute("title")
            set_panel_width(page, 250)
            assert_no_overflow(page, "no driver")
            shot(page, out, "20-no-driver.png", "panel-no-driver-250-light.png")
        finally:
            copy_logs(stack, out)
            browser.close()
