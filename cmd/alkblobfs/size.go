package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

var iecUnits = []struct {
	name  string
	shift uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}}

// parseSize reads a byte count: plain bytes ("4096", "4096B") or an
// integer with an IEC unit ("128KiB", "1MiB", "2GiB"; "K", "M", "G", "T"
// as shorthands, any case), or an SI one taken at its word: "10MB" is
// 10 000 000 bytes, "1kB" 1000.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && '0' <= t[i] && t[i] <= '9' {
		i++
	}
	num, unit := t[:i], strings.TrimSpace(t[i:])
	if num == "" {
		return 0, fmt.Errorf("%q: want a byte count like 131072, 128KiB or 1MiB", s)
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: %w", s, err)
	}
	var shift uint
	if p, ok := siPowers[strings.ToLower(unit)]; ok {
		if n > math.MaxInt64/p {
			return 0, fmt.Errorf("%q: too large", s)
		}
		return n * p, nil
	}
	switch strings.ToLower(unit) {
	case "", "b":
	case "k", "kib":
		shift = 10
	case "m", "mib":
		shift = 20
	case "g", "gib":
		shift = 30
	case "t", "tib":
		shift = 40
	default:
		return 0, fmt.Errorf("%q: unknown unit %q; want B, KiB, MiB, GiB or TiB (or kB, MB, GB, TB: powers of 1000)", s, unit)
	}
	if n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("%q: too large", s)
	}
	return n << shift, nil
}

// siPowers are the SI units parseSize accepts.
var siPowers = map[string]int64{"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}

// formatSize is the exact inverse of parseSize: the largest IEC unit that
// divides n, else plain bytes.
func formatSize(n int64) string {
	for _, u := range iecUnits {
		if n != 0 && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", n>>u.shift, u.name)
		}
	}
	return strconv.FormatInt(n, 10)
}

// humanSize is a rounded size for people: "1.5 MiB".
func humanSize(n int64) string {
	for _, u := range iecUnits {
		if n >= 1<<u.shift {
			return fmt.Sprintf("%.1f %s", float64(n)/float64(int64(1)<<u.shift), u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}
