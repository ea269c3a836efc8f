package policy

import (
	"strings"
	"testing"
)

func TestSamplingDefaultsAndFields(t *testing.T) {
	p, err := parseStanding(t, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Sampling != DefaultSampling() || p.Sampling.OneIn != 1024 || p.Sampling.MaxPerSecond != 20000 {
		t.Fatalf("sampling defaults: %+v", p.Sampling)
	}
	for body, want := range map[string]Sampling{
		"sampling: {one_in: 16}":                             {OneIn: 16, MaxPerSecond: DefaultSamplingPerSecond},
		"sampling: {max_per_second: 500}":                    {OneIn: DefaultSamplingOneIn, MaxPerSecond: 500},
		"sampling: {one_in: 0}":                              {OneIn: 0, MaxPerSecond: DefaultSamplingPerSecond},
		"sampling: {one_in: 1, max_per_second: 1}":           {OneIn: 1, MaxPerSecond: 1},
		"sampling: {one_in: 16777216}":                       {OneIn: 1 << 24, MaxPerSecond: DefaultSamplingPerSecond},
		"sampling:\n  one_in: 64\n  max_per_second: 1000000": {OneIn: 64, MaxPerSecond: 1_000_000},
	} {
		p, err := parseStanding(t, body, nil)
		if err != nil {
			t.Errorf("%q: %v", body, err)
			continue
		}
		if p.Sampling != want {
			t.Errorf("%q: %+v, want %+v", body, p.Sampling, want)
		}
		c, err := Compile(p, nil)
		if err != nil {
			t.Fatalf("%q: compile: %v", body, err)
		}
		if c.Sampling != want {
			t.Errorf("%q: compiled %+v, want %+v", body, c.Sampling, want)
		}
	}
}

func TestSamplingRefusesHostileValues(t *testing.T) {
	for body, want := range map[string]string{
		"sampling: {one_in: -1}":              "sampling.one_in",
		"sampling: {one_in: 16777217}":        "sampling.one_in",
		"sampling: {one_in: 1e3}":             "sampling.one_in",
		"sampling: {one_in: 4294967296}":      "sampling.one_in",
		"sampling: {one_in: [1]}":             "sampling.one_in",
		"sampling: {max_per_second: 0}":       "sampling.max_per_second",
		"sampling: {max_per_second: 1000001}": "sampling.max_per_second",
		"sampling: {max_per_second: 10/s}":    "sampling.max_per_second",
		"sampling: {rate: 3}":                 `unknown field "rate"`,
		"sampling: 16":                        "sampling",
	} {
		_, err := parseStanding(t, body, nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error about %s", body, err, want)
		}
	}
}
