// Package driver opens the GPUs of this machine: through the NVIDIA driver
// (go-nvml, which needs cgo), or the simulated-GPU file when GPUMEM_FAKE_GPU
// names one, or nothing when there is no driver. It is the only package of
// gpumem that imports go-nvml; what it reads becomes package nvml's values.
//
// It converts nvml.Return codes into errors once, here, with %w, so callers
// can still use errors.Is(err, gonvml.ERROR_NOT_SUPPORTED). It never calls
// NVML after a failed Init (that aborts the process), and probes newer
// symbols before use.
package driver

import (
	"fmt"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpumem/gpumem/nvml"
)

// Library is an NVML: gonvml.New()'s, or go-nvml's mocks. Callers that
// choose one (a benchmark's daemon over a mock) name it without importing
// go-nvml themselves.
type Library = gonvml.Interface

// Options choose where a Source's figures come from.
type Options struct {
	// FakeGPUFile, when set (the caller reads GPUMEM_FAKE_GPU), names a JSON
	// file that replaces NVML; it is re-read at every Sample.
	FakeGPUFile string
	// Library is the NVML to use; nil means gonvml.New() (dlopens
	// libnvidia-ml.so.1 at Init). Tests pass go-nvml's mocks.
	Library Library
	// UtilizationWindow is how long a reading of a process's utilization
	// stays its figure when NVML has no newer one; 0 means
	// DefaultUtilizationWindow. A sampler that reads every interval gives
	// at least twice its interval, so that no reading falls between two.
	UtilizationWindow time.Duration
}

// Open returns a Source reading the simulated-GPU file when
// opts.FakeGPUFile is set, else NVML. A file that cannot be read or parsed is
// an error (naming the file and the problem). A failed NVML Init is not an
// error: the Source then reports no devices and nvml.NoDriverWarning, its
// InitErr is an InitError, and NVML is never called again.
func Open(opts Options) (*nvml.Source, error) {
	if opts.FakeGPUFile != "" {
		return nvml.OpenSimulated(opts.FakeGPUFile)
	}
	lib := opts.Library
	if lib == nil {
		lib = gonvml.New()
	}
	src, _ := openLibrary(lib, opts.UtilizationWindow)
	return src, nil
}

// openLibrary initialises lib and returns a Source over it, and its
// sampler (nil when Init failed).
func openLibrary(lib gonvml.Interface, utilWindow time.Duration) (*nvml.Source, *real) {
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		// Deliberately no other call on lib from here on, not even
		// ErrorString or Shutdown: after a failed Init any NVML call may kill
		// the process with an undefined-symbol error (measured: the dynamic
		// linker aborts, no Go panic to recover).
		return nvml.NoDriver(InitError{Return: ret}), nil
	}
	r := newReal(lib, utilWindow)
	return nvml.NewSource(r), r
}

// InitError is why NVML could not be initialised. It wraps the
// gonvml.Return (errors.Is(err, gonvml.ERROR_LIBRARY_NOT_FOUND) works), but
// its text never asks the library (gonvml.Return.Error may call into it).
type InitError struct{ Return gonvml.Return }

func (e InitError) Error() string {
	// Our own names: gonvml.Return.Error may call nvmlErrorString in a
	// library whose Init failed.
	names := map[gonvml.Return]string{
		gonvml.ERROR_LIBRARY_NOT_FOUND:       "libnvidia-ml.so.1 not found",
		gonvml.ERROR_DRIVER_NOT_LOADED:       "NVIDIA driver not loaded",
		gonvml.ERROR_NO_PERMISSION:           "no permission to talk to the driver",
		gonvml.ERROR_LIB_RM_VERSION_MISMATCH: "driver and libnvidia-ml.so.1 versions differ",
	}
	if name, ok := names[e.Return]; ok {
		return fmt.Sprintf("nvml init failed: %s (return code %d)", name, int32(e.Return))
	}
	return fmt.Sprintf("nvml init failed (return code %d)", int32(e.Return))
}

func (e InitError) Unwrap() error { return e.Return }
