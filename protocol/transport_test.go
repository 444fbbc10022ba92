package protocol

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/google/uuid"
)

func greeting() []byte {
	g := make([]byte, zmtpGreetingLen)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	return g
}

func frameBytes(flags byte, body []byte) []byte {
	if len(body) > 255 {
		var hdr [9]byte
		hdr[0] = flags | flagLong
		binary.BigEndian.PutUint64(hdr[1:], uint64(len(body)))
		return append(hdr[:], body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

func testGuard() *guardConfig {
	return &guardConfig{maxFrameBytes: 1000, maxFrames: 4, maxMessageBytes: 2000}
}

func TestZMTPScanner(t *testing.T) {
	ready := frameBytes(flagCommand, []byte("\x05READY"))
	huge := []byte{flagLong, 0x40, 0, 0, 0, 0, 0, 0, 0} // 2^62 bytes
	tests := []struct {
		name     string
		stream   []byte
		wantErr  bool
		commands int
	}{
		{"greeting and ready", append(greeting(), ready...), false, 1},
		{"message", bytes.Join([][]byte{greeting(), ready, frameBytes(flagMore, []byte("a")), frameBytes(0, make([]byte, 300))}, nil), false, 1},
		{"empty frames", bytes.Join([][]byte{greeting(), ready, frameBytes(flagMore, nil), frameBytes(0, nil)}, nil), false, 1},
		{"huge frame", bytes.Join([][]byte{greeting(), ready, huge}, nil), true, 1},
		{"huge command", bytes.Join([][]byte{greeting(), {flagCommand | flagLong, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}, nil), true, 0},
		{"frame just over", bytes.Join([][]byte{greeting(), ready, {flagLong, 0, 0, 0, 0, 0, 0, 0x03, 0xe9}}, nil), true, 1},
		{"too many frames", bytes.Join([][]byte{greeting(), ready, frameBytes(flagMore, nil), frameBytes(flagMore, nil), frameBytes(flagMore, nil), frameBytes(flagMore, nil), frameBytes(flagMore, nil)}, nil), true, 1},
		{"message too large", bytes.Join([][]byte{greeting(), ready, frameBytes(flagMore, make([]byte, 900)), frameBytes(flagMore, make([]byte, 900)), frameBytes(0, make([]byte, 900))}, nil), true, 1},
		{"frame counts reset per message", bytes.Join([][]byte{greeting(), ready,
			frameBytes(flagMore, nil), frameBytes(flagMore, nil), frameBytes(flagMore, nil), frameBytes(0, nil),
			frameBytes(flagMore, nil), frameBytes(flagMore, nil), frameBytes(flagMore, nil), frameBytes(0, nil)}, nil), false, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Byte at a time and all at once must agree.
			for _, step := range []int{1, 7, len(tc.stream)} {
				s := newZMTPScanner(testGuard())
				var err error
				for i := 0; i < len(tc.stream) && err == nil; i += step {
					err = s.feed(tc.stream[i:min(i+step, len(tc.stream))])
				}
				if (err != nil) != tc.wantErr {
					t.Fatalf("step %d: err %v, want error %v", step, err, tc.wantErr)
				}
				if err != nil && !errors.Is(err, ErrFrameTooLarge) {
					t.Fatalf("error %v does not wrap ErrFrameTooLarge", err)
				}
				if s.commands != tc.commands {
					t.Fatalf("step %d: %d commands, want %d", step, s.commands, tc.commands)
				}
			}
		})
	}
}

func FuzzZMTPScanner(f *testing.F) {
	f.Add(append(greeting(), frameBytes(flagCommand, []byte("\x05READY"))...))
	f.Add([]byte{flagLong, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := newZMTPScanner(testGuard())
		_ = s.feed(data) // must not panic
	})
}

// TestGuardedConnWithholdsHugeHeader: the read that completes an oversized
// frame header fails, so zmq4 never sees the length (and never allocates).
func TestGuardedConnWithholdsHugeHeader(t *testing.T) {
	client, server := net.Pipe()
	defer server.Close()
	g := newGuardedConn(context.Background(), client, testGuard())
	defer g.Close()
	stream := bytes.Join([][]byte{greeting(), frameBytes(flagCommand, []byte("\x05READY")), {flagLong, 0x40, 0, 0, 0, 0, 0, 0, 0}}, nil)
	go func() { _, _ = server.Write(stream) }()
	var got []byte
	buf := make([]byte, 5)
	var err error
	for err == nil {
		var n int
		n, err = g.Read(buf)
		got = append(got, buf[:n]...)
	}
	var ne net.Error
	if !errors.Is(err, ErrFrameTooLarge) || !errors.As(err, &ne) || ne.Timeout() {
		t.Fatalf("err %v: want a non-timeout net.Error wrapping ErrFrameTooLarge", err)
	}
	if len(got) >= len(stream) {
		t.Fatalf("the whole oversized header was delivered (%d bytes)", len(got))
	}
	if !g.handshakeDone.Load() {
		t.Fatal("handshake not marked done after READY")
	}
}

// TestGuardedConnClosesOnContext: a handshake stuck on a silent peer ends
// when the socket's context does.
func TestGuardedConnClosesOnContext(t *testing.T) {
	client, server := net.Pipe()
	defer server.Close()
	ctx, cancel := context.WithCancel(context.Background())
	g := newGuardedConn(ctx, client, testGuard())
	done := make(chan error, 1)
	go func() {
		_, err := g.Read(make([]byte, 1))
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("read succeeded on a closed conn")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("read still blocked after the context ended")
	}
}

// A context already done closes the connection at once, on the context's
// goroutine, while newGuardedConn is still setting up (the race detector
// saw Close read stopAfter as it was assigned); Close after it is harmless.
func TestGuardedConnOnAContextAlreadyDone(t *testing.T) {
	for range 200 {
		client, server := net.Pipe()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		g := newGuardedConn(ctx, client, testGuard())
		if _, err := g.Read(make([]byte, 1)); err == nil {
			t.Fatal("read succeeded on a conn whose context was done")
		}
		_ = g.Close()
		server.Close()
	}
}

// fakeKernel listens on four ports and speaks ZMTP as a kernel's sockets
// would, with behaviour chosen per test: it is how hostile kernels are
// simulated (real kernels are used everywhere else).
type fakeKernel struct {
	info      ConnectionInfo
	listeners []net.Listener
	wg        sync.WaitGroup
	// onControl runs for each message received on control.
	onControl func(conn net.Conn, zc *zmq4.Conn, msg zmq4.Msg)
	// onIOPub runs once for each connection to iopub.
	onIOPub func(zc *zmq4.Conn)
}

func startFakeKernel(t *testing.T, onControl func(net.Conn, *zmq4.Conn, zmq4.Msg)) *fakeKernel {
	t.Helper()
	fk := &fakeKernel{onControl: onControl}
	ports := make([]int, 4)
	types := []zmq4.SocketType{zmq4.Router, zmq4.Router, zmq4.Pub, zmq4.Router}
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		fk.listeners = append(fk.listeners, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
		fk.wg.Add(1)
		go fk.serve(l, types[i], i == 1)
	}
	fk.info = ConnectionInfo{Transport: "tcp", IP: "127.0.0.1", ShellPort: ports[0], ControlPort: ports[1],
		IOPubPort: ports[2], HBPort: ports[3], Key: "k", SignatureScheme: "hmac-sha256"}
	t.Cleanup(fk.close)
	return fk
}

func (fk *fakeKernel) serve(l net.Listener, typ zmq4.SocketType, control bool) {
	defer fk.wg.Done()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		conns = append(conns, conn)
		fk.wg.Add(1)
		go func() {
			defer fk.wg.Done()
			zc, err := zmq4.Open(conn, null.Security(), typ, zmq4.SocketIdentity("fake"), true, nil)
			if err != nil {
				return
			}
			if typ == zmq4.Pub && fk.onIOPub != nil {
				fk.onIOPub(zc)
			}
			for {
				msg, err := zc.RecvMsg()
				if err != nil {
					return
				}
				switch {
				case typ == zmq4.Router && !control && len(msg.Frames) == 2 && string(msg.Frames[1]) == "ping":
					_ = zc.SendMsg(msg) // heartbeat echo (REQ envelope included)
				case control && fk.onControl != nil && msg.Type == zmq4.UsrMsg:
					fk.onControl(conn, zc, msg)
				}
			}
		}()
	}
}

func (fk *fakeKernel) close() {
	for _, l := range fk.listeners {
		l.Close()
	}
}

// TestHostileKernelHugeFrame: a peer that announces a 2^62-byte frame makes
// the attach fail promptly instead of crashing the process.
func TestHostileKernelHugeFrame(t *testing.T) {
	fk := startFakeKernel(t, func(conn net.Conn, zc *zmq4.Conn, msg zmq4.Msg) {
		_, _ = conn.Write([]byte{flagLong, 0x40, 0, 0, 0, 0, 0, 0, 0})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	c, err := DialInfo(ctx, fk.info, Options{})
	if err == nil {
		c.Close()
		t.Fatal("attach succeeded")
	}
	if !errors.Is(err, ErrConnectionLost) || !strings.Contains(err.Error(), "frame") {
		t.Fatalf("error %v: want connection lost over an oversized frame", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v", d)
	}
}

// TestHostileKernelGarbageReplies: replies that are malformed, unsigned or
// badly signed are dropped; the request ends at its deadline.
func TestHostileKernelGarbageReplies(t *testing.T) {
	key := []byte("k")
	replies := func(parent []byte) [][][]byte {
		hdr := `{"msg_id":"r","msg_type":"kernel_info_reply","session":"s"}`
		sig := Sign(key, []byte(hdr), parent, []byte("{}"), []byte("{}"))
		return [][][]byte{
			{[]byte("garbage")},
			{[]byte(Delimiter)},
			{[]byte(Delimiter), []byte(sig), []byte(hdr), parent, []byte("{}")},                                   // truncated
			{[]byte(Delimiter), []byte(strings.Repeat("0", 64)), []byte(hdr), parent, []byte("{}"), []byte("{}")}, // bad signature
			{[]byte(Delimiter), nil, []byte(hdr), parent, []byte("{}"), []byte("{}")},                             // unsigned
			{[]byte(Delimiter), []byte(Sign(key, []byte("[]"), parent, []byte("{}"), []byte("{}"))), []byte("[]"), parent, []byte("{}"), []byte("{}")},
		}
	}
	fk := startFakeKernel(t, func(conn net.Conn, zc *zmq4.Conn, msg zmq4.Msg) {
		// msg: [identity?, <IDS|MSG>, sig, header, parent, metadata, content]
		var parent []byte
		for i, f := range msg.Frames {
			if string(f) == Delimiter && i+2 < len(msg.Frames) {
				parent = msg.Frames[i+2]
			}
		}
		for _, r := range replies(parent) {
			_ = zc.SendMsg(zmq4.NewMsgFrom(r...))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 1*time.Second)
	defer cancel()
	start := time.Now()
	c, err := DialInfo(ctx, fk.info, Options{})
	if err == nil {
		c.Close()
		t.Fatal("attach succeeded on garbage")
	}
	if !errors.Is(err, ErrNoReply) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v: want ErrNoReply at the deadline", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v", d)
	}
	t.Logf("error: %v", err)
}

func TestDialInfoValidates(t *testing.T) {
	for _, ci := range []ConnectionInfo{
		{},
		{Transport: "udp", IP: "127.0.0.1", ShellPort: 1, IOPubPort: 2, ControlPort: 3, HBPort: 4},
		{Transport: "tcp", IP: "127.0.0.1", ShellPort: 0, IOPubPort: 2, ControlPort: 3, HBPort: 4},
		{Transport: "tcp", IP: "127.0.0.1", ShellPort: 1, IOPubPort: 2, ControlPort: 3, HBPort: 4, SignatureScheme: "hmac-md5"},
	} {
		if c, err := DialInfo(context.Background(), ci, Options{}); err == nil {
			c.Close()
			t.Errorf("DialInfo accepted %+v", ci)
		}
	}
}

// TestDialRefused: nothing listens; the attach fails at once with a dial
// error, not at the deadline.
func TestDialRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ci := ConnectionInfo{Transport: "tcp", IP: "127.0.0.1", ShellPort: port, IOPubPort: port, ControlPort: port, HBPort: port}
	start := time.Now()
	_, err = DialInfo(context.Background(), ci, Options{})
	if err == nil || !isRefused(err) || !strings.Contains(err.Error(), strconv.Itoa(port)) {
		t.Fatalf("got %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("took %v", d)
	}
}

// replyKernelInfo answers a control request with a signed kernel_info_reply.
func replyKernelInfo(zc *zmq4.Conn, msg zmq4.Msg, key []byte) {
	var ids [][]byte
	var parent []byte
	for i, f := range msg.Frames {
		if string(f) == Delimiter {
			ids = msg.Frames[:i]
			if i+2 < len(msg.Frames) {
				parent = msg.Frames[i+2]
			}
			break
		}
	}
	hdr := []byte(`{"msg_id":"` + uuid.NewString() + `","msg_type":"kernel_info_reply","session":"s","username":"k","date":"","version":"5.3"}`)
	content := []byte(`{"status":"ok","protocol_version":"5.3","implementation":"fake","language_info":{"name":"python"}}`)
	sig := Sign(key, hdr, parent, []byte("{}"), content)
	frames := append(append([][]byte{}, ids...), []byte(Delimiter), []byte(sig), hdr, parent, []byte("{}"), content)
	_ = zc.SendMsg(zmq4.NewMsgFrom(frames...))
}

// TestHostileKernelIOPubFlood: iopub, where the client reads only status
// messages, takes frames of 64 KiB at most: a kernel publishing a 1 MiB
// message is disconnected before the message is buffered, though its
// shell and control replies are well formed. The fake kernel publishes as
// soon as the client subscribes, which may be before its kernel_info reply
// arrives: then the attach itself fails, over the same limit.
func TestHostileKernelIOPubFlood(t *testing.T) {
	key := []byte("k")
	fk := startFakeKernel(t, func(conn net.Conn, zc *zmq4.Conn, msg zmq4.Msg) { replyKernelInfo(zc, msg, key) })
	big := make([]byte, 1<<20)
	fk.onIOPub = func(zc *zmq4.Conn) {
		_ = zc.SendMsg(zmq4.NewMsgFrom([]byte("kernel.x.execute_result"), []byte(Delimiter), []byte("sig"), big))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := DialInfo(ctx, fk.info, Options{HeartbeatInterval: time.Hour})
	if err != nil {
		if !strings.Contains(err.Error(), "frame, limit 65536") {
			t.Fatalf("attach: %v", err)
		}
		return
	}
	defer c.Close()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev := <-c.Events():
			if ev.Kind == EventDisconnected && ev.Err != nil && strings.Contains(ev.Err.Error(), "frame, limit 65536") {
				return
			}
		case <-deadline:
			t.Fatal("no disconnect over the 1 MiB iopub frame")
		}
	}
}

// A port that accepts but never speaks (a SIGSTOPped kernel: its sockets
// listen, nothing answers) fails the handshake at its deadline, and the
// error says what that means rather than zmq4's bare "i/o timeout".
func TestHandshakeTimeoutSaysSo(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c
		}
	}()
	cfg := newGuardConfig(Limits{}, 200*time.Millisecond, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = openZMTP(ctx, cfg, "tcp", l.Addr().String(), zmq4.Dealer)
	if err == nil {
		t.Fatal("a silent peer completed the handshake")
	}
	if c := <-accepted; c != nil {
		c.Close()
	}
	if !strings.Contains(err.Error(), "did not answer ZMTP's handshake within its 200ms deadline") {
		t.Errorf("error %q does not say the kernel missed the handshake deadline", err)
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("error %q does not wrap the timeout", err)
	}
	if ctx.Err() != nil {
		t.Error("the handshake outlived its deadline")
	}
}
