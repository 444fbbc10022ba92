// Package units formats byte counts for people, in binary (IEC) units, as
// every Go output of gpumem prints them (`gpumem ls`, the daemon's alerts and
// logs). Bytes are uint64 counts everywhere inside; this is the one place
// that turns them into text. Pure: no I/O, no state.
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
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
