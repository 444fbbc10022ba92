// Package protocol speaks the Jupyter messaging protocol (v5.3, as ipykernel 6
// speaks it) as a client of running kernels, over ZeroMQ (go-zeromq/zmq4).
//
// It owns connection files, the wire format (frames, HMAC-SHA256 signing,
// length-checked decoding) and Client, which attaches to a kernel beside the
// user's frontend: shell and control DEALER sockets, an iopub SUB
// connection filtered to the kernel's own status topic, and a heartbeat REQ
// socket.
//
// The parts, one file each:
//   - connfile.go: ReadConnectionFile / ParseConnectionInfo, pure and strict.
//   - message.go: Encode / Decode / Sign, pure; hostile input is an error.
//   - transport.go: the transports zmq4 dials through, which bound frame
//     sizes, handshakes and writes (zmq4 trusts its peer); iopub is one bare
//     zmq4 ZMTP connection over the same guard, without a zmq4 socket.
//   - client.go: Options, Dial, Client and its accessors, the request
//     round trip.
//   - generation.go: one generation of sockets: dialing them (a lean
//     client's shell and control per request), their reply readers,
//     closing them.
//   - supervise.go: the supervisor, heartbeat, reconnection with backoff,
//     events.
//   - iopub.go: the iopub reader (status topic only, execution state).
//   - requests.go: KernelInfo, Execute, Interrupt, Usage. Execute sends the
//     code it is given: what the code does to the kernel's state (IPython
//     overwrites sys.last_* even for silent requests) is the caller's
//     business; gpumem's own code is wrapped by package magics.
//
// Life of a Client: Dial connects every socket and waits for kernel_info
// (EventConnected). The supervisor goroutine reads iopub; one reader
// goroutine per shell or control socket drains it until it is closed; a
// heartbeat goroutine pings. EOF on any socket or a missed beat fails the
// generation of sockets: Alive turns false, EventDisconnected is sent,
// every socket is closed and the supervisor rebuilds them all with backoff,
// re-reading the connection file. When nothing listens, EventDead
// is sent once. A successful attach reports EventRestarted when the kernel's
// session id changed and EventReconnected when not. A lean client (for a
// daemon following many kernels) keeps only iopub connected: shell and
// control are dialed per request and closed when idle, and there is no
// heartbeat, so iopub's EOF is what fails a generation; with OnEvent taking
// its events, an idle lean client costs one goroutine. The client stops
// (EventClosed) when the connection file is deleted or Close is called;
// Close waits for every goroutine.
//
// It imports zmq4, uuid and the standard library only. It returns errors and
// never logs.
package protocol
