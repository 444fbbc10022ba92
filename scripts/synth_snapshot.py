"""Writes a synthetic PyTorch CUDA memory snapshot: the pickle
torch.cuda.memory._dump_snapshot writes, shaped as torch builds it (frame
dicts shared between stacks, as py_symbolize dedups them, a new frames list
per trace entry, segments with blocks, one device's trace of alloc,
free_requested/free_completed, segment_alloc and an oom at the end), for the
reducer's tests and benchmarks where no GPU is.

    python3 scripts/synth_snapshot.py OUT.pickle [ENTRIES] [--seed N]

The last alloc of each 1,000 comes from the line `marker.py:42` (the stack
the checks look for among the top ones), and holds the most bytes live.
"""

import argparse
import pickle
import random


def build(entries, seed=1):
    rnd = random.Random(seed)
    frames = [{"filename": "/src/pkg/mod%d.py" % (i % 300), "line": i, "name": "fn%d" % i} for i in range(3000)]
    cpp = [{"filename": "/pytorch/c10/cuda/CUDACachingAllocator.cpp", "line": 100 + i, "name": "malloc"} for i in range(5)]
    torch_frame = {"filename": "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py", "line": 116, "name": "forward"}
    marker = {"filename": "/tmp/ipykernel_1/marker.py", "line": 42, "name": "<module>"}
    stacks = [cpp[:2] + [frames[rnd.randrange(3000)] for _ in range(rnd.randint(8, 24))] for _ in range(4000)]
    marker_stack = cpp[:2] + [torch_frame, marker] + frames[:6]
    trace, live = [], []
    t, addr, base = 0, 0x7F0000000000, 0x7E0000000000
    trace.append({"action": "segment_alloc", "addr": base, "size": 1 << 34, "stream": 0, "time_us": 0, "frames": list(stacks[0])})
    while len(trace) < entries - 1:
        t += rnd.randint(1, 50)
        if live and rnd.random() < 0.48:
            a, sz, st = live.pop(rnd.randrange(len(live)))
            trace.append({"action": "free_requested", "addr": a, "size": sz, "stream": 0, "time_us": t, "frames": list(st)})
            trace.append({"action": "free_completed", "addr": a, "size": sz, "stream": 0, "time_us": t, "frames": list(st)})
        else:
            big = len(trace) % 1000 == 999
            sz = (256 << 20) if big else rnd.choice([512, 4096, 1 << 20, 4 << 20])
            st = marker_stack if big else stacks[rnd.randrange(len(stacks))]
            addr += sz
            trace.append({"action": "alloc", "addr": addr, "size": sz, "stream": 0, "time_us": t, "frames": list(st)})
            if not big:
                live.append((addr, sz, st))
    trace = trace[: entries - 1]
    trace.append(
        {"action": "oom", "device_free": 1 << 20, "size": 20 << 30, "stream": 0, "time_us": t + 1, "frames": list(marker_stack)}
    )
    segs = []
    for k in range(64):
        seg_addr = base + k * (64 << 20)
        blocks = []
        for j in range(16):
            state = "active_allocated" if j % 3 else "inactive"
            st = marker_stack if j == 1 else stacks[rnd.randrange(4000)]
            blocks.append(
                {
                    "address": seg_addr + j * (4 << 20),
                    "size": 4 << 20,
                    "requested_size": 4 << 20,
                    "state": state,
                    "frames": list(st) if state != "inactive" else [],
                }
            )
        segs.append(
            {
                "device": 0,
                "address": seg_addr,
                "total_size": 64 << 20,
                "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
                "active_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
                "requested_size": 0,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            }
        )
    return {
        "segments": segs,
        "device_traces": [trace],
        "allocator_settings": {"expandable_segments": False, "max_split_size": -1},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("entries", nargs="?", type=int, default=900_000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    with open(a.out, "wb") as f:
        pickle.dump(build(a.entries, a.seed), f)


if __name__ == "__main__":
    main()
