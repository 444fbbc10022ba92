// Command fakekernel serves many cheap fake Jupyter kernels from one
// process, for the daemon's scale benchmarks: a thousand real ipykernel
// processes would need some 50 GiB of memory, a thousand of these under
// 1 GiB.
//
// Each file named with -f gets a kernel of its own: its own five ports on
// 127.0.0.1, its own key, and a connection file written there (0600) once
// the ports are bound. A kernel answers the heartbeat (echo), kernel_info on
// shell and control, and execute_request with a plausible reply: the
// magics' bootstrap gets the report it asks for (an ok injection), any
// other code an ok reply; busy and idle go out on iopub around each request
// as ipykernel sends them. It counts what it received, by channel and
// message type, into the -record file at exit (and on SIGUSR1).
//
// gpumem proves a kernel by the process that owns the shell port, runs as
// the file's owner, and names the file in its argv or holds it open. This
// process names every file in its argv (-f FILE, as ipykernel is passed
// its file) and also holds each one open: both proofs the daemon uses hold
// for every kernel it serves, at the cost of one argv read per process.
//
// With -workers N it starts N worker processes (sleep, in its session and
// process group, as a kernel's DataLoader workers are): a kernel's tree as
// real hosts have it. Run one kernel a process (as real kernels run) with
// GOMAXPROCS=1, a process costs about 1 MiB of private memory (RssAnon;
// VmRSS about 6 MiB, most of it the binary's pages, shared by all).
//
// On SIGTERM or SIGINT it deletes its connection files (as a kernel's
// shutdown does), ends its workers and exits.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/gpumem/gpumem/protocol"
)

type files []string

func (f *files) String() string     { return strings.Join(*f, ",") }
func (f *files) Set(v string) error { *f = append(*f, v); return nil }

func main() {
	var conns files
	record := flag.String("record", "", "write what each kernel received to this JSON file at exit and on SIGUSR1")
	flag.Var(&conns, "f", "a connection file to write and serve (repeat)")
	workers := flag.Int("workers", 0, "worker processes to start (sleep), ended at exit")
	flag.Parse()
	if len(conns) == 0 {
		fmt.Fprintln(os.Stderr, "fakekernel: no -f FILE given")
		os.Exit(2)
	}
	// zmq4 logs every peer that leaves before its handshake ends (the
	// daemon closing a connection it has no use for): noise, by thousands.
	log.SetOutput(io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	var kernels []*kernel
	for _, path := range conns {
		k, err := start(ctx, path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "fakekernel: %s: %v\n", path, err)
			for _, k := range kernels {
				k.stop()
			}
			os.Exit(1)
		}
		kernels = append(kernels, k)
	}
	var procs []*exec.Cmd
	for range *workers {
		w := exec.Command("sleep", "1000000")
		if err := w.Start(); err != nil {
			fmt.Fprintf(os.Stderr, "fakekernel: worker: %v\n", err)
			os.Exit(1)
		}
		procs = append(procs, w)
	}
	fmt.Println("ready")

	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1)
	for s := range sig {
		if s == syscall.SIGUSR1 {
			writeRecord(*record, kernels)
			continue
		}
		break
	}
	// The files go first, as a kernel's shutdown deletes its file: closing
	// zmq4 sockets can wait on a peer, and a stop must be prompt.
	for _, k := range kernels {
		k.removeFile()
	}
	for _, w := range procs {
		_ = w.Process.Kill() // our child, not yet waited for: its pid is still its own
		_ = w.Wait()
	}
	cancel()
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for _, k := range kernels {
			k.stop()
		}
	}()
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		fmt.Fprintln(os.Stderr, "fakekernel: sockets not closed within 2 s; exiting")
	}
	writeRecord(*record, kernels)
}

// kernel is one fake kernel.
type kernel struct {
	path     string
	key      []byte
	ident    string // the iopub topic's <ident>
	file     *os.File
	fileOnce sync.Once
	stdin    net.Listener

	shell, control, iopub, hb zmq4.Socket
	pubMu                     sync.Mutex // PUB sockets are not for concurrent senders
	wg                        sync.WaitGroup

	mu       sync.Mutex
	received map[string]int // "channel/msg_type" → count
}

func start(ctx context.Context, path string) (*kernel, error) {
	k := &kernel{path: path, key: []byte(randomHex(16)), ident: randomHex(8), received: map[string]int{}}
	k.shell = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity(k.ident)))
	k.control = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity(k.ident)))
	k.iopub = zmq4.NewPub(ctx)
	k.hb = zmq4.NewRep(ctx)
	ports := map[string]int{}
	for name, s := range map[string]zmq4.Socket{"shell_port": k.shell, "control_port": k.control, "iopub_port": k.iopub, "hb_port": k.hb} {
		if err := s.Listen("tcp://127.0.0.1:0"); err != nil {
			k.stop()
			return nil, fmt.Errorf("listen %s: %w", name, err)
		}
		ports[name] = s.Addr().(*net.TCPAddr).Port
	}
	// Nothing of gpumem's dials stdin; a bound port keeps the file honest.
	var err error
	if k.stdin, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		k.stop()
		return nil, fmt.Errorf("listen stdin: %w", err)
	}
	ports["stdin_port"] = k.stdin.Addr().(*net.TCPAddr).Port
	doc := map[string]any{"transport": "tcp", "ip": "127.0.0.1", "key": string(k.key),
		"signature_scheme": "hmac-sha256", "kernel_name": "python3"}
	for name, p := range ports {
		doc[name] = p
	}
	data, _ := json.Marshal(doc)
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		k.stop()
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		k.stop()
		return nil, err
	}
	if k.file, err = os.Open(path); err != nil {
		k.stop()
		return nil, err
	}
	k.wg.Add(3)
	go k.serve(k.shell, "shell")
	go k.serve(k.control, "control")
	go k.heartbeat()
	return k, nil
}

