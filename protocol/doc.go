// Package protocol speaks the Jupyter messaging protocol (v5.3, as ipykernel 6
// speaks it) as a client of running kernels, over ZeroMQ (go-zeromq/zmq4).
//
// It owns connection files, the wire format (frames, HMAC-SHA256 signing,
// length-checked decoding) and Client, which attaches to a kernel beside the
// user's frontend: shell and control DEALER sockets, an iopub SUB socket
// filtered to the kernel's own status topic, and a heartbeat REQ socket.
//
// It imports zmq4, uuid and the standard library only. It returns errors and
// never logs.
package protocol
