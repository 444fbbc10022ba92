"""The allocator's pure parts: the last OOM's figures, the fragmentation
finding, the advice."""

import sys

import pytest

from gpumem_magics import allocator

OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which 1.50 GiB is free. "
    "Including non-PyTorch memory, this process has 138.30 GiB memory in use. Of the allocated memory 132.00 GiB is "
    "allocated by PyTorch, and 4.00 GiB is reserved by PyTorch but unallocated."
)
G = 1 << 30


class Shell(object):
    last_execution_result = None


@pytest.fixture
def oom():
    saved = sys.__dict__.get("last_value")
    sys.last_value = RuntimeError(OOM)
    try:
        yield
    finally:
        sys.last_value = saved


def test_last_oom(oom):
    got = allocator.last_oom(Shell())
    assert got["request"] == 2 * G and got["device"] == "cuda:0"
    assert got["gpu_free"] == int(1.5 * G) and got["reserved_unallocated"] == 4 * G


def test_no_oom():
    saved = sys.__dict__.get("last_value")
    sys.last_value = ValueError("boom")
    try:
        assert allocator.last_oom(Shell()) is None
    finally:
        sys.last_value = saved


def dev(**kw):
    d = {"device": "cuda:0", "releasable": 0, "fragmented": 0, "largest_free_block": 0}
    d.update(kw)
    return d


@pytest.mark.parametrize(
    "devices, oom, case",
    [
        # The OOM asked 2 GiB: 4 GiB of holes of 1 GiB and 1.5 GiB on the GPU.
        ([dev(fragmented=4 * G, largest_free_block=G)], {"request": 2 * G, "device": "cuda:0", "gpu_free": int(1.5 * G)}, "oom"),
        # A request larger than all the free memory is not fragmentation.
        ([dev(fragmented=G // 8, largest_free_block=G // 16)], {"request": 8 * G, "device": "cuda:0", "gpu_free": G // 4}, None),
        # The cache mostly fragmented, no OOM.
        ([dev(fragmented=3 * G, releasable=G, largest_free_block=64 << 20)], None, "cache"),
        # Mostly releasable: empty_cache returns it, no advice.
        ([dev(fragmented=G, releasable=3 * G)], None, None),
        # Small: not worth advice.
        ([dev(fragmented=100 << 20)], None, None),
        # Expandable segments already on: nothing to advise.
        ([dev(fragmented=3 * G, expandable=True)], None, None),
    ],
)
def test_fragmentation(devices, oom, case):
    got = allocator.fragmentation(devices, oom)
    assert (got or {}).get("case") == case, got
    if case == "oom":
        assert got["largest_free_block"] < got["request"] <= got["free"]


def test_expandable_advice_names_both_ways():
    text = "\n".join(allocator.expandable_advice())
    assert "kernel.json" in text and "%env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in text


def test_round_block():
    assert [allocator.round_block(n) for n in (0, 1, 512, 513, 4000)] == [0, 512, 512, 1024, 4096]
