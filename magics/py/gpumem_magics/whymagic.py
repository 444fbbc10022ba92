"""The notebook's side of %gpumem why and %gpumem free --children: the
kernel's own data, joined by gpumem serve (in Go) with the driver's
per-process figures when it runs, then rendered here."""

from . import daemon, state, why, workers

NO_SIDECAR_CHILDREN = (
    "Ending the GPU processes that are left needs gpumem serve (it ends only processes of this kernel's "
    "recorded tree, never the kernel): run `gpumem serve`, then `gpumem attach` this kernel."
)


def line(cmd, args):
    """The data dict of `%gpumem why ARGS` or `%gpumem free --children`."""
    if cmd == "why":
        try:
            opts = why.parse_args(args)
        except ValueError as e:
            return {"kind": "error", "message": str(e)}
        data = why.why_data(**opts)
        if data.get("kind") != "why":
            return data
        return daemon.why_join(data)
    try:
        pids = parse_children_args(args)
    except ValueError as e:
        return {"kind": "error", "message": str(e)}
    if pids:
        return confirmed_children_data(pids)
    return children_data()


def parse_children_args(args):
    """The pids of `free --children [--pid N,...]` (repeatable), [] for
    none; ValueError says what is wrong."""
    pids, i = [], 0
    while i < len(args):
        a = args[i]
        if a == "--children":
            i += 1
            continue
        if a == "--pid" or a.startswith("--pid="):
            value = a[len("--pid=") :] if a.startswith("--pid=") else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if a.startswith("--pid=") else 2
            for f in value.split(","):
                if not f.isdigit() or int(f) <= 0:
                    raise ValueError("free --children --pid: %r is not a process id" % f)
                if int(f) not in pids:
                    pids.append(int(f))
            continue
        raise ValueError("free --children takes only --pid N,... (got %s)" % a)
    return pids


def teardown_data():
    """The frameworks' teardown of the workers, as a children data dict."""
    td = workers.teardown()
    return {
        "kind": "children",
        "schema": state.SCHEMA,
        "teardown": td["ran"],
        "teardown_errors": td["errors"],
        "known": td["known"],
    }


def _merge_reply(data, rep):
    """Puts gpumem serve's reply to a free --children into data (what it
    ended and left, its figures and notes), or its error, or that there is
    no sidecar; False when there is nothing more to add."""
    if rep is None:
        data["notes"] = [NO_SIDECAR_CHILDREN]
        return False
    if rep.get("error"):
        data["error"] = rep["error"]
        return False
    for k in ("ended", "left", "returned_bytes", "before", "after", "notes"):
        if k in rep:
            data[k] = rep[k]
    return True


def confirmed_children_data(pids):
    """free --children --pid: gpumem serve ends those workers of this
    kernel, computing or not, and only them; no teardown runs (it would end
    every worker it knows)."""
    data = {"kind": "children", "schema": state.SCHEMA, "teardown": [], "teardown_errors": [], "confirmed": pids}
    if not _merge_reply(data, daemon.free_children(pids=pids)):
        return data
    known = workers.describe(workers.scan_handles())
    for p in (data.get("ended") or []) + (data.get("left") or []):
        if not p.get("what") and p.get("pid") in known:
            p["what"] = known[p.get("pid")]
    return data


def children_data():
    # gpumem serve reads the figures first: a sample of its own between
    # the teardown and the request would miss the workers the teardown
    # ended. Without them, the free still runs, on its last sample.
    before, before_err = daemon.children_before()
    busy = [p for p in (before or {}).get("left_running") or [] if isinstance(p, int)]
    if busy:
        # The teardown ends every worker it knows, computing or not.
        data = {"kind": "children", "schema": state.SCHEMA, "teardown": [], "teardown_errors": []}
        data["known"] = {str(k): v for k, v in workers.describe(workers.scan_handles()).items()}
        skipped = [
            "the frameworks' teardown was not run: it ends every worker it knows, and pid %s is left running for what it computes"
            % ", ".join(str(p) for p in busy)
        ]
    else:
        data, skipped = teardown_data(), []
    if not _merge_reply(data, daemon.free_children()):
        return data
    data["notes"] = skipped + list(data.get("notes") or [])
    if before_err:
        data["notes"] = list(data.get("notes") or []) + [
            "the figures before the teardown could not be read (%s): the driver's figure before is gpumem serve's last sample"
            % before_err
        ]
    known = data.get("known") or {}
    for p in (data.get("ended") or []) + (data.get("left") or []):
        if not p.get("what") and str(p.get("pid")) in known:
            p["what"] = known[str(p.get("pid"))]
    return data
