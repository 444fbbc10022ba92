"""Screenshot of a running JupyterLab with the extension: the notebook, the
status bar item and the "GPU memory" panel (Debian's chromium, headless).

    python labextension/scripts/screenshot.py URL OUT.png
URL is the notebook's URL with its token (bash scripts/run.sh prints it)."""

import sys

from playwright.sync_api import sync_playwright


def main(url, out):
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"])
        page = b.new_page(viewport={"width": 1400, "height": 800})
        page.goto(url)
        page.locator(".jp-gpumem-status-label", has_text="GiB").wait_for(timeout=120_000)
        page.locator("[data-gpumem='status']").click()  # opens the panel, at the sidebar's default width
        page.locator("[data-gpumem='notebook-row']").first.wait_for(timeout=30_000)
        page.locator(".jp-gpumem-gpu canvas").first.wait_for(timeout=30_000)
        page.wait_for_function(
            "Number(document.querySelector('.jp-gpumem-gpu').dataset.stackTop) > 0",
            timeout=30_000,
        )
        page.screenshot(path=out)
        b.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
