# A Jupyter frontend for gpumem's tests, driven over stdin/stdout with one
# JSON object a line. It is what a notebook does to a kernel: execute_request
# on shell (store_history as asked), collect that request's iopub outputs
# until the kernel goes idle for it.
#
# argv: connection file. Requests:
#   {"op": "execute", "code": str, "silent": bool, "store_history": bool,
#    "user_expressions": {}, "stop_on_error": bool, "timeout": seconds}
#   {"op": "kernel_info", "timeout": seconds}
# Answers: {"ok": true, "reply": <reply content>, "outputs": [{"type", "content"}]}
#   or {"ok": false, "error": str}. Every wait has a deadline.
import json
import queue
import sys
import time

from jupyter_client import BlockingKernelClient


def main():
    # A kernel just started may not answer its heartbeat yet, and
    # wait_for_ready then says "Kernel died": retry with a fresh client
    # until the deadline.
    deadline = time.monotonic() + 60
    while True:
        kc = BlockingKernelClient(connection_file=sys.argv[1])
        kc.load_connection_file()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=max(1.0, deadline - time.monotonic()))
            break
        except Exception as e:  # noqa: BLE001
            kc.stop_channels()
            if time.monotonic() > deadline:
                print(json.dumps({"ok": False, "error": "kernel not ready: %s" % e}), flush=True)
                return
            time.sleep(0.1)
    print(json.dumps({"ok": True, "ready": True}), flush=True)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            out = handle(kc, req)
        except Exception as e:  # noqa: BLE001
            out = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
        print(json.dumps(out, default=repr), flush=True)
    kc.stop_channels()


def handle(kc, req):
    timeout = float(req.get("timeout", 60))
    deadline = time.monotonic() + timeout
    if req["op"] == "kernel_info":
        msg_id = kc.kernel_info()
        reply = wait_reply(kc.get_shell_msg, msg_id, deadline)
        return {"ok": True, "reply": reply["content"], "header": reply["header"]}
    if req["op"] == "execute":
        msg_id = kc.execute(
            req["code"],
            silent=bool(req.get("silent", False)),
            store_history=bool(req.get("store_history", True)),
            user_expressions=req.get("user_expressions") or {},
            allow_stdin=False,
            stop_on_error=bool(req.get("stop_on_error", True)),
        )
        reply = wait_reply(kc.get_shell_msg, msg_id, deadline)
        outputs = []
        while True:
            msg = next_msg(kc.get_iopub_msg, deadline)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            t = msg["msg_type"]
            if t == "status" and msg["content"].get("execution_state") == "idle":
                break
            if t in ("stream", "display_data", "execute_result", "error", "update_display_data"):
                outputs.append({"type": t, "content": msg["content"]})
        return {"ok": True, "reply": reply["content"], "outputs": outputs}
    raise ValueError("unknown op %r" % req["op"])


def next_msg(get, deadline):
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("no message before the deadline") from None
    try:
        return get(timeout=left)
    except queue.Empty:
        raise TimeoutError("no message before the deadline") from None


def wait_reply(get, msg_id, deadline):
    while True:
        msg = next_msg(get, deadline)
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg


if __name__ == "__main__":
    main()
