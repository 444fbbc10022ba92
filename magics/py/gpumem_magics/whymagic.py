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
    rest = [a for a in args if a != "--children"]
    if rest:
        return {"kind": "error", "message": "free --children takes no other argument (got %s)" % " ".join(rest)}
    return children_data()


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


def children_data():
    # gpumem serve reads the figures first: a sample of its own between
    # the teardown and the request would miss the workers the teardown
    # ended. Without them, the free still runs, on its last sample.
    before_err = daemon.children_before()
    data = teardown_data()
    rep = daemon.free_children()
    if rep is None:
        data["notes"] = [NO_SIDECAR_CHILDREN]
        return data
    if rep.get("error"):
        data["error"] = rep["error"]
        return data
    for k in ("ended", "left", "returned_bytes", "before", "after", "notes"):
        if k in rep:
            data[k] = rep[k]
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
