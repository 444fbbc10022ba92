"""JupyterLab from the wheel's virtualenv, with the simulated GPU and no
`gpumem serve` started by anyone: its extension starts the daemon, and
within 10 s of the page opening Chromium's status bar shows the simulated
figure, and the panel says the daemon was started by this server."""

import os
import time

from conftest import daemon_status, daemons, monotonic, wait_started
from harness import GiB, need

CHROMIUM = os.environ.get("GPUMEM_CHROMIUM", "/usr/bin/chromium")


def test_status_bar_shows_the_figure_with_no_daemon_started_by_hand(wstack):
    need(os.path.exists(CHROMIUM), f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    assert daemons(wstack.socket) == []
    lab = wstack.server(autostart=True)
    up = monotonic()
    status = wait_started(lab, timeout=10)
    print(f"the daemon served {monotonic() - up:.1f} s after JupyterLab answered")
    assert daemons(wstack.socket) == [status["pid"]], "one daemon, the one the server started"
    assert status["text"].endswith("started by this server"), status

    lab.notebook("train.ipynb", ["x = 1"])
    kernel = lab.start_session("train.ipynb")
    pid = wstack.kernel_pid(kernel)
    wstack.set_gpu({pid: 3 * GiB})

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            opened = time.monotonic()
            page.goto(lab.url + "lab/tree/train.ipynb?token=" + lab.token)
            label = page.locator(".jp-gpumem-status-label", has_text="GPU 3.0 GiB (simulated)")
            label.wait_for(timeout=10_000)
            shown = time.monotonic() - opened
            print(f"the status bar showed the figure {shown:.1f} s after the page was opened")
            assert page.locator("[data-gpumem='status']").get_attribute("data-daemon") == "started"
            page.locator(".jp-SideBar.jp-mod-right li[data-id='jp-gpumem-panel']").click()
            line = page.locator("[data-gpumem='daemon-status']")
            line.filter(has_text="started by this server").wait_for(timeout=10_000)
            assert line.get_attribute("data-case") == "started"
            assert f"(pid {status['pid']})" in line.inner_text(), line.inner_text()
        finally:
            browser.close()
    assert daemon_status(lab)["pid"] == status["pid"], "the daemon was not restarted meanwhile"
