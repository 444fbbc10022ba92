"""Rounds of jupyterhub-idle-culler 2.x's cull_idle, in process, against a
real JupyterHub, with the cull_arbiter_hook the culler's own config file
sets, and the culler's clock moved forward as its own tests move it (a
patch of jupyterhub_idle_culler.utcnow): hours of idleness in seconds.

    python cull_rounds.py HUB_API_URL CONFIG_FILE INACTIVE_LIMIT SHIFT_SECONDS...

One round per SHIFT_SECONDS, in order, in one process (so the arbiter
remembers what it saw from one round to the next, as the culler's service
does), each printing "round +N s" first. JUPYTERHUB_API_TOKEN is the
culler's token, as for the culler's service.
"""

import asyncio
import logging
import os
import sys
from datetime import timedelta
from unittest import mock

import jupyterhub_idle_culler as culler


async def rounds(url, hook, limit, shifts, log):
    real = culler.utcnow
    for shift in shifts:
        print("round +%d s" % shift, flush=True)
        with mock.patch("jupyterhub_idle_culler.utcnow", lambda shift=shift: real() + timedelta(seconds=shift)):
            await culler.cull_idle(url, os.environ["JUPYTERHUB_API_TOKEN"], limit, log, cull_arbiter=hook)


def main():
    url, config, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    shifts = [float(s) for s in sys.argv[4:]]
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="[%(levelname)s %(name)s] %(message)s")
    # The culler's own loading of its config file: the hook is exactly what
    # the documented line sets.
    app = culler.IdleCuller()
    app.load_config_file(config)
    if app.cull_arbiter_hook is culler.default_cull_arbiter:
        sys.exit("%s set no cull_arbiter_hook (a file the culler cannot read is skipped silently)" % config)
    log = logging.getLogger("IdleCuller")
    log.handlers, log.propagate = [], True  # one format: basicConfig's, on stdout
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request to the daemon: noise
    asyncio.run(rounds(url, app.cull_arbiter_hook, limit, shifts, log))


if __name__ == "__main__":
    main()
