"""The out-of-memory report's pure parts: recognising each framework's error
without importing it, parsing the request from its message, and the
rendering of the report (the daemon's holders and advice as sent)."""

import types
import xml.dom.minidom

import pytest

from gpumem_magics import oom, render

GiB = 1 << 30


def well_formed(html):
    xml.dom.minidom.parseString("<root>" + html + "</root>")


def error_class(module, name, base=Exception):
    """A class named and placed as the framework's own is."""
    return type(name, (base,), {"__module__": module})


TORCH_2 = (
    "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 139.72 GiB of which 1.23 GiB is free. "
    "Process 4242 has 100.00 GiB memory in use. Of the allocated memory 37.90 GiB is allocated by PyTorch, and 12.50 MiB "
    "is reserved by PyTorch but unallocated."
)
TORCH_1 = (
    "CUDA out of memory. Tried to allocate 512.00 MiB (GPU 1; 15.78 GiB total capacity; 14.56 GiB already allocated; "
    "12.75 MiB free; 14.58 GiB reserved in total by PyTorch)"
)
CUPY = "Out of memory allocating 1,073,741,824 bytes (allocated so far: 2,147,483,648 bytes)."
JAX_BFC = "RESOURCE_EXHAUSTED: Failed to allocate request for 16.00GiB (17179869184B) on device ordinal 0"
JAX_PLAIN = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8589934592 bytes."
TF_SHAPE = (
    "OOM when allocating tensor with shape[1024,1024,256] and type float on /job:localhost/replica:0/task:0/device:GPU:1 "
    "by allocator GPU_1_bfc [Op:RandomUniform]"
)
TF_ROUNDED = "Allocator (GPU_0_bfc) ran out of memory trying to allocate 16.00GiB (rounded to 17179869184) requested by op X"


@pytest.mark.parametrize(
    "module, name, base, message, framework",
    [
        ("torch", "OutOfMemoryError", RuntimeError, TORCH_2, "torch"),
        ("torch.cuda", "OutOfMemoryError", RuntimeError, TORCH_1, "torch"),
        ("cupy.cuda.memory", "OutOfMemoryError", MemoryError, CUPY, "cupy"),
        ("cupy_backends.cuda.api.runtime", "OutOfMemoryError", MemoryError, CUPY, "cupy"),
        ("jaxlib.xla_extension", "XlaRuntimeError", RuntimeError, JAX_BFC, "jax"),
        ("jax.errors", "JaxRuntimeError", RuntimeError, JAX_PLAIN, "jax"),
        ("tensorflow.python.framework.errors_impl", "ResourceExhaustedError", Exception, TF_SHAPE, "tensorflow"),
        ("builtins", "RuntimeError", RuntimeError, TORCH_1, "torch"),  # PyTorch before 1.13
    ],
)
def test_classify(module, name, base, message, framework):
    cls = base if module == "builtins" else error_class(module, name, base)
    e = cls(message)
    found = oom.classify(e)
    assert found is not None
    assert found[0] is e and found[1] == framework
    assert found[2] == "%s.%s" % (module, name)


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("CUDA out of memory. Tried to allocate 1 GiB"),  # not a RuntimeError
        error_class("mylib", "OutOfMemoryError", RuntimeError)("out of memory"),  # not a framework's
        error_class("jaxlib.xla_extension", "XlaRuntimeError", RuntimeError)("INVALID_ARGUMENT: shapes"),
        error_class("tensorflow.python.framework.errors_impl", "InvalidArgumentError")("OOM when allocating"),
        MemoryError("host memory"),
        KeyboardInterrupt(),
    ],
)
def test_classify_rejects(exc):
    assert oom.classify(exc) is None


def test_classify_follows_the_chain():
    inner = error_class("torch", "OutOfMemoryError", RuntimeError)(TORCH_2)
    try:
        try:
            raise inner
        except RuntimeError as e:
            raise ValueError("training failed") from e
    except ValueError as outer:
        found = oom.classify(outer)
    assert found[0] is inner and found[1] == "torch"


def test_a_subclass_is_recognised():
    base = error_class("torch", "OutOfMemoryError", RuntimeError)
    sub = type("MyOOM", (base,), {"__module__": "mytrainer"})
    assert oom.classify(sub(TORCH_2))[1] == "torch"


@pytest.mark.parametrize(
    "framework, message, want_bytes, want_device",
    [
        ("torch", TORCH_2, 20 * GiB, 0),
        ("torch", TORCH_1, 512 << 20, 1),
        ("torch", "CUDA out of memory. Tried to allocate 512 bytes (GPU 0; ...)", 512, 0),
        ("torch", "CUDA out of memory. Tried to allocate 1.50 KiB", 1536, None),
        ("cupy", CUPY, 1 << 30, None),
        ("jax", JAX_BFC, 16 * GiB, 0),
        ("jax", JAX_PLAIN, 8 * GiB, None),
        ("tensorflow", TF_SHAPE, 1024 * 1024 * 256 * 4, 1),
        ("tensorflow", TF_ROUNDED, 16 * GiB, None),
        ("torch", "CUDA out of memory.", None, None),
    ],
)
def test_parse_request(framework, message, want_bytes, want_device):
    assert oom.parse_request(framework, message) == {"bytes": want_bytes, "device": want_device}


