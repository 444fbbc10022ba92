"""The %gpumem magic and what the bootstrap calls: configure, install,
uninstall, api_free, api_render, api_status. It registers the
out-of-memory report's post_run_cell hook (oom.py)."""

import os
import sys

from . import alerts, daemon, freeing, hygiene, oom, recording, reports, state, why, whymagic
from .display import rendered, show

USAGE = (
    "usage: %gpumem [vars [--all-devices] | why [--device N] [--all-devices] [--budget S] | "
    "free [NAME ...] [--all] [--keep NAME ...] [--dry-run] | free --children [--pid N,...] | top"
    " | record on [--max-entries N] | record off | snapshot | help]"
)


def gpumem(line="", cell=None):
    """%gpumem: GPU memory of this kernel. `%gpumem help` lists the commands."""
    if cell is not None:
        # %%gpumem runs the user's cell: its exception is the user's, and
        # sets sys.last_* as a failed cell does.
        if line.strip():
            show({"kind": "error", "message": "%%gpumem takes no arguments on its first line"})
            return None
        try:
            value, data = reports.run_cell(state.shell, cell)
        except Exception as e:
            show({"kind": "error", "message": "gpumem failed: %s" % state.short_exc(e)})
            return None
        show(data)
        return value
    with hygiene.kept_last():
        try:
            _line(line.split())
        except Exception as e:
            show({"kind": "error", "message": "gpumem failed: %s" % state.short_exc(e)})
    return None


def _line(args):
    cmd = args[0] if args else ""
    if cmd == "":
        show(reports.summary_data())
    elif cmd == "vars":
        rest = [a for a in args[1:] if a != "--all-devices"]
        if rest:
            show({"kind": "error", "message": "unexpected %s; %s" % (" ".join(rest), USAGE)})
        else:
            show(reports.vars_data("--all-devices" in args[1:]))
    elif cmd == "why" or (cmd == "free" and "--children" in args[1:]):
        show(whymagic.line(cmd, args[1:]))
    elif cmd == "free":
        try:
            names, keep, opts = freeing.parse_free_args(args[1:])
        except ValueError as e:
            show({"kind": "free", "schema": state.SCHEMA, "error": str(e)})
            return
        show(freeing.free_data(names, opts["all"], keep, opts["dry_run"], opts["all_devices"]))
    elif cmd == "top":
        show(daemon.top_data())
    elif cmd == "record":
        show(recording.record_data(args[1:]))
    elif cmd == "snapshot":
        if args[1:]:
            show({"kind": "error", "message": "%%gpumem snapshot takes no arguments; %s" % USAGE})
        else:
            show(recording.snapshot_data())
    elif cmd in ("help", "-h", "--help"):
        show({"kind": "help", "version": state.version})
    else:
        show({"kind": "error", "message": "unknown command %r; %s" % (cmd, USAGE)})


def configure(shell, config):
    """Binds the package to shell and the Go side's config, registering nothing."""
    state.configure(shell, config)


def install(shell, config):
    """Registers the magics in shell. Called by the bootstrap."""
    configure(shell, config)
    shell.register_magic_function(gpumem, "line_cell", "gpumem")
    shell.events.register("post_run_cell", oom.oom_hook)
    if state.config.get("notebook_alerts"):
        shell.events.register("pre_run_cell", alerts.alert_hook)


def uninstall():
    """Removes what install() registered (the bootstrap calls it on an old
    version before installing a new one)."""
    shell = state.shell
    if shell is None:
        return
    hooks = (("pre_run_cell", alerts.alert_hook), ("post_run_cell", oom.oom_hook), ("post_run_cell", recording.armed_hook))
    for event, hook in hooks:
        try:
            if hook in shell.events.callbacks.get(event, []):
                shell.events.unregister(event, hook)
        except Exception:
            pass
    try:
        mm = shell.magics_manager
        for kind in ("line", "cell"):
            fn = mm.magics[kind].get("gpumem")
            if fn is not None and getattr(fn, "__module__", None) == __name__:
                del mm.magics[kind]["gpumem"]
    except Exception:
        pass


def version():
    return state.version


def api_free(opts):
    """`gpumem free KERNEL`: runs a free for the Go side and renders it as
    %gpumem free would. With "driver": false the caller measures the
    driver's figure itself, so the kernel does not ask gpumem serve."""
    data = freeing.free_data(
        opts.get("vars") or (),
        bool(opts.get("all")),
        opts.get("keep") or (),
        bool(opts.get("dry_run")),
        bool(opts.get("all_devices")),
        ask_daemon=opts.get("driver", True) is not False,
    )
    return api_render(data)


def api_render(data):
    """The data dict with its text/plain and text/html renderings added."""
    data = dict(data)
    data.pop("text", None)
    data.pop("html", None)
    data["text"], data["html"] = rendered(data)
    return data


def api_vars(opts):
    """The data of %gpumem vars, for gpumem serve's API (nothing shown)."""
    return reports.vars_data(bool(opts.get("all_devices")))


def api_summary():
    """The data of %gpumem (per-framework figures), for gpumem serve's API."""
    return reports.summary_data()


def api_why(opts):
    """The data of %gpumem why for the Go side, which joins the driver's
    figures and has it rendered (action render)."""
    return why.why_data(opts.get("device"), bool(opts.get("all_devices")), float(opts.get("budget") or 2.0))


def api_teardown(_opts):
    """The frameworks' own teardown of the kernel's workers, for the Go
    side's free --children (which then ends what is left)."""
    return whymagic.teardown_data()


def api_status():
    return {
        "kind": "status",
        "schema": state.SCHEMA,
        "version": state.version,
        "pid": os.getpid(),
        "python": "%d.%d.%d" % sys.version_info[:3],
        "frameworks_loaded": [m for m in ("torch", "cupy", "jax", "tensorflow") if m in sys.modules],
    }