// stop closes the sockets, waits for their loops, and deletes the file.
func (k *kernel) stop() {
	for _, s := range []zmq4.Socket{k.shell, k.control, k.iopub, k.hb} {
		if s != nil {
			s.Close()
		}
	}
	if k.stdin != nil {
		k.stdin.Close()
	}
	k.wg.Wait()
	k.removeFile()
}

// removeFile closes and deletes the connection file (once).
func (k *kernel) removeFile() {
	k.fileOnce.Do(func() {
		if k.file != nil {
			k.file.Close()
			os.Remove(k.path)
		}
	})
}

func (k *kernel) count(what string) {
	k.mu.Lock()
	k.received[what]++
	k.mu.Unlock()
}

func (k *kernel) heartbeat() {
	defer k.wg.Done()
	for {
		msg, err := k.hb.Recv()
		if err != nil {
			return
		}
		k.count("hb/ping")
		if err := k.hb.Send(msg); err != nil {
			return
		}
	}
}

// serve answers requests on a shell or control ROUTER until it closes.
func (k *kernel) serve(s zmq4.Socket, channel string) {
	defer k.wg.Done()
	for {
		zm, err := s.Recv()
		if err != nil {
			return
		}
		req, err := protocol.Decode(zm.Frames, k.key, protocol.Limits{})
		if err != nil {
			k.count(channel + "/undecodable")
			continue
		}
		k.count(channel + "/" + req.Header.MsgType)
		k.status(req.Header, "busy")
		var content any
		switch req.Header.MsgType {
		case "kernel_info_request":
			content = kernelInfo
		case "execute_request":
			content = k.execute(req.Content)
		case "shutdown_request":
			content = map[string]any{"status": "ok", "restart": false}
		default:
			content = map[string]any{"status": "error", "ename": "NotImplemented",
				"evalue": "fakekernel does not answer " + req.Header.MsgType, "traceback": []string{}}
		}
		k.reply(s, req, strings.TrimSuffix(req.Header.MsgType, "_request")+"_reply", content)
		k.status(req.Header, "idle")
	}
}

var kernelInfo = map[string]any{
	"status": "ok", "protocol_version": protocol.Version, "implementation": "ipython",
	"implementation_version": "8.12.0", "banner": "fakekernel",
	"language_info": map[string]any{"name": "python", "version": "3.11.2", "mimetype": "text/x-python",
		"file_extension": ".py"},
}

// reportExpr is the user expression by which the magics' bootstrap hands
// its report back; its nonce must come back in the report.
var reportExpr = regexp.MustCompile(`_gpumem_report_([0-9a-f]+)`)

func (k *kernel) execute(raw json.RawMessage) map[string]any {
	var req struct {
		Code            string            `json:"code"`
		UserExpressions map[string]string `json:"user_expressions"`
	}
	_ = json.Unmarshal(raw, &req)
	exprs := map[string]any{}
	for name, expr := range req.UserExpressions {
		if m := reportExpr.FindStringSubmatch(expr); m != nil {
			exprs[name] = map[string]any{"status": "ok", "metadata": map[string]any{},
				"data": map[string]any{"text/plain": "<report>", "application/json": map[string]any{
					"kind": "report", "nonce": m[1], "ok": true, "python": "3.11.2", "ipython": "8.12.0",
					"frameworks_loaded": []string{}}}}
			continue
		}
		exprs[name] = map[string]any{"status": "ok", "metadata": map[string]any{},
			"data": map[string]any{"text/plain": "None"}}
	}
	return map[string]any{"status": "ok", "execution_count": 0, "user_expressions": exprs, "payload": []any{}}
}

func (k *kernel) reply(s zmq4.Socket, req *protocol.Message, msgType string, content any) {
	body, _ := json.Marshal(content)
	frames, err := protocol.Encode(&protocol.Message{Identities: req.Identities,
		Header: protocol.NewHeader(msgType, k.ident, "fakekernel"), Parent: req.Header, Content: body}, k.key)
	if err == nil {
		_ = s.SendMulti(zmq4.NewMsgFrom(frames...))
	}
}

func (k *kernel) status(parent protocol.Header, state string) {
	body, _ := json.Marshal(map[string]string{"execution_state": state})
	frames, err := protocol.Encode(&protocol.Message{Identities: [][]byte{[]byte("kernel." + k.ident + ".status")},
		Header: protocol.NewHeader("status", k.ident, "fakekernel"), Parent: parent, Content: body}, k.key)
	if err != nil {
		return
	}
	k.pubMu.Lock()
	_ = k.iopub.SendMulti(zmq4.NewMsgFrom(frames...))
	k.pubMu.Unlock()
}

// record is what one kernel received.
type record struct {
	ConnectionFile string         `json:"connection_file"`
	Received       map[string]int `json:"received"`
}

func writeRecord(path string, kernels []*kernel) {
	if path == "" {
		return
	}
	var out []record
	for _, k := range kernels {
		k.mu.Lock()
		r := record{ConnectionFile: k.path, Received: map[string]int{}}
		for what, n := range k.received {
			r.Received[what] = n
		}
		k.mu.Unlock()
		out = append(out, r)
	}
	data, _ := json.MarshalIndent(out, "", " ")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err == nil {
		_ = os.Rename(tmp, path)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
