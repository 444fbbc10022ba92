package testenv

import (
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"plain", "1234 (gpumem) S 1 1234 1234 0 -1 4194560 900 0 0 0 150 25 0 0 20 0 9 0 100 0 0", 1750 * time.Millisecond, false},
		{"comm with spaces and parens", "7 (a) b) (c) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 5 0 0", 70 * time.Millisecond, false},
		{"truncated", "7 (x) R 1 7 7 0", 0, true},
		{"no comm", "garbage", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStatCPU([]byte(tt.in))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("parseStatCPU(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestParseStatusMemory(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		rss, peak uint64
		wantErr   bool
	}{
		{"both", "Name:\tgpumem\nVmHWM:\t   30720 kB\nVmRSS:\t   20480 kB\nThreads:\t9\n", 20 << 20, 30 << 20, false},
		{"kernel thread", "Name:\tkthreadd\nThreads:\t1\n", 0, 0, true},
		{"bad number", "VmHWM:\t x kB\nVmRSS:\t 1 kB\n", 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rss, peak, err := parseStatusMemory([]byte(tt.in))
			if (err != nil) != tt.wantErr || rss != tt.rss || peak != tt.peak {
				t.Fatalf("parseStatusMemory = %d, %d, %v; want %d, %d, error %v", rss, peak, err, tt.rss, tt.peak, tt.wantErr)
			}
		})
	}
}

func TestParseSchedstat(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"3941420 5539150 1\n", 3941420 * time.Nanosecond, false},
		{"", 0, true},
		{"x 1 2", 0, true},
	}
	for _, tt := range tests {
		got, err := parseSchedstat([]byte(tt.in))
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseSchedstat(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}
