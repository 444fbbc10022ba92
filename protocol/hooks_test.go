package protocol

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestDialAndReadHooks: with Options.ReadConnectionFile and Options.Dial
// (how a kernel inside a pod is reached) the client reads the file and
// opens every socket only through them: the path it is given means
// nothing to it by itself.
func TestDialAndReadHooks(t *testing.T) {
	k := testenv.StartKernel(t, t.TempDir())
	const name = "pod:some-pod/abc:/runtime/kernel-x.json"
	var mu sync.Mutex
	var reads []string
	var dials []string
	opts := Options{
		ReadConnectionFile: func(path string) (ConnectionInfo, error) {
			mu.Lock()
			reads = append(reads, path)
			mu.Unlock()
			return ReadConnectionFile(k.ConnectionFile)
		},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if _, ok := ctx.Deadline(); !ok {
				return nil, errors.New("dial without a deadline")
			}
			mu.Lock()
			dials = append(dials, network+" "+addr)
			mu.Unlock()
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}
	c := attach(t, name, opts)
	waitEvent(t, c, EventConnected, time.Second)
	if _, err := c.KernelInfo(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("kernel_info through the hooks: %v", err)
	}
	info := c.Info()
	mu.Lock()
	if len(reads) == 0 || slices.ContainsFunc(reads, func(p string) bool { return p != name }) {
		t.Errorf("reads %q: want the given name only", reads)
	}
	for _, port := range []int{info.HBPort, info.ControlPort, info.ShellPort, info.IOPubPort} {
		want := "tcp " + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if !slices.Contains(dials, want) {
			t.Errorf("dials %q lack %q", dials, want)
		}
	}
	mu.Unlock()

	refused := errors.New("no way into that namespace")
	_, err := Dial(ctxFor(t, 10*time.Second), name, Options{
		ReadConnectionFile: opts.ReadConnectionFile,
		Dial: func(context.Context, string, string) (net.Conn, error) {
			return nil, refused
		},
	})
	if !errors.Is(err, refused) {
		t.Errorf("Dial with a failing dial hook: %v, want it to wrap %v", err, refused)
	}
}
