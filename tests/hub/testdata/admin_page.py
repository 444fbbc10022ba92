"""The hub admin page in Debian's chromium (Playwright), as an admin uses
it: sign in at the hub's login form, open /services/gpumem/, screenshot
it at 1280 and 800 px in light and dark, then free one notebook's caches
through its row's button and the confirmation, and print the page's
answer. A non-admin's sign-in then gets 403 there.

    python admin_page.py HUB_URL ADMIN NONADMIN PASSWORD OUT_DIR TARGET_USER
Prints one JSON object: the screenshots, the flash sentence, the status the
non-admin got."""

import json
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"


def login(browser, hub, name, password, scheme="light", width=1280):
    ctx = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=scheme)
    page = ctx.new_page()
    page.goto(hub + "hub/login?next=/services/gpumem/")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", password)
    page.click("input[type=submit], button[type=submit]")
    return ctx, page


def main(hub, admin, nonadmin, password, out, target):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"screenshots": []}
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        for width in (1280, 800):
            for scheme in ("light", "dark"):
                ctx, page = login(b, hub, admin, password, scheme, width)
                page.locator("[data-gpumem=user]").first.wait_for(timeout=60_000)
                p = out / ("hub-admin-%d-%s.png" % (width, scheme))
                page.screenshot(path=str(p), full_page=True)
                result["screenshots"].append(str(p))
                overflow = page.evaluate("document.documentElement.scrollWidth > document.documentElement.clientWidth")
                result.setdefault("overflow", {})["%d-%s" % (width, scheme)] = overflow
                ctx.close()
        ctx, page = login(b, hub, admin, password)
        row = page.locator("[data-gpumem=user][data-user=%s] [data-gpumem=notebook]" % target).first
        row.wait_for(timeout=60_000)
        row.get_by_role("button", name="Free cache…").click()
        confirm = page.locator("[data-gpumem=confirm]")
        confirm.wait_for(timeout=30_000)
        result["confirm"] = confirm.inner_text()
        page.get_by_role("button", name="Free the caches").click()
        flash = page.locator("[data-gpumem=flash]")
        flash.wait_for(timeout=150_000)
        result["flash"] = flash.inner_text()
        p = out / "hub-admin-after-free.png"
        page.screenshot(path=str(p), full_page=True)
        result["screenshots"].append(str(p))
        ctx.close()
        ctx, page = login(b, hub, nonadmin, password)
        page.wait_for_load_state("load")
        resp = page.goto(hub + "services/gpumem/")
        result["nonadmin_status"] = resp.status if resp else 0
        result["nonadmin_text"] = page.inner_text("body")[:500]
        ctx.close()
        b.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
