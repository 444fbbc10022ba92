"""The simulated-GPU file (GPUMEM_FAKE_GPU) for gpumem's Python tests.

The Python twin of simgpu.go: both write testdata/simulated-gpu.json from the
same devices (the Go test TestSimulatedGPUGolden runs this file and compares),
so the file's format changes in one place and a lagging writer fails. Standard
library only: the labextension's and the wheels' tests import it by path.
"""

import json
import os
import sys

GiB = 1 << 30


def sim_uuid(index):
    """The uuid every harness gives the simulated host's device index."""
    return "GPU-00000000-0000-0000-0000-%012d" % index


def proc(pid, used_bytes, sm_percent=0, memory_percent=0):
    """One process on a simulated GPU; percentages play one that computes."""
    p = {"pid": pid, "used_bytes": used_bytes}
    if sm_percent:
        p["sm_percent"] = sm_percent
    if memory_percent:
        p["memory_percent"] = memory_percent
    return p


def gpu(total_bytes, processes=(), name="", uuid="", utilization_unknown=False):
    """One device; empty name and uuid are nvml's defaults; utilization_unknown
    plays a GPU that cannot say how much its processes compute."""
    g = {}
    if name:
        g["name"] = name
    if uuid:
        g["uuid"] = uuid
    g["memory_total_bytes"] = total_bytes
    if utilization_unknown:
        g["process_utilization"] = False
    g["processes"] = [dict(p) for p in processes]
    return g


def document(gpus):
    """The file's text listing gpus in order (a GPU's index is its position),
    byte for byte what the Go writer gives."""
    return json.dumps({"gpus": list(gpus)}, separators=(",", ":"))


def write(path, gpus):
    """Writes the file atomically: a daemon re-reads it every sample."""
    path = str(path)
    with open(path + ".tmp", "w") as f:
        f.write(document(gpus))
    os.replace(path + ".tmp", path)


def golden():
    """The devices of testdata/simulated-gpu.json (simgpu_test.go has the same)."""
    return [
        gpu(
            80 * GiB,
            [proc(4242, GiB, sm_percent=97, memory_percent=12), proc(4243, 2 * GiB)],
            name="Simulated H200",
            uuid=sim_uuid(0),
        ),
        gpu(96 * GiB, [proc(4244, 3 * GiB)], name="Simulated GH200", uuid="GPU-1", utilization_unknown=True),
        gpu(141 * GiB),
    ]


if __name__ == "__main__":
    sys.stdout.write(document(golden()))
