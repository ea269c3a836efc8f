package policy

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Unit says what a Rate or a burst counts.
type Unit uint8

const (
	// Packets counts packets.
	Packets Unit = iota + 1
	// Bytes counts bytes (bit rates are converted to bytes exactly).
	Bytes
)

func (u Unit) String() string {
	switch u {
	case Packets:
		return "packets"
	case Bytes:
		return "bytes"
	}
	return "unit(" + strconv.Itoa(int(u)) + ")"
}

// Rate is an exact rate: Count units per Per. It is never a float: "1.5/s"
// is 3 per 2s and "1bit/s" is 1 byte per 8s. The zero Rate means "no limit".
type Rate struct {
	Count uint64
	Per   time.Duration
}

// IsZero reports whether the rate is unset (no limit).
func (r Rate) IsZero() bool { return r.Count == 0 }

// Equal reports whether two rates are the same speed, even when written with
// different periods (60/min equals 1/s).
func (r Rate) Equal(o Rate) bool {
	if r.IsZero() || o.IsZero() {
		return r.IsZero() == o.IsZero()
	}
	a := new(big.Int).Mul(new(big.Int).SetUint64(r.Count), big.NewInt(int64(o.Per)))
	b := new(big.Int).Mul(new(big.Int).SetUint64(o.Count), big.NewInt(int64(r.Per)))
	return a.Cmp(b) == 0
}

// Limit is one token bucket dimension: a rate and a burst (bucket depth) in
// the same unit. The zero Limit means unlimited.
type Limit struct {
	Rate  Rate
	Burst uint64
}

// IsSet reports whether the limit is present.
func (l Limit) IsSet() bool { return !l.Rate.IsZero() }

// multipliers shared by all units. "K" is accepted for packets and bits
// where 1000 is the only reading; for bytes it is rejected (1000 or 1024?).
var siMultiplier = map[string]uint64{"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}

var binMultiplier = map[string]uint64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}

type rateUnit struct {
	unit   Unit
	mult   uint64
	bits   bool
	period time.Duration
}

// rateUnits is the complete units table (docs/policy.md prints it).
func rateUnits() map[string]rateUnit {
	t := map[string]rateUnit{}
	periods := map[string]time.Duration{"/s": time.Second, "/sec": time.Second, "/min": time.Minute, "/h": time.Hour}
	for p, m := range siMultiplier {
		for suffix, per := range periods {
			t[p+suffix] = rateUnit{Packets, m, false, per}
			t[p+"bit"+suffix] = rateUnit{Bytes, m, true, per}
			if p != "K" {
				t[p+"B"+suffix] = rateUnit{Bytes, m, false, per}
			}
		}
		t[p+"pps"] = rateUnit{Packets, m, false, time.Second}
		t[p+"bps"] = rateUnit{Bytes, m, true, time.Second}
	}
	for p, m := range binMultiplier {
		for suffix, per := range periods {
			t[p+"B"+suffix] = rateUnit{Bytes, m, false, per}
		}
	}
	return t
}

