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
// as shorthands, any case). SI spellings like "MB" are refused rather than
// guessed: half of the people who type them mean MiB.
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
	case "kb", "mb", "gb", "tb":
		return 0, fmt.Errorf("%q: ambiguous unit %q; write %s (powers of 1024) or plain bytes", s, unit, strings.ToUpper(unit[:1])+"iB")
	default:
		return 0, fmt.Errorf("%q: unknown unit %q; want B, KiB, MiB, GiB or TiB", s, unit)
	}
	if n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("%q: too large", s)
	}
	return n << shift, nil
}

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
