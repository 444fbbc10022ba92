# gpumem bootstrap. inject.go sends one line that execs this text in a fresh
# globals dict holding _ARGS, so nothing here reaches the user's namespace.
#
# _ARGS: nonce, action ("inject" | "free" | "status" | "vars" | "summary"), source (the magics'
# source), config (JSON text: version, sidecar_socket, kernel_id, ...), free
# (JSON text of api_free's options).
#
# It leaves the kernel as it found it: sys.last_* are restored even when
# something here fails, and a one-shot post_execute callback puts back
# shell.last_execution_result (which every run_cell, silent or not,
# overwrites) and drops this cell from linecache. It never raises: the report
# goes into sys.modules["_gpumem_report_<nonce>"], which the request's
# user_expression pops.


def _gpumem_boot(a):
    import sys

    missing = object()
    last_names = ("last_type", "last_value", "last_traceback", "last_exc")
    saved_last = {n: sys.__dict__.get(n, missing) for n in last_names}
    report = {"kind": "inject", "schema": 1, "nonce": a["nonce"], "action": a["action"], "ok": False}
    try:
        import json
        import platform
        import types

        report["python"] = platform.python_version()
        for k in [k for k in sys.modules if k.startswith("_gpumem_report_")]:
            sys.modules.pop(k, None)
        try:
            from IPython import get_ipython

            shell = get_ipython()
        except Exception:
            shell = None
        if shell is None or not hasattr(shell, "register_magic_function") or not hasattr(shell, "user_ns"):
            report["error"] = "no IPython shell in this kernel: nothing was injected"
            return report
        try:
            import IPython

            report["ipython"] = str(IPython.__version__)
        except Exception:
            pass
        _arrange_restore(shell, sys)
        config = json.loads(a["config"])
        name = "_gpumem_magics"
        old = sys.modules.get(name)
        report["loaded_before"] = old is not None and hasattr(old, "install")
        report["frameworks_loaded"] = [m for m in ("torch", "cupy", "jax", "tensorflow") if m in sys.modules]

        def fresh():
            mod = types.ModuleType(name)
            mod.__dict__["__file__"] = "<gpumem_magics.py>"
            exec(compile(a["source"], "<gpumem_magics.py>", "exec"), mod.__dict__)
            return mod

        if a["action"] == "inject":
            mod = fresh()
            if report["loaded_before"]:
                try:
                    old.uninstall()
                except Exception:
                    pass
            mod.install(shell, config)
            sys.modules[name] = mod
            report.update(ok=True, replaced=report["loaded_before"], version=mod.VERSION)
        elif a["action"] == "free":
            mod = old
            if mod is None or getattr(mod, "VERSION", None) != config.get("version"):
                # Not injected (or another version): run this version's code
                # without registering anything.
                mod = fresh()
                mod.configure(shell, config)
            report["result"] = mod.api_free(json.loads(a["free"]))
            report["ok"] = True
        elif a["action"] in ("vars", "summary"):
            # Read-only queries for gpumem serve's API (the JupyterLab
            # panel): the data of `%gpumem vars` / `%gpumem`, nothing shown.
            mod = old
            if mod is None or getattr(mod, "VERSION", None) != config.get("version"):
                mod = fresh()
                mod.configure(shell, config)
            if a["action"] == "vars":
                report["result"] = mod.vars_data(bool(json.loads(a["free"]).get("all_devices")))
            else:
                report["result"] = mod.summary_data()
            report["ok"] = True
        elif a["action"] == "status":
            if report["loaded_before"]:
                report["result"] = old.api_status()
            report["ok"] = True
        else:
            report["error"] = "unknown action %r" % (a["action"],)
    except BaseException as e:
        report["ok"] = False
        report["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        for n, v in saved_last.items():
            if sys.__dict__.get(n, missing) is not v:
                if v is missing:
                    try:
                        delattr(sys, n)
                    except AttributeError:
                        pass
                else:
                    setattr(sys, n, v)
    return report


def _arrange_restore(shell, sys):
    """After this silent cell, put back what run_cell overwrites."""
    import linecache

    ler = shell.last_execution_result
    les = getattr(shell, "last_execution_succeeded", True)
    cellname = None
    f = sys._getframe()
    while f is not None:
        fn = f.f_code.co_filename
        entry = linecache.cache.get(fn)
        if entry and len(entry) > 2 and entry[2] and "gpumem-inject" in entry[2][0]:
            cellname = fn
            break
        f = f.f_back
    del f

    def restore():
        try:
            shell.events.unregister("post_execute", restore)
        except Exception:
            pass
        try:
            shell.last_execution_result = ler
            shell.last_execution_succeeded = les
        except Exception:
            pass
        if cellname is not None:
            linecache.cache.pop(cellname, None)
            getattr(linecache, "_ipython_cache", {}).pop(cellname, None)
            getattr(getattr(shell, "compile", None), "_filename_map", {}).pop(cellname, None)

    shell.events.register("post_execute", restore)


class _GpumemReport(object):
    def __init__(self, data):
        self.data = data

    def _repr_json_(self):
        return self.data

    def __repr__(self):
        return "<gpumem report>"


__import__("sys").modules["_gpumem_report_" + _ARGS["nonce"]] = _GpumemReport(_gpumem_boot(_ARGS))
