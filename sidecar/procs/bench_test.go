package procs

import (
	"slices"
	"testing"

	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

// A 5,000-process fixture tree (20 kernels) is written once per benchmark
// into a temp dir; each iteration scans it and finds every kernel's tree.
// Target: scan + attribution < 30 ms, so that a 1 s sampling interval
// leaves the machine alone; see also the attribution
// package's BenchmarkScanAndAttribute5000.
func benchmarkScan5000(b *testing.B, scan func(fs *FS, details []int) (*Table, error)) {
	root := b.TempDir()
	fixture, kernels := procstest.Tree(5000, 20)
	procstest.WriteTree(b, root, fixture)
	fs := &FS{Root: root}
	// What ls asks details for: the kernels and, say, one GPU process each.
	details := append(slices.Clone(kernels), kernels...)
	for i := range kernels {
		details[len(kernels)+i] += 1
	}
	for b.Loop() {
		table, err := scan(fs, details)
		if err != nil {
			b.Fatal(err)
		}
		if table.Len() != len(fixture) {
			b.Fatalf("scanned %d processes, want %d", table.Len(), len(fixture))
		}
		for _, k := range kernels {
			if len(table.KernelProcesses(k, uint64(k))) == 0 {
				b.Fatalf("kernel %d: no processes", k)
			}
		}
	}
}

func BenchmarkScanTree5000(b *testing.B) {
	benchmarkScan5000(b, func(fs *FS, details []int) (*Table, error) { return fs.ScanTree(details) })
}

func BenchmarkScanFull5000(b *testing.B) {
	benchmarkScan5000(b, func(fs *FS, _ []int) (*Table, error) { return fs.Scan() })
}

// The real /proc of this machine, for scale.
func BenchmarkScanRealProc(b *testing.B) {
	fs := &FS{}
	for b.Loop() {
		if _, err := fs.Scan(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseStat(b *testing.B) {
	line := []byte(procstest.Proc{PID: 12345, PPID: 1, PGID: 12345, SID: 12345, Start: 987654, Comm: "python3"}.StatLine())
	for b.Loop() {
		if _, err := parseStat(line); err != nil {
			b.Fatal(err)
		}
	}
}
