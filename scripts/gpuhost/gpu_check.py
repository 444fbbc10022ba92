#!/usr/bin/env python3
"""gpu_check.py: checks gpumem's %gpumem magics on a real GPU host.

    GPUMEM_BIN=.gpukit/gpumem python3 scripts/gpuhost/gpu_check.py [options]

For each scenario it starts a fresh kernel (jupyter_client + ipykernel), or
with --mode inprocess a child process hosting an IPython InteractiveShell,
injects the magics with the binary's own cell (`gpumem inject-cell`: a
silent execute of bootstrap.py, the report read back through
user_expressions, exactly what gpumem attach sends), makes the
common leaks with big arrays (one displayed, so held by Out and _; one
trapped in the frames of a traceback; a model deleted but cached), runs
%gpumem, %gpumem vars and %gpumem free --all, and measures the framework's
own counters and the driver's per-process figure (nvidia-smi
--query-compute-apps) before and after. It prints the magics' text/plain
outputs and one PASS / FAIL / SKIP / INFO line per check, and exits 1 if
any check failed.

Scenarios (--scenarios, comma-separated; default all that can run):
  noinit        torch/cupy/jax imported but never used: the magics must not
                create a CUDA context (no nvidia-smi entry for the kernel)
  torch         PyTorch: reserved must be 0 after free --all, and NVML down
                to about the CUDA context (< --context-gib) within 1 s
  cupy          CuPy: pool used/held 0, NVML down to the context
  jax           JAX with XLA_PYTHON_CLIENT_PREALLOCATE=false: in-use 0; JAX
                keeps its pool (reported, not a failure)
  jax-platform  JAX with XLA_PYTHON_CLIENT_ALLOCATOR=platform: NVML down
  cell          %%gpumem: a cell's change in memory and its peak
  jax-prealloc  JAX preallocating (its default): %gpumem's advice says so

--notebook examples/leaks.ipynb --notebook-out X.ipynb also runs the
example notebook after injecting and writes it with its outputs.

--device cpu runs the torch scenario on CPU tensors (free --all
--all-devices) as a local smoke test of this script; GPU-only checks SKIP.
Every wait has a deadline.
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hostkit import smi_rows  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
RESULTS = []


def result(status, name, detail=""):
    RESULTS.append((status, name))
    print("%-4s %s%s" % (status, name, (": " + detail) if detail else ""), flush=True)


def check(ok, name, detail=""):
    result("PASS" if ok else "FAIL", name, detail)
    return ok


# ---------------------------------------------------------------------------
# Injection: the binary's own cell (gpumem inject-cell), never a copy of its
# wire format


def inject_cell(gpumem):
    """The cell `gpumem attach` sends: {"code", "expr", "nonce", "version"}."""
    try:
        out = subprocess.run([gpumem, "inject-cell"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise SystemExit("%s inject-cell: %s (give a gpumem binary with --gpumem or GPUMEM_BIN)" % (gpumem, e)) from None
    return json.loads(out)


# ---------------------------------------------------------------------------
# Drivers: a kernel through jupyter_client, or an in-process IPython shell in
# a child process. Both: execute(code, silent, store_history,
# user_expressions, timeout) -> {"reply": {...}, "outputs": [...]}, pid, close().


class KernelDriver(object):
    def __init__(self, env, timeout=120):
        from jupyter_client import KernelManager

        self.km = KernelManager(kernel_name="python3")
        kenv = dict(os.environ)
        kenv.update(env)
        self.km.start_kernel(env=kenv)
        deadline = time.monotonic() + timeout
        while True:
            self.kc = self.km.client()
            self.kc.start_channels()
            try:
                self.kc.wait_for_ready(timeout=max(1.0, deadline - time.monotonic()))
                break
            except Exception:
                self.kc.stop_channels()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        r = self.execute("import os; print(os.getpid())", silent=True, store_history=False)
        self.pid = int("".join(o["content"].get("text", "") for o in r["outputs"] if o["type"] == "stream").strip())

    def execute(self, code, silent=False, store_history=True, user_expressions=None, timeout=600):
        import queue

        deadline = time.monotonic() + timeout
        msg_id = self.kc.execute(
            code, silent=silent, store_history=store_history, user_expressions=user_expressions or {}, allow_stdin=False
        )

        def nxt(get):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("kernel did not answer within %ss" % timeout)
            try:
                return get(timeout=left)
            except queue.Empty:
                raise TimeoutError("kernel did not answer within %ss" % timeout) from None

        while True:
            m = nxt(self.kc.get_shell_msg)
            if m["parent_header"].get("msg_id") == msg_id:
                reply = m["content"]
                break
        outputs = []
        while True:
            m = nxt(self.kc.get_iopub_msg)
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            if m["msg_type"] == "status" and m["content"].get("execution_state") == "idle":
                break
            if m["msg_type"] in ("stream", "display_data", "execute_result", "error"):
                outputs.append({"type": m["msg_type"], "content": m["content"]})
        return {"reply": reply, "outputs": outputs}

    def close(self):
        try:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)
        except Exception as e:
            print("INFO kernel shutdown: %s" % e)


class InprocDriver(object):
    """A child process (this script, --child) hosting IPython's
    InteractiveShell, driven over pipes with one JSON object a line."""

    def __init__(self, env, timeout=120):
        cenv = dict(os.environ)
        cenv.update(env)
        cenv["PYTHONUNBUFFERED"] = "1"
        self.p = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child"],
            env=cenv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.p.pid
        self._call({"op": "ping"}, timeout)

    def _call(self, req, timeout):
        import selectors

        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(self.p.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise TimeoutError("in-process shell did not answer within %ss" % timeout)
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("in-process shell exited (code %s)" % self.p.poll())
        return json.loads(line)

    def execute(self, code, silent=False, store_history=True, user_expressions=None, timeout=600):
        return self._call(
            {
                "op": "execute",
                "code": code,
                "silent": silent,
                "store_history": store_history,
                "user_expressions": user_expressions or {},
            },
            timeout,
        )

    def close(self):
        try:
            self.p.stdin.close()
            self.p.wait(timeout=30)
        except Exception:
            self.p.kill()


def child_main():
    """--child: an IPython shell serving InprocDriver."""
    import io

    proto = os.fdopen(os.dup(1), "w")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    outputs = []

    def publish(data, metadata=None, source=None, **kw):
        outputs.append({"type": "display_data", "content": {"data": data, "metadata": metadata or {}}})

    shell.display_pub.publish = publish

    def write_format_data(format_dict, md_dict=None):
        outputs.append(
            {
                "type": "execute_result",
                "content": {"data": format_dict, "metadata": md_dict or {}, "execution_count": shell.execution_count},
            }
        )

    def showtraceback(etype, evalue, stb):
        outputs.append({"type": "error", "content": {"ename": etype.__name__, "evalue": str(evalue), "traceback": stb}})

    shell.displayhook.write_output_prompt = lambda: None
    shell.displayhook.write_format_data = write_format_data
    shell._showtraceback = showtraceback
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "ping":
            proto.write(json.dumps({"ok": True}) + "\n")
            proto.flush()
            continue
        del outputs[:]
        buf = io.StringIO()
        old = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = buf
        try:
            res = shell.run_cell(req["code"], store_history=req["store_history"], silent=req["silent"])
            ue = shell.user_expressions(req["user_expressions"]) if res.success else {}
        finally:
            sys.stdout, sys.stderr = old
        outs = list(outputs)
        if buf.getvalue():
            outs.insert(0, {"type": "stream", "content": {"name": "stdout", "text": buf.getvalue()}})
        reply = {"status": "ok" if res.success else "error", "user_expressions": ue, "execution_count": res.execution_count}
        if not res.success:
            err = res.error_in_exec or res.error_before_exec
            reply.update(ename=type(err).__name__, evalue=str(err))
        proto.write(json.dumps({"reply": reply, "outputs": outs}, default=repr) + "\n")
        proto.flush()


# ---------------------------------------------------------------------------
# Measurements


def nvml_mib(pid):
    """The driver's figure for pid in MiB (0 when the process has no GPU
    entry), or None without nvidia-smi."""
    try:
        rows = smi_rows("--query-compute-apps=pid,used_memory", timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):  # no nvidia-smi, a timeout, or its error
        return None
    total = 0
    for parts in rows:
        if len(parts) == 2 and parts[0] == str(pid):
            try:
                total += int(parts[1])
            except ValueError:
                pass
    return total


def expr_value(drv, expr, timeout=120):
    """Evaluates expr through user_expressions (no cell, no history)."""
    r = drv.execute("pass", silent=True, store_history=False, user_expressions={"v": expr}, timeout=timeout)
    v = r["reply"].get("user_expressions", {}).get("v", {})
    if v.get("status") != "ok":
        raise RuntimeError("%s: %s %s" % (expr, v.get("ename"), v.get("evalue")))
    import ast

    return ast.literal_eval(v["data"]["text/plain"])


def cell(drv, code, want_ok=True, show=False, timeout=600):
    r = drv.execute(code, timeout=timeout)
    ok = r["reply"].get("status") == "ok"
    if want_ok and not ok:
        print("---- cell failed: %r\n%s: %s" % (code, r["reply"].get("ename"), r["reply"].get("evalue")))
    if show:
        print_outputs(code, r)
    return r


def print_outputs(title, r):
    print("---- %s" % title)
    for o in r["outputs"]:
        c = o["content"]
        if o["type"] == "stream":
            print(c.get("text", ""), end="")
        elif o["type"] == "error":
            print("%s: %s" % (c.get("ename"), c.get("evalue")))
        else:
            print(c.get("data", {}).get("text/plain", ""))
    print("----", flush=True)


def gpumem_data(r):
    for o in r["outputs"]:
        d = o["content"].get("data", {}) if o["type"] in ("display_data", "execute_result") else {}
        if "application/vnd.gpumem.v1+json" in d:
            return d["application/vnd.gpumem.v1+json"]
    return None


def inject(drv, args):
    cell = inject_cell(args.gpumem)
    t0 = time.perf_counter()
    r = drv.execute(cell["code"], silent=True, store_history=False, user_expressions={"gpumem": cell["expr"]}, timeout=120)
    ms = (time.perf_counter() - t0) * 1000
    rep = r["reply"].get("user_expressions", {}).get("gpumem", {}).get("data", {}).get("application/json")
    ok = bool(rep and rep.get("ok") and rep.get("nonce") == cell["nonce"])
    check(
        ok,
        "inject",
        "%.0f ms, report %s" % (ms, rep if not ok else {k: rep[k] for k in ("ipython", "python", "frameworks_loaded")}),
    )
    return ok


def nvml_gpus(pid):
    """How many GPUs the driver lists pid on: each holds a CUDA context of
    its own (JAX opens one on every visible GPU)."""
    try:
        rows = smi_rows("--query-compute-apps=pid,gpu_uuid", timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 1
    n = sum(1 for r in rows if r[0] == str(pid))
    return max(n, 1)


def wait_nvml(pid, limit_mib, seconds):
    """Polls the driver's figure until it is <= limit_mib or seconds pass.
    Returns (last MiB, seconds waited)."""
    t0 = time.monotonic()
    while True:
        mib = nvml_mib(pid)
        waited = time.monotonic() - t0
        if mib is None or mib <= limit_mib or waited >= seconds:
            return mib, waited
        time.sleep(0.05)


# ---------------------------------------------------------------------------
# Scenarios


def leak_cells(fw, n_elems, device):
    """Cells that make the three leaks for framework fw: names a (displayed,
    then deleted), b/h (trapped in a traceback, then deleted), model
    (deleted but cached)."""
    if fw == "torch":
        return [
            "import torch, weakref, gc\nDEV = %r" % device,
            "a = torch.ones(%d, device=DEV)\nw_a = weakref.ref(a)" % n_elems,
            "a[:4]",  # a view displayed: Out holds the storage
            "a",
            "del a",
            "def step(x):\n    h = x * 2\n    w_h.append(weakref.ref(h))\n    raise RuntimeError('simulated failure in step')\n"
            "w_h = []\nb = torch.ones(%d, device=DEV)\nw_b = weakref.ref(b)\nstep(b)" % n_elems,
            "del b",
            "model = torch.nn.Linear(16384, 8192, device=DEV)\nw_model = weakref.ref(model)\ndel model",
        ]
    if fw == "cupy":
        return [
            "import cupy as cp, weakref",
            "a = cp.ones(%d, dtype=cp.float32)\nw_a = weakref.ref(a)" % n_elems,
            "a",
            "del a",
            "def step(x):\n    h = x * 2\n    w_h.append(weakref.ref(h))\n    raise RuntimeError('simulated failure in step')\n"
            "w_h = []\nb = cp.ones(%d, dtype=cp.float32)\nw_b = weakref.ref(b)\nstep(b)" % n_elems,
            "del b",
            "tmp = cp.ones(%d, dtype=cp.float32)\ndel tmp" % (n_elems // 2),
        ]
    if fw == "jax":
        return [
            "import jax, jax.numpy as jnp, weakref",
            "a = jnp.ones((%d,), dtype=jnp.float32)\nw_a = weakref.ref(a)" % n_elems,
            "a",
            "del a",
            "def step(x):\n    h = x * 2\n    w_h.append(weakref.ref(h))\n    raise RuntimeError('simulated failure in step')\n"
            "w_h = []\nb = jnp.ones((%d,), dtype=jnp.float32)\nw_b = weakref.ref(b)\nstep(b)" % n_elems,
            "del b",
        ]
    raise ValueError(fw)


FW_STATS = {
    "torch": "__import__('json').dumps({'used': __import__('torch').cuda.memory_allocated(), 'held': __import__('torch').cuda.memory_reserved()}) if __import__('torch').cuda.is_initialized() else '{\"used\": 0, \"held\": 0}'",
    "cupy": "__import__('json').dumps({'used': __import__('cupy').get_default_memory_pool().used_bytes(), 'held': __import__('cupy').get_default_memory_pool().total_bytes()})",
    "jax": "__import__('json').dumps({'used': sum((d.memory_stats() or {}).get('bytes_in_use', 0) for d in __import__('jax').local_devices()), 'held': sum((d.memory_stats() or {}).get('pool_bytes', 0) for d in __import__('jax').local_devices())})",
}
ALIVE = "__import__('json').dumps({k: (v() is not None) if callable(v) else [x() is not None for x in v] for k, v in get_ipython().user_ns.items() if k.startswith('w_')})"


def stats(drv, fw):
    return json.loads(expr_value(drv, FW_STATS[fw]))


def scenario_leaks(args, fw, env, name=None):
    name = name or fw
    print("\n==== scenario %s (%s, %s)" % (name, args.mode, json.dumps(env)), flush=True)
    gpu = args.device != "cpu"
    drv = make_driver(args, env)
    try:
        if not inject(drv, args):
            return
        n = int(args.gib * GIB) // 4  # float32 elements
        for code in leak_cells(fw, n, args.device if fw == "torch" else "cuda"):
            r = cell(drv, code, want_ok=not code.startswith("def step"), show=False)
            if code.startswith("def step") and r["reply"].get("status") != "error":
                check(False, "%s: the trap cell raised" % name)
        before = stats(drv, fw) if gpu or fw != "torch" else {"used": 0, "held": 0}
        nv_before = nvml_mib(drv.pid) if gpu else None
        result(
            "INFO",
            "%s: before free: %s in use, %s held; NVML %s MiB for pid %d"
            % (name, before["used"], before["held"], nv_before, drv.pid),
        )
        print_outputs("%gpumem", cell(drv, "%gpumem"))
        rv = cell(drv, "%gpumem vars" + ("" if gpu else " --all-devices"))
        print_outputs("%gpumem vars" + ("" if gpu else " --all-devices"), rv)
        vd = gpumem_data(rv) or {}
        hidden = [row["name"] for row in vd.get("rows", []) if row.get("hidden")]
        check(
            any(h.startswith("Out[") for h in hidden) and any("traceback" in h for h in hidden),
            "%s: %%gpumem vars shows the Out and traceback holders" % name,
            ", ".join(hidden),
        )
        line = "%gpumem free --all" + ("" if gpu else " --all-devices")
        t0 = time.monotonic()
        rf = cell(drv, line)
        free_s = time.monotonic() - t0
        print_outputs(line, rf)
        after = stats(drv, fw) if gpu or fw != "torch" else {"used": 0, "held": 0}
        alive = json.loads(expr_value(drv, ALIVE))
        dead = all((not v) if isinstance(v, bool) else not any(v) for v in alive.values())
        check(dead, "%s: every leaked object is garbage after free --all" % name, json.dumps(alive))
        check(after["used"] == 0, "%s: in use after free == 0" % name, str(after))
        if fw in ("torch", "cupy"):
            check(after["held"] == 0, "%s: reserved/held after free == 0" % name, str(after))
        if not gpu:
            result("SKIP", "%s: NVML checks (--device cpu)" % name)
            return
        contexts = nvml_gpus(drv.pid)
        limit = int(args.context_gib * 1024) * contexts
        mib, waited = wait_nvml(drv.pid, limit, 1.0)
        ok = mib is not None and mib <= limit
        expect_pool = fw == "jax" and env.get("XLA_PYTHON_CLIENT_ALLOCATOR") != "platform"
        if expect_pool:
            result(
                "INFO",
                "%s: NVML %s -> %s MiB (JAX's BFC allocator keeps its pool; free took %.2f s)" % (name, nv_before, mib, free_s),
            )
            fd = gpumem_data(rf) or {}
            check(
                any("keeps freed memory in its pool" in x for x in fd.get("notes", [])),
                "%s: free says that JAX keeps its pool" % name,
            )
        else:
            check(
                ok,
                "%s: NVML for the kernel <= %d MiB (the CUDA context on %d GPU%s) within 1 s of free"
                % (name, limit, contexts, "" if contexts == 1 else "s"),
                "%s -> %s MiB, %.2f s after a free that took %.2f s" % (nv_before, mib, waited, free_s),
            )
        print_outputs("%gpumem (after)", cell(drv, "%gpumem"))
    finally:
        drv.close()


def scenario_noinit(args):
    print("\n==== scenario noinit (%s)" % args.mode, flush=True)
    drv = make_driver(args, {})
    try:
        have = []
        for m in ("torch", "cupy", "jax"):
            r = cell(drv, "import %s" % m, want_ok=False)
            if r["reply"].get("status") == "ok":
                have.append(m)
        result("INFO", "noinit: imported %s" % ", ".join(have))
        if not inject(drv, args):
            return
        for line in (
            "%gpumem",
            "%gpumem vars",
            "%gpumem vars --all-devices",
            "%gpumem free",
            "%gpumem free --all",
            "%gpumem free --dry-run --all",
            "%%gpumem\nx = 1",
        ):
            r = cell(drv, line)
            if line == "%gpumem":
                print_outputs(line, r)
            check(r["reply"].get("status") == "ok" and gpumem_data(r) is not None, "noinit: %s runs" % line.split("\n")[0])
        mib = nvml_mib(drv.pid)
        if mib is None:
            result("SKIP", "noinit: no nvidia-smi")
        else:
            check(
                mib == 0,
                "noinit: no CUDA context created by the magics (nvidia-smi has no entry for pid %d)" % drv.pid,
                "%s MiB" % mib,
            )
        if "torch" in have:
            check(expr_value(drv, "__import__('torch').cuda.is_initialized()") is False, "noinit: torch CUDA still uninitialised")
    finally:
        drv.close()


def scenario_noimport(args):
    print("\n==== scenario noimport (%s)" % args.mode, flush=True)
    drv = make_driver(args, {})
    try:
        if not inject(drv, args):
            return
        for line in ("%gpumem", "%gpumem vars", "%gpumem free", "%gpumem free --all", "%gpumem help"):
            cell(drv, line)
        mods = expr_value(drv, "[m for m in ('torch', 'cupy', 'jax', 'tensorflow') if m in __import__('sys').modules]")
        check(mods == [], "noimport: the magics imported no framework", str(mods))
    finally:
        drv.close()


def scenario_cell(args):
    """%%gpumem on the GPU: the cell's delta and peak."""
    print("\n==== scenario cell (%s)" % args.mode, flush=True)
    drv = make_driver(args, {})
    try:
        if not inject(drv, args):
            return
        cell(drv, "import torch\nkeep = torch.ones(%d, device='cuda')" % (GIB // 4))
        r = cell(
            drv,
            "%%%%gpumem\ntmp = torch.ones(%d, device='cuda')\ny = torch.ones(%d, device='cuda')\ndel tmp\ny.sum().item()"
            % (GIB // 2, GIB // 4),
        )
        print_outputs("%%gpumem", r)
        d = gpumem_data(r) or {}
        rows = [x for x in d.get("frameworks", []) if x.get("name") == "torch"]
        ok = bool(rows) and rows[0]["after"]["used"] - rows[0]["before"]["used"] == GIB and rows[0]["peak"] >= 4 * GIB
        check(ok, "cell: %%gpumem reports +1 GiB in use and a peak of at least 4 GiB", json.dumps(rows))
        check(any(o["type"] == "execute_result" for o in r["outputs"]), "cell: %%gpumem returns the cell's value")
    finally:
        drv.close()


def scenario_jax_prealloc(args):
    """JAX with its default preallocation: %gpumem says so."""
    print("\n==== scenario jax-prealloc (%s)" % args.mode, flush=True)
    drv = make_driver(args, {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"})
    try:
        if not inject(drv, args):
            return
        cell(drv, "import jax.numpy as jnp\nz = jnp.ones((1024,))")
        r = cell(drv, "%gpumem")
        print_outputs("%gpumem", r)
        d = gpumem_data(r) or {}
        check(
            "preallocated" in (d.get("advice") or ""), "jax-prealloc: %gpumem advises about preallocation", str(d.get("advice"))
        )
    finally:
        drv.close()


def run_notebook(args, path, out):
    """Runs a notebook's code cells after injecting, writes it with outputs."""
    print("\n==== notebook %s -> %s (%s)" % (path, out, args.mode), flush=True)
    nb = json.load(open(path))
    drv = make_driver(args, {})
    try:
        if not inject(drv, args):
            return
        for c in nb["cells"]:
            if c["cell_type"] != "code":
                continue
            src = c["source"] if isinstance(c["source"], str) else "".join(c["source"])
            r = drv.execute(src, timeout=600)
            raises = "raises-exception" in c.get("metadata", {}).get("tags", [])
            check((r["reply"].get("status") == "error") == raises, "notebook cell %r ran as expected" % src.splitlines()[0][:50])
            outs = []
            for o in r["outputs"]:
                oc = o["content"]
                if o["type"] == "stream":
                    outs.append({"output_type": "stream", "name": oc.get("name", "stdout"), "text": oc.get("text", "")})
                elif o["type"] == "display_data":
                    outs.append({"output_type": "display_data", "data": oc.get("data", {}), "metadata": oc.get("metadata") or {}})
                elif o["type"] == "execute_result":
                    outs.append(
                        {
                            "output_type": "execute_result",
                            "data": oc.get("data", {}),
                            "metadata": oc.get("metadata") or {},
                            "execution_count": oc.get("execution_count"),
                        }
                    )
                elif o["type"] == "error":
                    outs.append(
                        {"output_type": "error", "ename": oc["ename"], "evalue": oc["evalue"], "traceback": oc["traceback"]}
                    )
            c["outputs"] = outs
            c["execution_count"] = r["reply"].get("execution_count")
            print_outputs(src.splitlines()[0][:60], r)
        with open(out, "w") as f:
            json.dump(nb, f, indent=1, ensure_ascii=False)
            f.write("\n")
    finally:
        drv.close()


def make_driver(args, env):
    return (InprocDriver if args.mode == "inprocess" else KernelDriver)(env)


def importable(m):
    import importlib.util

    return importlib.util.find_spec(m) is not None


def main():
    if "--child" in sys.argv:
        child_main()
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--gpumem",
        default=os.environ.get("GPUMEM_BIN", ".gpukit/gpumem"),
        help="the gpumem binary whose cell is injected (default $GPUMEM_BIN, else .gpukit/gpumem)",
    )
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu for a local smoke run")
    ap.add_argument("--mode", default="kernel", choices=("kernel", "inprocess"))
    ap.add_argument("--scenarios", default="noinit,noimport,torch,cupy,jax,jax-platform,cell,jax-prealloc")
    ap.add_argument("--gib", type=float, default=2.0, help="size of each leaked array (default 2)")
    ap.add_argument("--context-gib", type=float, default=0.6, help="NVML limit after free (default 0.6)")
    ap.add_argument("--notebook", help="also run this notebook's cells (e.g. examples/leaks.ipynb) ...")
    ap.add_argument("--notebook-out", help="... and write it with its outputs here")
    args = ap.parse_args()
    version = inject_cell(args.gpumem)["version"]
    print(
        "gpu_check: python %s, mode %s, device %s, magics %s, %s"
        % (sys.version.split()[0], args.mode, args.device, version, time.strftime("%Y-%m-%d %H:%M:%S"))
    )
    if args.mode == "kernel" and not (importable("ipykernel") and importable("jupyter_client")):
        result("FAIL", "ipykernel and jupyter_client are needed for --mode kernel (or use --mode inprocess)")
        return 1
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
        print("gpu: %s" % smi)
    except (OSError, subprocess.TimeoutExpired):
        print("gpu: no nvidia-smi")
    for sc in [s.strip() for s in args.scenarios.split(",") if s.strip()]:
        try:
            if sc == "noinit":
                if args.device == "cpu":
                    result("SKIP", "noinit (--device cpu)")
                else:
                    scenario_noinit(args)
            elif sc == "noimport":
                scenario_noimport(args)
            elif sc == "cell":
                if args.device == "cpu" or not importable("torch"):
                    result("SKIP", "cell: needs torch and a GPU")
                else:
                    scenario_cell(args)
            elif sc == "jax-prealloc":
                if args.device == "cpu" or not importable("jax"):
                    result("SKIP", "jax-prealloc: needs jax and a GPU")
                else:
                    scenario_jax_prealloc(args)
            elif sc == "torch":
                scenario_leaks(args, "torch", {}) if importable("torch") else result("SKIP", "torch: not installed")
            elif sc in ("cupy", "jax", "jax-platform"):
                mod = "cupy" if sc == "cupy" else "jax"
                if args.device == "cpu" or not importable(mod):
                    result("SKIP", "%s: %s" % (sc, "--device cpu" if args.device == "cpu" else "not installed"))
                    continue
                env = {}
                if mod == "jax":
                    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
                    if sc == "jax-platform":
                        env["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
                scenario_leaks(args, mod, env, name=sc)
            else:
                result("FAIL", "unknown scenario %s" % sc)
        except Exception as e:
            result("FAIL", "%s: %s: %s" % (sc, type(e).__name__, e))
    if args.notebook:
        try:
            run_notebook(args, args.notebook, args.notebook_out or args.notebook + ".out.ipynb")
        except Exception as e:
            result("FAIL", "notebook: %s: %s" % (type(e).__name__, e))
    fails = [n for s, n in RESULTS if s == "FAIL"]
    print("\n%d passed, %d failed" % (sum(1 for s, _ in RESULTS if s == "PASS"), len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
