package units

import (
	"math"
	"testing"
)

func TestBytes(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		in   uint64
		want string
	}{
		{0, "0 B"},
		{1, "1 B"},
		{1023, "1023 B"},
		{1024, "1.0 KiB"},
		{1536, "1.5 KiB"},
		{1<<20 - 1, "1024.0 KiB"}, // rounds up within the unit, as %.1f does
		{1 << 20, "1.0 MiB"},
		{10*gib + gib/5, "10.2 GiB"},
		{150754820096, "140.4 GiB"},
		{3 << 40, "3.0 TiB"},
		{5 << 50, "5.0 PiB"},
		{math.MaxUint64, "16384.0 PiB"},
	} {
		if got := Bytes(tc.in); got != tc.want {
			t.Errorf("Bytes(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestDelta(t *testing.T) {
	for _, tc := range []struct {
		in   int64
		want string
	}{
		{0, "0 B"},
		{1536, "+1.5 KiB"},
		{-512 << 20, "-512.0 MiB"},
		{-1, "-1 B"},
		{math.MinInt64, "-8192.0 PiB"},
	} {
		if got := Delta(tc.in); got != tc.want {
			t.Errorf("Delta(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
		err  bool
	}{
		{"1073741824", 1 << 30, false},
		{"8GiB", 8 << 30, false},
		{"8Gi", 8 << 30, false},
		{"8G", 8 << 30, false},
		{"8GB", 8e9, false},
		{"512 MiB", 512 << 20, false},
		{"1.5GiB", 3 << 29, false},
		{"0", 0, false},
		{"", 0, true},
		{"GiB", 0, true},
		{"-1GiB", 0, true},
		{"8 parsecs", 0, true},
	}
	for _, tc := range tests {
		got, err := ParseBytes(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}
