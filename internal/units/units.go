// Package units formats byte counts and durations for people, as every Go
// output of gpumem prints them (`gpumem ls`, the daemon's alerts, reasons
// and errors): bytes in binary (IEC) units with one decimal, durations in
// at most two short units ("3 h 5 min"). Bytes are uint64 counts and
// durations time.Durations everywhere inside; this is the one place that
// turns them into text. The faces in TypeScript and Python have twins of
// Bytes and Duration; all of them are tested against one table of cases,
// testdata/formats.json at the repository's root. Pure: no I/O, no state.
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Bytes renders b with one decimal in the largest binary unit that keeps
// the number at or above 1: "0 B", "1023 B", "1.5 KiB", "10.2 GiB", "3.0 TiB".
// PiB is the largest unit.
func Bytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return strconv.FormatUint(b, 10) + " B"
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit && exp < 4; n /= unit {
		div *= unit
		exp++
	}
	return strconv.FormatFloat(float64(b)/float64(div), 'f', 1, 64) + " " + string("KMGTP"[exp]) + "iB"
}

// Delta renders a change of a byte count with its sign, as Bytes renders
// the count: "+1.5 GiB", "-512.0 MiB", "0 B".
func Delta(d int64) string {
	switch {
	case d > 0:
		return "+" + Bytes(uint64(d))
	case d < 0:
		return "-" + Bytes(uint64(-(d+1))+1) // -MinInt64 overflows int64
	}
	return "0 B"
}

// ParseBytes reads a byte count for a flag: a plain number of bytes, or a
// number with a unit, binary (KiB, MiB, GiB, TiB) or decimal (KB, MB, GB,
// TB); the B may be left out after a binary prefix ("8Gi"), and "8G" is
// taken as binary, as people who write it usually mean.
func ParseBytes(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := map[string]float64{
		"": 1, "b": 1,
		"k": 1 << 10, "ki": 1 << 10, "kib": 1 << 10, "kb": 1e3,
		"m": 1 << 20, "mi": 1 << 20, "mib": 1 << 20, "mb": 1e6,
		"g": 1 << 30, "gi": 1 << 30, "gib": 1 << 30, "gb": 1e9,
		"t": 1 << 40, "ti": 1 << 40, "tib": 1 << 40, "tb": 1e12,
	}[unit]
	if !ok || num == "" {
		return 0, fmt.Errorf("%q is not a byte count: write e.g. 8GiB, 512MiB or 1073741824", s)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 || v*mult > math.MaxUint64/2 {
		return 0, fmt.Errorf("%q is not a byte count: write e.g. 8GiB, 512MiB or 1073741824", s)
	}
	return uint64(v * mult), nil
}

// Duration renders d for people in at most two units, the second left out
// when 0, rounded to the smaller unit shown: "250 ms", "45 s",
// "1 min 30 s", "3 h 5 min", "27 h 13 min", "2 d 3 h": hours up to 48,
// as people count a day or two. Zero and negative durations are "0 s". Never Go's "3h0m0s": people read it, and the other faces write
// the same text (testdata/formats.json).
func Duration(d time.Duration) string {
	const day = 24 * time.Hour
	if ms := d.Round(time.Millisecond); ms <= 0 {
		return "0 s"
	} else if ms < time.Second {
		return strconv.FormatInt(int64(ms/time.Millisecond), 10) + " ms"
	}
	if s := d.Round(time.Second); s < time.Minute {
		return strconv.FormatInt(int64(s/time.Second), 10) + " s"
	} else if s < time.Hour {
		return twoUnits(int64(s/time.Minute), "min", int64(s%time.Minute/time.Second), "s")
	}
	if m := d.Round(time.Minute); m < 2*day {
		return twoUnits(int64(m/time.Hour), "h", int64(m%time.Hour/time.Minute), "min")
	}
	h := d.Round(time.Hour)
	return twoUnits(int64(h/day), "d", int64(h%day/time.Hour), "h")
}

// Seconds is Duration of a count of seconds (the report's idle_seconds).
func Seconds(s float64) string {
	switch ns := math.Round(s * 1e9); {
	case math.IsNaN(s) || s <= 0:
		return "0 s"
	case ns >= math.MaxInt64: // converting it would overflow
		return Duration(math.MaxInt64)
	default:
		return Duration(time.Duration(ns))
	}
}

// twoUnits is "<a> <unitA>", with " <b> <unitB>" unless b is 0.
func twoUnits(a int64, unitA string, b int64, unitB string) string {
	out := strconv.FormatInt(a, 10) + " " + unitA
	if b != 0 {
		out += " " + strconv.FormatInt(b, 10) + " " + unitB
	}
	return out
}
