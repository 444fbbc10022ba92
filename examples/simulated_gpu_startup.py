# The demo's simulated GPU, followed by the kernel itself: `gpumem demo`
# (which bash scripts/run.sh runs) writes this file into the demo's IPython
# startup dir, and without an NVIDIA driver every kernel of the demo's
# notebook (GPUMEM_DEMO_NOTEBOOK, matched against the end of
# JPY_SESSION_NAME; every kernel when unset) runs it when it starts. The
# kernel writes its own pid into the simulated-GPU file (GPUMEM_DEMO_GPU)
# holding GPUMEM_DEMO_BYTES, and drops the pids of processes that are gone,
# as a real driver frees an exited process's memory; at exit it takes its
# own out. So a restart from the panel shows the new kernel's pid, never a
# dead one. Nothing is left in the notebook's namespace.


def _gpumem_demo_gpu():
    import atexit
    import fcntl
    import json
    import os

    path = os.environ.get("GPUMEM_DEMO_GPU", "")
    if not path or not os.environ.get("JPY_SESSION_NAME", "").endswith(os.environ.get("GPUMEM_DEMO_NOTEBOOK", "")):
        return
    held = int(os.environ.get("GPUMEM_DEMO_BYTES", str(3 << 30)))
    me = os.getpid()

    def write(claim):
        with open(path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with open(path) as f:
                data = json.load(f)
            gpu = data["gpus"][0]
            keep = [p for p in gpu.get("processes", []) if p["pid"] != me and os.path.exists("/proc/%d" % p["pid"])]
            if claim:
                keep.append({"pid": me, "used_bytes": held})
            gpu["processes"] = keep
            with open(path + ".tmp", "w") as f:
                json.dump(data, f)
            os.replace(path + ".tmp", path)

    write(True)
    atexit.register(write, False)


try:
    _gpumem_demo_gpu()
finally:
    del _gpumem_demo_gpu
