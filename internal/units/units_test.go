package units

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// formats is testdata/formats.json at the repository's root: the cases
// every face's byte and duration formatters are tested against.
type formats struct {
	Bytes   [][2]json.RawMessage `json:"bytes"`
	Seconds [][2]json.RawMessage `json:"seconds"`
}

func readFormats(t *testing.T) formats {
	t.Helper()
	path := filepath.Join("..", "..", "testdata", "formats.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the shared table of formats: %v", err)
	}
	var f formats
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(f.Bytes) == 0 || len(f.Seconds) == 0 {
		t.Fatalf("%s lists no cases", path)
	}
	return f
}

// Bytes and Duration write what the shared table says, as the TypeScript
// and Python twins are tested to.
func TestSharedFormats(t *testing.T) {
	f := readFormats(t)
	for _, c := range f.Bytes {
		var in uint64
		var want string
		if err := json.Unmarshal(c[0], &in); err != nil {
			t.Fatalf("bytes case %s: %v", c[0], err)
		}
		if err := json.Unmarshal(c[1], &want); err != nil {
			t.Fatal(err)
		}
		if got := Bytes(in); got != want {
			t.Errorf("Bytes(%d) = %q, want %q (testdata/formats.json)", in, got, want)
		}
	}
	for _, c := range f.Seconds {
		var in float64
		var want string
		if err := json.Unmarshal(c[0], &in); err != nil {
			t.Fatalf("seconds case %s: %v", c[0], err)
		}
		if err := json.Unmarshal(c[1], &want); err != nil {
			t.Fatal(err)
		}
		if got := Seconds(in); got != want {
			t.Errorf("Seconds(%v) = %q, want %q (testdata/formats.json)", in, got, want)
		}
		if got := Duration(time.Duration(math.Round(in * 1e9))); got != want {
			t.Errorf("Duration(%v) = %q, want %q (testdata/formats.json)", time.Duration(math.Round(in*1e9)), got, want)
		}
	}
}

// Durations beyond the table: the bounds of time.Duration and of a float.
func TestDurationBounds(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want string
	}{
		{math.MinInt64, "0 s"},
		{math.MaxInt64, "106751 d 23 h"},
		{time.Nanosecond, "0 s"},
		{500 * time.Microsecond, "1 ms"},
	} {
		if got := Duration(tc.in); got != tc.want {
			t.Errorf("Duration(%d) = %q, want %q", int64(tc.in), got, tc.want)
		}
	}
	for _, s := range []float64{math.NaN(), math.Inf(-1)} {
		if got := Seconds(s); got != "0 s" {
			t.Errorf("Seconds(%v) = %q, want 0 s", s, got)
		}
	}
	if got := Seconds(math.Inf(1)); got != "106751 d 23 h" {
		t.Errorf("Seconds(+Inf) = %q", got)
	}
}

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
