package nvml

import (
	"context"
	"errors"
	"sync"
)

// NoDriverWarning is the one line a Source without a driver reports: why
// there is no figure, and the next step. Every face (the panel, the
// status bar, the magics, ls) says it as it is, after "GPU n/a: ".
const NoDriverWarning = "no NVIDIA driver found (libnvidia-ml.so.1): GPU figures unavailable; on a machine with NVIDIA GPUs, check that nvidia-smi works where gpumem serve runs"

// ErrClosed is returned by Sample after Close.
var ErrClosed = errors.New("nvml: source is closed")

// Sampler reads every GPU. Package nvml/driver implements it over the
// NVIDIA driver; the simulated-GPU file implements it here.
type Sampler interface {
	Sample(ctx context.Context) (Snapshot, error)
	Close() error
}

// Source samples GPUs. It is safe for concurrent use; samples are serialised.
type Source struct {
	mu      sync.Mutex
	closed  bool
	sampler Sampler
	initErr error
}

// NewSource returns a Source over s.
func NewSource(s Sampler) *Source { return &Source{sampler: s} }

// NoDriver returns the Source of a machine whose driver could not be opened
// (initErr says why): no devices and NoDriverWarning at every Sample.
func NoDriver(initErr error) *Source { return &Source{sampler: noDriver{}, initErr: initErr} }

// OpenSimulated returns a Source reading the simulated-GPU file at path
// (what GPUMEM_FAKE_GPU names), re-read at every Sample. A file that cannot
// be read or parsed is an error naming the file and the problem.
func OpenSimulated(path string) (*Source, error) {
	s := &simulated{path: path}
	if _, err := s.Sample(context.Background()); err != nil {
		return nil, err
	}
	return NewSource(s), nil
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
	return s.sampler.Sample(ctx)
}

// Close releases what the Sampler holds (NVML's Shutdown). Later Samples
// return ErrClosed. Closing twice is harmless.
func (s *Source) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.sampler.Close()
}

// InitErr returns why the driver was not opened (a NoDriver Source), or nil.
func (s *Source) InitErr() error { return s.initErr }

// noDriver samples nothing: no devices, one warning.
type noDriver struct{}

func (noDriver) Sample(context.Context) (Snapshot, error) {
	return Snapshot{Devices: []Device{}, Warnings: []string{NoDriverWarning}}, nil
}

func (noDriver) Close() error { return nil }