var (
	numberRE   = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*(.*)$`)
	knownUnits = rateUnits()
)

// ambiguousUnit explains units people write that have two readings.
func ambiguousUnit(u string) string {
	switch {
	case strings.HasSuffix(u, "Bps"):
		return fmt.Sprintf("%q is easily confused with %q; write %sB/s for bytes or %sbit/s for bits",
			u, strings.TrimSuffix(u, "Bps")+"bps", strings.TrimSuffix(u, "Bps"), strings.TrimSuffix(u, "Bps"))
	case strings.HasPrefix(u, "KB"):
		return fmt.Sprintf("%q is ambiguous (1000 or 1024 bytes); write kB (1000) or KiB (1024)", u)
	case strings.HasPrefix(u, "m") && !strings.HasPrefix(u, "min"):
		return fmt.Sprintf("%q is ambiguous (milli or mega); write M for 10^6", u)
	case strings.Contains(u, "b/"):
		p := u[:strings.Index(u, "b/")]
		return fmt.Sprintf("%q is ambiguous (bits or bytes); write %sbit/s or %sB/s", u, p, p)
	}
	return ""
}

// ParseRate parses a rate as people write it: "100/s", "3/min", "10k/s",
// "5Mpps", "100Mbit/s", "1Gbps" (gigaBITS per second), "64MiB/s". Decimal
// fractions are allowed when the result is exact ("1.5Gbps"). It returns the
// unit the rate counts in; the result is an exact count per period.
func ParseRate(s string) (Rate, Unit, error) {
	s = strings.TrimSpace(s)
	m := numberRE.FindStringSubmatch(s)
	if m == nil {
		return Rate{}, 0, fmt.Errorf("rate %q: want a number followed by a unit, e.g. 100/s, 10kpps, 100Mbit/s, 1Gbps", s)
	}
	num, unitText := m[1], m[2]
	u, ok := knownUnits[unitText]
	if !ok && unitText == "" {
		return Rate{}, 0, fmt.Errorf("rate %q needs a unit, e.g. %s/s (packets) or %sMbit/s (bits)", s, num, num)
	}
	if !ok {
		if hint := ambiguousUnit(unitText); hint != "" {
			return Rate{}, 0, fmt.Errorf("rate %q: %s", s, hint)
		}
		return Rate{}, 0, fmt.Errorf("rate %q: unknown unit %q; packets: /s /min /h pps (with k M G), bits: bit/s bps (with k M G T), bytes: B/s (with k M G T Ki Mi Gi Ti)", s, unitText)
	}
	v, ok := new(big.Rat).SetString(num)
	if !ok {
		return Rate{}, 0, fmt.Errorf("rate %q: bad number %q", s, num)
	}
	v.Mul(v, new(big.Rat).SetInt(new(big.Int).SetUint64(u.mult)))
	if u.bits {
		v.Quo(v, big.NewRat(8, 1))
	}
	if v.Sign() == 0 {
		return Rate{}, 0, fmt.Errorf("rate %q: a rate must be above zero; to remove a limit, leave it out", s)
	}
	// v = a/b units per period, exactly: a units per b periods.
	a, b := v.Num(), v.Denom()
	if !a.IsUint64() {
		return Rate{}, 0, fmt.Errorf("rate %q: too large", s)
	}
	per := new(big.Int).Mul(b, big.NewInt(int64(u.period)))
	if !per.IsInt64() || per.Int64() > int64(24*time.Hour) {
		return Rate{}, 0, fmt.Errorf("rate %q: too small (the period would exceed a day)", s)
	}
	return Rate{Count: a.Uint64(), Per: time.Duration(per.Int64())}, u.unit, nil
}

var burstRE = regexp.MustCompile(`^([0-9]+)\s*([a-zA-Z]*)$`)

// ParseBurst parses a bucket depth: a whole number of packets ("200", "10k")
// or of bytes ("1500", "1500B", "64KiB", "1MB").
func ParseBurst(s string, unit Unit) (uint64, error) {
	s = strings.TrimSpace(s)
	m := burstRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("burst %q: want a whole number with an optional unit, e.g. 200, 10k, 64KiB", s)
	}
	n, err := strconv.ParseUint(m[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("burst %q: %w", s, err)
	}
	suffix := m[2]
	var mult uint64
	var ok bool
	switch unit {
	case Packets:
		mult, ok = siMultiplier[suffix]
		if !ok {
			return 0, fmt.Errorf("burst %q: a packets burst takes an optional k, M or G multiplier, not %q", s, suffix)
		}
	case Bytes:
		switch {
		case suffix == "" || suffix == "B":
			mult, ok = 1, true
		case strings.HasSuffix(suffix, "bit") || strings.HasSuffix(suffix, "b"):
			return 0, fmt.Errorf("burst %q: a bytes burst counts bytes, not bits; write e.g. 64KiB or 1MB", s)
		case suffix == "KB":
			return 0, fmt.Errorf("burst %q: %q is ambiguous (1000 or 1024 bytes); write kB (1000) or KiB (1024)", s, suffix)
		case strings.HasSuffix(suffix, "B"):
			p := strings.TrimSuffix(suffix, "B")
			if mult, ok = siMultiplier[p]; !ok {
				mult, ok = binMultiplier[p]
			}
		}
		if !ok {
			return 0, fmt.Errorf("burst %q: a bytes burst is a byte count with an optional unit B, kB, MB, GB, KiB, MiB, GiB", s)
		}
	default:
		return 0, fmt.Errorf("burst %q: unknown unit %v", s, unit)
	}
	if n == 0 {
		return 0, fmt.Errorf("burst %q: a burst must be at least 1", s)
	}
	if n > math.MaxUint64/mult {
		return 0, fmt.Errorf("burst %q: too large", s)
	}
	return n * mult, nil
}

// FormatRate prints a rate in the unit it counts, in the most readable exact
// form: "10k/s", "3/min", "100Mbit/s", "12345B/s", "1B/8s".
func FormatRate(r Rate, unit Unit) string {
	if r.IsZero() {
		return "unlimited"
	}
	switch unit {
	case Packets:
		switch r.Per {
		case time.Second:
			return siString(r.Count) + "/s"
		case time.Minute:
			return siString(r.Count) + "/min"
		case time.Hour:
			return siString(r.Count) + "/h"
		}
		return strconv.FormatUint(r.Count, 10) + "/" + r.Per.String()
	case Bytes:
		if r.Per == time.Second && r.Count <= math.MaxUint64/8 {
			if bits := r.Count * 8; bits%1000 == 0 {
				return siString(bits) + "bit/s"
			}
			return FormatBurst(r.Count, Bytes) + "/s"
		}
		return strconv.FormatUint(r.Count, 10) + "B/" + r.Per.String()
	}
	return fmt.Sprintf("%d/%s", r.Count, r.Per)
}

// FormatBurst prints a burst in its unit: "200", "64KiB", "1500B".
func FormatBurst(n uint64, unit Unit) string {
	if unit == Packets {
		return siString(n)
	}
	for _, p := range []struct {
		s string
		m uint64
	}{{"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if n >= p.m && n%p.m == 0 {
			return strconv.FormatUint(n/p.m, 10) + p.s + "B"
		}
	}
	if n >= 1000 && n%1000 == 0 {
		return siString(n) + "B"
	}
	return strconv.FormatUint(n, 10) + "B"
}

// siString prints n with the largest exact decimal multiplier (1000 -> "1k").
func siString(n uint64) string {
	for _, p := range []struct {
		s string
		m uint64
	}{{"T", 1e12}, {"G", 1e9}, {"M", 1e6}, {"k", 1e3}} {
		if n >= p.m && n%p.m == 0 {
			return strconv.FormatUint(n/p.m, 10) + p.s
		}
	}
	return strconv.FormatUint(n, 10)
}

// String prints the limit as "rate burst N" in the given unit.
func (l Limit) format(unit Unit) string {
	if !l.IsSet() {
		return "unlimited"
	}
	return FormatRate(l.Rate, unit) + " burst " + FormatBurst(l.Burst, unit)
}