def event(**kw):
    ev = {
        "seq": 3,
        "gpu": {
            "index": 0,
            "name": "Simulated H200",
            "total_bytes": 80 * GiB,
            "used_bytes": 79 * GiB,
            "free_bytes": GiB,
            "simulated": True,
        },
        "holders": [
            {
                "kind": "notebook",
                "name": "/home/a/hold.ipynb",
                "user": "a",
                "bytes": 40 * GiB,
                "pids": [20, 21],
                "state": "idle",
                "idle_seconds": 200,
            },
            {"kind": "user", "name": "user b", "user": "b", "bytes": 25 * GiB, "notebooks": 1},
            {"kind": "notebook", "name": "this kernel", "self": True, "user": "a", "bytes": 10 * GiB, "pids": [10]},
        ],
        "advice": "hold.ipynb (yours, idle 3 min) holds 40.0 GiB of GPU 0: `gpumem free hold.ipynb --all` frees it",
        "view": "own",
    }
    ev.update(kw)
    return ev


def report(**kw):
    data = {
        "kind": "oom",
        "label": "PyTorch",
        "request": {
            "framework": "torch",
            "error": "torch.OutOfMemoryError",
            "requested_bytes": 20 * GiB,
            "device": {"ordinal": 0},
            "cell": {"execution_count": 7, "line": 3, "source": "y = model(x)"},
            "kernel": {
                "allocated_bytes": 8 * GiB,
                "reserved_bytes": 10 * GiB,
                "releasable_bytes": GiB,
                "fragmented_bytes": GiB,
                "ipython_bytes": 2 * GiB,
                "ipython_refs": ["Out[5]", "OutOfMemoryError traceback: forward() locals"],
                "traceback_bytes": GiB,
                "variables": [{"name": "model", "bytes": 6 * GiB}],
            },
        },
        "event": event(),
    }
    # The event carries the kernel's figures as gpumem serve cleaned them,
    # and the cache's, which it computes.
    data["event"]["kernel"] = dict(data["request"]["kernel"], cached_bytes=2 * GiB)
    data.update(kw)
    return data


def test_render_report():
    text, html = render.render(report())
    lines = text.splitlines()
    assert lines[0] == "gpumem: out of memory in cell [7], line 3: y = model(x)"
    for want in [
        "asked for 20.0 GiB on cuda:0 (torch.OutOfMemoryError)",
        "8.0 GiB allocated by PyTorch; cached 2.0 GiB (releasable 1.0 GiB, fragmented 1.0 GiB)",
        "held only by IPython: 2.0 GiB: Out[5], OutOfMemoryError traceback: forward() locals "
        "(1.0 GiB of it in saved tracebacks, this one's included)",
        "top holders: model 6.0 GiB",
        "GPU 0 (Simulated H200, simulated): 80.0 GiB total, 79.0 GiB used, 1.0 GiB free",
        "advice: hold.ipynb (yours, idle 3 min) holds 40.0 GiB of GPU 0: `gpumem free hold.ipynb --all` frees it",
        "gpumem serve runs in shared mode: other users are shown as one holder each, their total.",
    ]:
        assert want in text, want
    rows = [ln.split() for ln in lines if ln.startswith("  ")]
    assert ["/home/a/hold.ipynb", "a", "40.0", "GiB", "idle", "3", "min", "20", "s", "20,21"] in rows
    assert ["user", "b", "b", "25.0", "GiB"] in rows
    assert ["this", "kernel", "a", "10.0", "GiB", "10"] in rows
    well_formed(html)
    assert "&lt;" not in html or "<script" not in html


def test_render_escapes_kernel_text():
    data = report()
    data["request"]["cell"]["source"] = "<script>alert(1)</script>"
    _text, html = render.render(data)
    assert "<script>" not in html and "&lt;script&gt;" in html
    well_formed(html)


def test_render_without_daemon():
    data = report(event=None, no_daemon=True)
    data["request"]["kernel"].update(device_total_bytes=80 * GiB, device_free_bytes=GiB, cached_bytes=3 * GiB)
    text, html = render.render(data)
    assert "gpumem serve is not running: this is what the kernel alone knows." in text
    # Alone, the kernel's own figures: the cache's as kernel_figures measured it.
    assert "8.0 GiB allocated by PyTorch; cached 3.0 GiB (releasable 1.0 GiB, fragmented 1.0 GiB)" in text
    assert "the driver says: 80.0 GiB total, 1.0 GiB free" in text
    assert "advice:" not in text and "hold.ipynb" not in text
    well_formed(html)


def test_render_daemon_error_and_unknown_request():
    data = report(event=None, daemon_error="gpumem serve answered 403: pid 1 is not a process of a kernel")
    data["request"].update(requested_bytes=0, cell={})
    data["request"]["kernel"].update(ipython_bytes=0, variables=[])
    text, _html = render.render(data)
    assert text.splitlines()[0] == "gpumem: out of memory"
    assert "asked for an unknown amount on cuda:0" in text
    assert "gpumem serve answered 403" in text
    assert "nothing on a GPU (the traceback pins no GPU memory)" in text


def test_hook_fast_path_reads_one_attribute():
    # A result whose error_in_exec is None: nothing else is touched.
    class Probe:
        error_in_exec = None

        def __getattr__(self, name):  # any other attribute read fails the test
            raise AssertionError("read %s" % name)

    assert oom.oom_hook(Probe()) is None
    assert oom.oom_hook(types.SimpleNamespace(error_in_exec=None)) is None
    assert oom.oom_hook(None) is None
