# gpumem runs a silent Execute's code through this wrapper (see
# Client.Execute). The code runs in the user's namespace, but an exception it
# raises is caught and reported instead of reaching IPython, user expressions
# are evaluated here under the same guard, and sys.last_* are restored, so
# the user's sys.last_value, %debug and %tb are left as they were.
# After the cell, a one-shot post_execute hook puts back what run_cell
# overwrites even for silent cells (shell.last_execution_result and
# last_execution_succeeded) and drops the cell from linecache, where IPython
# keeps every cell's source.
# The caller's globals provide _gpumem_code (str) and _gpumem_exprs (dict).
# The only state it leaves in the kernel is its compiled code object, kept
# on the shell as _gpumem_isolate_<hash> (compiling it costs ~0.6 ms).
def _gpumem_run(code, expressions):
    import sys
    import traceback
    from IPython import get_ipython

    shell = get_ipython()
    names = ("last_type", "last_value", "last_traceback", "last_exc")
    saved = {n: getattr(sys, n) for n in names if hasattr(sys, n)}
    _restore_after_cell(shell, sys)

    def failure(exc):
        try:
            evalue = str(exc)
        except BaseException:
            evalue = "<unprintable %s>" % type(exc).__name__
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == "<gpumem-isolate>":
            tb = tb.tb_next  # our own frames
        try:
            lines = traceback.format_exception(type(exc), exc, tb)
        except BaseException:
            lines = []
        return {"status": "error", "ename": type(exc).__name__, "evalue": evalue, "traceback": lines}

    result = {"error": None, "expressions": {}}
    try:
        try:
            exec(compile(code, "<gpumem>", "exec"), shell.user_global_ns, shell.user_ns)
        except BaseException as exc:
            result["error"] = failure(exc)
        else:
            for name, source in expressions.items():
                value = None
                try:
                    value = eval(source, shell.user_global_ns, shell.user_ns)
                    data, metadata = shell.display_formatter.format(value)
                    result["expressions"][name] = {"status": "ok", "data": data, "metadata": metadata}
                except BaseException as exc:
                    result["expressions"][name] = failure(exc)
                value = None
    finally:
        for n in names:
            if n in saved:
                setattr(sys, n, saved[n])
            elif hasattr(sys, n):
                delattr(sys, n)

    class Result:
        def _repr_json_(self):
            return result

    shell._gpumem_result = Result()


def _restore_after_cell(shell, sys):
    import linecache

    last = (getattr(shell, "last_execution_result", None), getattr(shell, "last_execution_succeeded", True))
    # The first frame outside this file is the cell that exec'd it.
    f = sys._getframe()
    while f is not None and f.f_code.co_filename == "<gpumem-isolate>":
        f = f.f_back
    cell = f.f_code.co_filename if f is not None else None
    del f

    def restore():
        try:
            shell.events.unregister("post_execute", restore)
        except Exception:
            pass
        try:
            shell.last_execution_result, shell.last_execution_succeeded = last
        except Exception:
            pass
        entry = linecache.cache.get(cell) if cell else None
        if entry and len(entry) > 2 and entry[2] and entry[2][0].startswith("# gpumem-isolate"):
            linecache.cache.pop(cell, None)
            getattr(linecache, "_ipython_cache", {}).pop(cell, None)
            getattr(getattr(shell, "compile", None), "_filename_map", {}).pop(cell, None)

    shell.events.register("post_execute", restore)


_gpumem_run(_gpumem_code, _gpumem_exprs)
