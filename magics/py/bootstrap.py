# gpumem bootstrap. boot.go sends one silent cell that execs this text in a
# fresh globals dict holding _ARGS, so nothing here reaches the user's
# namespace.
#
# _ARGS: nonce, action ("inject" | "free" | "render" | "status" | "vars" |
# "summary" | "why" | "teardown"), bundle (the package gpumem_magics as base64 of zlib of JSON
# {module: source}), config (JSON text: version, sidecar_socket, kernel_id,
# ...), request (JSON text: the action's input).
#
# It installs the package from memory as sys.modules["_gpumem_magics"], its
# modules as attributes of it (and not in sys.modules: gpumem leaves one
# entry there): no file is written and nothing is read from disk but the
# standard library and IPython. The package's hygiene module, loaded
# first, leaves the kernel as it was (sys.last_*, last_execution_result, this
# cell in linecache). It never raises: the report goes into
# sys.modules["_gpumem_report_<nonce>"], which the request's user_expression
# pops.

PACKAGE = "_gpumem_magics"


def _gpumem_boot(a):
    import sys

    report = {"kind": "inject", "schema": 1, "nonce": a["nonce"], "action": a["action"], "ok": False}
    try:
        import base64
        import json
        import platform
        import zlib

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
        sources = json.loads(zlib.decompress(base64.b64decode(a["bundle"])).decode("utf-8"))
        hygiene = _standalone(sources, "hygiene")
        with hygiene.silent_cell(shell, "gpumem-inject"):
            _act(a, sources, shell, report)
    except BaseException as e:
        report["ok"] = False
        report["error"] = "%s: %s" % (type(e).__name__, e)
    return report


def _act(a, sources, shell, report):
    import json
    import sys

    config = json.loads(a["config"])
    request = json.loads(a["request"])
    # The package's entry points, or the single module of a gpumem from
    # before the package layout, injected earlier into this kernel.
    old = getattr(sys.modules.get(PACKAGE), "magic", None) or sys.modules.get(PACKAGE)
    report["loaded_before"] = old is not None and hasattr(old, "install")
    report["frameworks_loaded"] = [m for m in ("torch", "cupy", "jax", "tensorflow") if m in sys.modules]
    current = report["loaded_before"] and getattr(old, "version", None) is not None and old.version() == config.get("version")
    action = a["action"]
    if action == "inject":
        magic = _replace(sources)
        if report["loaded_before"]:
            try:
                old.uninstall()
            except Exception:
                pass
        magic.install(shell, config)
        report.update(ok=True, replaced=report["loaded_before"], version=magic.version())
    elif action in ("free", "render", "vars", "summary", "why", "teardown"):
        if current:
            report["result"] = _run(old, action, request)
        else:
            # Not injected (or another version): run this version's code
            # under a private name, registering nothing.
            name = "%s_%s_%s" % (PACKAGE, action, a["nonce"])
            try:
                magic = _load(sources, name)
                magic.configure(shell, config)
                report["result"] = _run(magic, action, request)
            finally:
                for k in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
                    sys.modules.pop(k, None)
        report["ok"] = True
    elif action == "status":
        if report["loaded_before"]:
            report["result"] = old.api_status()
        report["ok"] = True
    else:
        report["error"] = "unknown action %r" % (action,)


def _run(magic, action, request):
    if action == "free":
        return magic.api_free(request)
    if action == "vars":
        return magic.api_vars(request)
    if action == "summary":
        return magic.api_summary()
    if action in ("why", "teardown"):
        return getattr(magic, "api_" + action)(request)
    return magic.api_render(request)


def _standalone(sources, module):
    """A module of the package that imports nothing of it, on its own."""
    import types

    mod = types.ModuleType("%s.%s" % (PACKAGE, module))
    exec(compile(sources[module], "<gpumem_magics/%s.py>" % module, "exec"), mod.__dict__)
    return mod


def _replace(sources):
    """Loads the package as PACKAGE, replacing an earlier one only when the
    new one loaded: a broken bundle leaves the old one in place."""
    import sys

    def ours():
        return [k for k in sys.modules if k == PACKAGE or k.startswith(PACKAGE + ".")]

    saved = {k: sys.modules.pop(k) for k in ours()}
    try:
        return _load(sources, PACKAGE)
    except BaseException:
        for k in ours():
            sys.modules.pop(k, None)
        sys.modules.update(saved)
        raise


def _load(sources, name):
    """Imports the package from sources as name (and every module of it),
    through a finder that is on sys.meta_path only while this runs. The
    modules then stay attributes of the package only: they import each other
    at load time, so nothing looks them up in sys.modules later. Returns the
    package's magic module."""
    import importlib
    import importlib.util
    import sys

    class Loader(object):
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            short = module.__name__[len(name) + 1 :] or "__init__"
            exec(compile(sources[short], "<gpumem_magics/%s.py>" % short, "exec"), module.__dict__)

    class Finder(object):
        def find_spec(self, fullname, path=None, target=None):
            if fullname == name:
                return importlib.util.spec_from_loader(fullname, loader, is_package=True)
            if fullname.startswith(name + ".") and fullname[len(name) + 1 :] in sources:
                return importlib.util.spec_from_loader(fullname, loader)
            return None

    loader, finder = Loader(), Finder()
    sys.meta_path.insert(0, finder)
    try:
        for module in sorted(sources):
            if module != "__init__":
                importlib.import_module(name + "." + module)
    except BaseException:
        for k in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            sys.modules.pop(k, None)
        raise
    finally:
        sys.meta_path.remove(finder)
    for k in [k for k in sys.modules if k.startswith(name + ".")]:
        sys.modules.pop(k, None)
    return sys.modules[name].magic


class _GpumemReport(object):
    def __init__(self, data):
        self.data = data

    def _repr_json_(self):
        return self.data

    def __repr__(self):
        return "<gpumem report>"


__import__("sys").modules["_gpumem_report_" + _ARGS["nonce"]] = _GpumemReport(_gpumem_boot(_ARGS))  # noqa: F821 (given by boot.go)
