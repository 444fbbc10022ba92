// Package oom owns what gpumem says about a GPU out-of-memory error raised
// in a kernel: which GPU it hit, who held that GPU at the daemon's last
// sample (every other notebook and process, with user and bytes), the one
// line of advice that fits, and the headline JupyterLab shows. The daemon
// computes it once, here, from its report and the figures the kernel sent;
// the kernel's report, `gpumem ls --json`, the API and JupyterLab only
// render it.
//
// It is pure: no I/O, no clock but the one it is given. What the kernel
// sends is untrusted text: Request.Clean bounds and strips it before
// anything else reads it. The GPU's holders are the finished report's
// (attribution.Finish ranks them; Assess ranks nothing), and a user sees
// them as the report's own view shows them (Event.For): other users as one
// holder each, their total, never a path, kernel id, pid or command.
package oom

import (
	"fmt"
	"strings"

	"github.com/gpumem/gpumem/internal/textsafe"
)

// Frameworks the kernel may name, as its report names them.
var Frameworks = map[string]string{"torch": "PyTorch", "cupy": "CuPy", "jax": "JAX", "tensorflow": "TensorFlow"}

// Request is what a kernel sends when one of its cells raised a GPU
// out-of-memory error: the error as it recognised it, what it asked for,
// and what the kernel itself holds. Every field is the kernel's word.
type Request struct {
	Framework string `json:"framework"` // a key of Frameworks
	Error     string `json:"error"`     // the exception's class, module-qualified
	Message   string `json:"message"`   // its first line, shortened
	// RequestedBytes is the allocation that failed, parsed from the
	// message; 0 when the message does not say.
	RequestedBytes uint64 `json:"requested_bytes"`
	Device         Device `json:"device"`
	Cell           Cell   `json:"cell"`
	Kernel         Kernel `json:"kernel"`
}

// Device is how the kernel names the GPU: the framework's ordinal (which
// CUDA_VISIBLE_DEVICES renumbers), the device's UUID when the framework
// tells it, and CUDA_VISIBLE_DEVICES as the kernel sees it.
type Device struct {
	Ordinal        *int    `json:"ordinal,omitempty"`
	UUID           string  `json:"uuid,omitempty"`
	VisibleDevices *string `json:"visible_devices,omitempty"`
}

// Cell is where the error was raised: the cell's execution count and the
// line in it.
type Cell struct {
	ExecutionCount int    `json:"execution_count,omitempty"`
	Line           int    `json:"line,omitempty"`
	Source         string `json:"source,omitempty"`
}

// Kernel is what the kernel holds on that GPU, in its framework's terms.
type Kernel struct {
	// AllocatedBytes is what live tensors hold; ReservedBytes what the
	// framework's caching allocator holds (allocated + cached).
	AllocatedBytes uint64 `json:"allocated_bytes"`
	ReservedBytes  uint64 `json:"reserved_bytes"`
	// Cached memory, split: ReleasableBytes are whole free segments
	// (empty_cache returns them), FragmentedBytes free pieces of segments
	// that also hold live blocks (only freeing those blocks returns them).
	ReleasableBytes uint64 `json:"releasable_bytes"`
	FragmentedBytes uint64 `json:"fragmented_bytes"`
	// CachedBytes is what the cache holds beyond live tensors (reserved
	// less allocated): Assess sets it, once, for every face; what a kernel
	// sends here is not read.
	CachedBytes uint64 `json:"cached_bytes"`
	// IPythonBytes is GPU memory that only IPython's own references hold
	// (Out, _, saved tracebacks, this error's traceback included), named by
	// IPythonRefs; TracebackBytes is the part saved tracebacks hold.
	IPythonBytes   uint64   `json:"ipython_bytes"`
	IPythonRefs    []string `json:"ipython_refs,omitempty"`
	TracebackBytes uint64   `json:"traceback_bytes"`
	// Variables are the user variables holding GPU memory, largest first
	// (VariablesTruncated: there are more than listed).
	Variables          []Holding `json:"variables,omitempty"`
	VariablesTruncated bool      `json:"variables_truncated,omitempty"`
	// ExpandableSegments: PyTorch's allocator already runs with
	// expandable_segments:True (then fragmentation advice is moot).
	ExpandableSegments bool `json:"expandable_segments,omitempty"`
}

// Holding is one variable (or other holder) and the GPU memory it holds.
type Holding struct {
	Name  string `json:"name"`
	Bytes uint64 `json:"bytes"`
}

// Bounds on what a kernel may send.
const (
	MaxRequestBody = 64 << 10
	maxMessage     = 500
	maxSource      = 200
	maxError       = 120
	maxName        = 80
	maxRefs        = 16
	maxVariables   = 32
)

// Clean checks r and bounds its text: a framework gpumem knows, each
// text one line cut to its bound in bytes on a rune boundary, control
// characters and invalid UTF-8 escaped (textsafe), counts capped. The error names what is wrong.
func (r *Request) Clean() error {
	if _, ok := Frameworks[r.Framework]; !ok {
		return fmt.Errorf("unknown framework %q: want one of torch, cupy, jax, tensorflow", r.Framework)
	}
	if r.Device.Ordinal != nil && (*r.Device.Ordinal < 0 || *r.Device.Ordinal > 1024) {
		return fmt.Errorf("device ordinal %d is out of range", *r.Device.Ordinal)
	}
	r.Error = cleanText(r.Error, maxError)
	r.Message = cleanText(r.Message, maxMessage)
	r.Device.UUID = cleanText(r.Device.UUID, maxName)
	if r.Device.VisibleDevices != nil {
		v := cleanText(*r.Device.VisibleDevices, maxMessage)
		r.Device.VisibleDevices = &v
	}
	r.Cell.Source = cleanText(r.Cell.Source, maxSource)
	if r.Cell.Line < 0 || r.Cell.ExecutionCount < 0 {
		return fmt.Errorf("cell %d line %d: negative", r.Cell.ExecutionCount, r.Cell.Line)
	}
	if len(r.Kernel.IPythonRefs) > maxRefs {
		r.Kernel.IPythonRefs = r.Kernel.IPythonRefs[:maxRefs]
	}
	for i, s := range r.Kernel.IPythonRefs {
		r.Kernel.IPythonRefs[i] = cleanText(s, maxName)
	}
	if len(r.Kernel.Variables) > maxVariables {
		r.Kernel.Variables, r.Kernel.VariablesTruncated = r.Kernel.Variables[:maxVariables], true
	}
	for i := range r.Kernel.Variables {
		r.Kernel.Variables[i].Name = cleanText(r.Kernel.Variables[i].Name, maxName)
	}
	return nil
}

// cleanText is s as one line of at most n bytes, as the one sanitiser
// (textsafe) makes text others control safe to show: runs of whitespace
// (a message's newlines) become one space, control and bidirectional
// characters and invalid UTF-8 visible escapes, cut on a rune boundary.
func cleanText(s string, n int) string {
	return textsafe.Cut(textsafe.Line(strings.Join(strings.Fields(s), " ")), n)
}
