package policy

import (
	"strings"
	"testing"
	"time"
)

func TestParseRate(t *testing.T) {
	tests := []struct {
		in    string
		count uint64
		per   time.Duration
		unit  Unit
	}{
		{"100/s", 100, time.Second, Packets},
		{"3/min", 3, time.Minute, Packets},
		{"10k/s", 10000, time.Second, Packets},
		{"10K/s", 10000, time.Second, Packets},
		{"5Mpps", 5000000, time.Second, Packets},
		{"7/h", 7, time.Hour, Packets},
		{"1.5/s", 3, 2 * time.Second, Packets},
		{"0.5kpps", 500, time.Second, Packets},
		{"100 /s", 100, time.Second, Packets},
		{"100Mbit/s", 12500000, time.Second, Bytes},
		{"1Gbps", 125000000, time.Second, Bytes},
		{"1.5Gbps", 187500000, time.Second, Bytes},
		{"1bit/s", 1, 8 * time.Second, Bytes},
		{"12bps", 3, 2 * time.Second, Bytes},
		{"10MB/s", 10000000, time.Second, Bytes},
		{"64KiB/s", 65536, time.Second, Bytes},
		{"1GiB/min", 1 << 30, time.Minute, Bytes},
		{"800kbit/s", 100000, time.Second, Bytes},
	}
	for _, tc := range tests {
		r, u, err := ParseRate(tc.in)
		if err != nil {
			t.Errorf("ParseRate(%q): %v", tc.in, err)
			continue
		}
		if r.Count != tc.count || r.Per != tc.per || u != tc.unit {
			t.Errorf("ParseRate(%q) = %d per %v %v, want %d per %v %v", tc.in, r.Count, r.Per, u, tc.count, tc.per, tc.unit)
		}
	}
}

func TestParseRateRejects(t *testing.T) {
	tests := []struct{ in, want string }{
		{"0/s", "above zero"},
		{"0.0Gbps", "above zero"},
		{"10MBps", "write MB/s for bytes or Mbit/s for bits"},
		{"10Mb/s", "ambiguous (bits or bytes)"},
		{"10KB/s", "kB (1000) or KiB (1024)"},
		{"10mbps", "milli or mega"},
		{"10/fortnight", "unknown unit"},
		{"fast", "want a number"},
		{"-1/s", "want a number"},
		{"1e3/s", "unknown unit"},
		{"1/s/s", "unknown unit"},
		{"0.0000000001/s", "too small"},
		{"99999999999999999999T/s", "too large"},
	}
	for _, tc := range tests {
		_, _, err := ParseRate(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseRate(%q) error = %v, want it to contain %q", tc.in, err, tc.want)
		}
	}
}

func TestParseBurst(t *testing.T) {
	tests := []struct {
		in   string
		unit Unit
		want uint64
		err  string
	}{
		{"200", Packets, 200, ""},
		{"10k", Packets, 10000, ""},
		{"4M", Packets, 4000000, ""},
		{"1500", Bytes, 1500, ""},
		{"1500B", Bytes, 1500, ""},
		{"64KiB", Bytes, 65536, ""},
		{"2MB", Bytes, 2000000, ""},
		{"1kB", Bytes, 1000, ""},
		{"0", Packets, 0, "at least 1"},
		{"0KiB", Bytes, 0, "at least 1"},
		{"64KB", Bytes, 0, "ambiguous"},
		{"64Kbit", Bytes, 0, "not bits"},
		{"64Mb", Bytes, 0, "not bits"},
		{"10KiB", Packets, 0, "k, M or G multiplier"},
		{"1.5", Packets, 0, "whole number"},
		{"-3", Packets, 0, "whole number"},
		{"99999999999999999999", Packets, 0, "out of range"},
		{"99999999999999T", Packets, 0, "too large"},
	}
	for _, tc := range tests {
		got, err := ParseBurst(tc.in, tc.unit)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseBurst(%q, %v) error = %v, want %q", tc.in, tc.unit, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseBurst(%q, %v) = %d, %v; want %d", tc.in, tc.unit, got, err, tc.want)
		}
	}
}

func TestFormatRateRoundTrips(t *testing.T) {
	for _, in := range []string{"100/s", "3/min", "10k/s", "5M/s", "7/h", "100Mbit/s", "1Gbit/s", "12345B/s", "1B/8s"} {
		r, u, err := ParseRate(in)
		if in == "1B/8s" {
			r, u, err = Rate{Count: 1, Per: 8 * time.Second}, Bytes, nil
		}
		if err != nil {
			t.Fatalf("ParseRate(%q): %v", in, err)
		}
		if got := FormatRate(r, u); got != in {
			t.Errorf("FormatRate(ParseRate(%q)) = %q", in, got)
		}
	}
	if got := FormatBurst(65536, Bytes); got != "64KiB" {
		t.Errorf("FormatBurst(65536) = %q", got)
	}
	if got := FormatBurst(1500, Bytes); got != "1500B" {
		t.Errorf("FormatBurst(1500) = %q", got)
	}
}

func TestRateEqual(t *testing.T) {
	a, _, _ := ParseRate("60/min")
	b, _, _ := ParseRate("1/s")
	c, _, _ := ParseRate("2/s")
	if !a.Equal(b) || a.Equal(c) || a.Equal(Rate{}) || !(Rate{}).Equal(Rate{}) {
		t.Errorf("Rate.Equal is wrong: 60/min vs 1/s = %v, vs 2/s = %v", a.Equal(b), a.Equal(c))
	}
}
