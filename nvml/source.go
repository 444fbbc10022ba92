package nvml

import (
	"context"
	"errors"
	"fmt"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NoDriverWarning is the one line a Source without a driver reports.
const NoDriverWarning = "no NVIDIA driver found (libnvidia-ml.so.1): GPU figures unavailable"

// ErrClosed is returned by Sample after Close.
var ErrClosed = errors.New("nvml: source is closed")

// Options choose where a Source's figures come from.
type Options struct {
	// FakeGPUFile, when set (the caller reads GPUMEM_FAKE_GPU), names a JSON
	// file that replaces NVML; it is re-read at every Sample.
	FakeGPUFile string
	// Library is the NVML to use; nil means gonvml.New() (dlopens
	// libnvidia-ml.so.1 at Init). Tests pass go-nvml's mocks.
	Library gonvml.Interface
}

// Source samples GPUs. It is safe for concurrent use; samples are serialised.
type Source struct {
	mu      sync.Mutex
	closed  bool
	sampler sampler
}

type sampler interface {
	sample(ctx context.Context) (Snapshot, error)
	close() error
}

// Open returns a Source reading the simulated-GPU file when
// opts.FakeGPUFile is set, else NVML. A file that cannot be read or parsed is
// an error (naming the file and the problem). A failed NVML Init is not an
// error: the Source then reports no devices and NoDriverWarning, and never
// calls NVML again.
func Open(opts Options) (*Source, error) {
	if opts.FakeGPUFile != "" {
		s := &simulated{path: opts.FakeGPUFile}
		if _, err := s.sample(context.Background()); err != nil {
			return nil, err
		}
		return &Source{sampler: s}, nil
	}
	lib := opts.Library
	if lib == nil {
		lib = gonvml.New()
	}
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		// Deliberately no other call on lib from here on, not even
		// ErrorString or Shutdown: after a failed Init any NVML call may kill
		// the process with an undefined-symbol error (FIELD-NOTES).
		return &Source{sampler: noDriver{initReturn: ret}}, nil
	}
	return &Source{sampler: newReal(lib)}, nil
}

// Sample reads every device now.
func (s *Source) Sample(ctx context.Context) (Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Snapshot{}, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return Snapshot{}, err
	}
	return s.sampler.sample(ctx)
}

// Close releases NVML (Shutdown) if this Source initialised it. Later
// Samples return ErrClosed. Closing twice is harmless.
func (s *Source) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.sampler.close()
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

// InitErr returns why NVML was not initialised, or nil when it was (or when
// the figures come from the simulated file).
func (s *Source) InitErr() error {
	if nd, ok := s.sampler.(noDriver); ok {
		return InitError{Return: nd.initReturn}
	}
	return nil
}

// noDriver is the Source when Init failed: no devices, one warning.
type noDriver struct{ initReturn gonvml.Return }

func (noDriver) sample(context.Context) (Snapshot, error) {
	return Snapshot{Devices: []Device{}, Warnings: []string{NoDriverWarning}}, nil
}

func (noDriver) close() error { return nil }
