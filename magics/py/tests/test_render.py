import xml.dom.minidom

import pytest

from gpumem_magics import render


def well_formed(html):
    xml.dom.minidom.parseString("<root>" + html + "</root>")


def test_unknown_kind_is_an_error():
    text, html = render.render({"kind": "nope"})
    assert text == "gpumem: error: unknown report kind 'nope'"
    well_formed(html)


def test_summary_without_frameworks():
    text, html = render.render({"kind": "summary", "pid": 7, "frameworks": []})
    assert text.splitlines()[0] == "gpumem: GPU memory of this kernel (pid 7)"
    assert "No GPU framework (PyTorch, CuPy, JAX, TensorFlow) is loaded in this kernel." in text
    well_formed(html)


def test_summary_rows_and_driver():
    data = {
        "kind": "summary",
        "pid": 1,
        "frameworks": [
            {
                "name": "torch",
                "label": "PyTorch",
                "devices": [{"device": "cuda:0", "used": 1 << 30, "held": 3 << 30, "total": 8 << 30}],
            }
        ],
        "driver": {"bytes": 4 << 30, "per_gpu": [{"index": 0, "bytes": 4 << 30}], "pids": [1, 2]},
    }
    text, html = render.render(data)
    assert "cuda:0  PyTorch    1.0 GiB  2.0 GiB  3.0 GiB" in text
    assert "driver (NVML, via gpumem serve): 4.0 GiB for this kernel (GPU 0: 4.0 GiB); pids 1, 2" in text
    well_formed(html)


@pytest.mark.parametrize(
    "data, title",
    [
        ({"kind": "free", "dry_run": True}, "gpumem free --dry-run: nothing was freed"),
        ({"kind": "free", "cache_only": True}, "gpumem free: emptied the caches; no variable was touched"),
        ({"kind": "free"}, "gpumem free"),
    ],
)
def test_free_titles(data, title):
    text, html = render.render(data)
    assert text.splitlines()[0] == title
    well_formed(html)


def test_free_report():
    data = {
        "kind": "free",
        "deleted": [
            {"name": "a", "type": "Tensor", "device": "cuda:0", "bytes": 1 << 20},
            {"name": "b", "type": "Tensor", "device": "cuda:0", "bytes": 2048, "alive": True, "held_by": ["c"]},
        ],
        "hidden": [{"ref": "Out[3]", "what": "output cache", "action": "drop"}],
        "frameworks": [
            {
                "name": "torch",
                "label": "PyTorch",
                "device": "cuda:0",
                "before": {"used": 3 << 20, "held": 8 << 20},
                "after": {"used": 0, "held": 0},
            },
        ],
        "driver": {"before": 1 << 30, "after": 1 << 29},
        "notes": ["a note"],
        "elapsed_ms": 12,
    }
    text, html = render.render(data)
    lines = text.splitlines()
    assert "  a     Tensor  cuda:0  1.0 MiB  freed" in lines
    assert "  b     Tensor  cuda:0  2.0 KiB  still referenced by c" in lines
    assert "  dropped Out[3] (output cache)" in lines
    assert "PyTorch    cuda:0  3.0 MiB / 8.0 MiB       0 B / 0 B              8.0 MiB" in lines
    assert "driver (NVML): 1.0 GiB -> 512.0 MiB for this kernel (-512.0 MiB)" in lines
    assert lines[-2:] == ["a note", "took 12 ms"]
    well_formed(html)


def test_free_error():
    text, _ = render.render({"kind": "free", "error": "no variable named x; nothing was deleted"})
    assert text == "gpumem free\n\nerror: no variable named x; nothing was deleted"


def test_html_escapes_user_names():
    data = {"kind": "vars", "rows": [{"name": "<script>", "type": "Tensor", "device": "cuda:0", "bytes": 10}], "total_bytes": 10}
    text, html = render.render(data)
    assert "<script>" in text
    assert "<script>" not in html and "&lt;script&gt;" in html
    well_formed(html)
