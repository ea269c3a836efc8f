package asn

import (
	"context"
	"fmt"
	"math/bits"
	"os"
	"slices"

	"github.com/oschwald/maxminddb-golang/v2"
)

// mmdbRecord is the subset of a MaxMind DB record we read: GeoLite2-ASN and
// GeoIP2-ISP carry autonomous_system_number, GeoLite2-Country and -City
// carry country.iso_code (and registered_country.iso_code).
type mmdbRecord struct {
	ASN     uint32 `maxminddb:"autonomous_system_number"`
	Country struct {
		ISOCode string `maxminddb:"iso_code"`
	} `maxminddb:"country"`
	RegisteredCountry struct {
		ISOCode string `maxminddb:"iso_code"`
	} `maxminddb:"registered_country"`
}

type mmdbValue struct {
	asn     uint32
	country [2]byte
	keep    bool
}

// ctxCheckNetworks is how often (in networks) an mmdb walk checks for cancellation.
const ctxCheckNetworks = 4096

// readMMDB walks every network of a MaxMind DB. A record with neither an ASN
// nor a country is skipped; a record with an ASN of 0 but a country is kept
// (country databases). IPv4 networks come out once, as IPv4, not through
// their IPv6 aliases.
func (b *builder) readMMDB(ctx context.Context, file uint16, path string) error {
	db, err := maxminddb.Open(path)
	if err != nil {
		b.problem(file, 0, "not a readable MaxMind DB: %v", err)
		return nil
	}
	defer db.Close()
	// A search tree with n nodes has at most n+1 leaves, so at most n+1
	// networks: reserve for them (bounded) instead of growing by appends.
	b.spans = slices.Grow(b.spans, int(min(db.Metadata.NodeCount+1, 4<<20)))
	size := int64(0)
	if fi, err := statSize(path); err == nil {
		size = fi
	}
	base := b.progress.done
	// Many networks share one data record: decode each record once.
	cache := make(map[uintptr]mmdbValue)
	var n int
	for res := range db.Networks() {
		if err := res.Err(); err != nil {
			b.problem(file, 0, "walking networks: %v", err)
			return nil
		}
		n++
		if n%ctxCheckNetworks == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
		}
		pfx := res.Prefix()
		if !pfx.IsValid() {
			b.problem(file, 0, "network %d has an invalid prefix", n)
			continue
		}
		v, ok := cache[res.Offset()]
		if !ok {
			var rec mmdbRecord
			if err := res.Decode(&rec); err != nil {
				b.problem(file, 0, "network %v: record is not a map with autonomous_system_number or country.iso_code: %v", pfx, err)
				if b.full() {
					b.more = true
					return nil
				}
				continue
			}
			v, ok = mmdbValueOf(rec)
			if !ok {
				b.problem(file, 0, "network %v: country iso_code %q is not a two-letter ISO 3166 code", pfx, rec.Country.ISOCode)
				if b.full() {
					b.more = true
					return nil
				}
				continue
			}
			cache[res.Offset()] = v
		}
		if !v.keep {
			continue
		}
		first := u128From(pfx.Addr())
		is6 := pfx.Addr().Is6()
		b.stats.Ranges++
		b.spans = append(b.spans, span{
			start: first, end: first.add(lowMask(familyBits(is6) - pfx.Bits())),
			asn: v.asn, file: file, country: v.country, is6: is6,
		})
		if size > 0 {
			b.progress.setDone(base + addressFraction(first, is6, size))
		}
	}
	b.progress.setDone(base + size)
	return nil
}

func mmdbValueOf(rec mmdbRecord) (mmdbValue, bool) {
	code := rec.Country.ISOCode
	if code == "" {
		code = rec.RegisteredCountry.ISOCode
	}
	var country [2]byte
	if code != "" {
		c, ok := parseCountry([]byte(code))
		if !ok {
			return mmdbValue{}, false
		}
		country = c
	}
	return mmdbValue{asn: rec.ASN, country: country, keep: rec.ASN != 0 || country != [2]byte{}}, true
}

// addressFraction scales the position of an address to size: IPv4 onto
// [0, size/2), IPv6 onto
// [size/2, size), matching the walk order of Networks (IPv4 subtree first).
// Progress is therefore approximate for a MaxMind DB.
func addressFraction(first u128, is6 bool, size int64) int64 {
	var pos uint64 // position in [0, 2^63)
	if is6 {
		pos = 1<<62 | first.hi>>2
	} else {
		pos = (first.lo & 0xffffffff) << 30
	}
	hi, lo := bits.Mul64(pos, uint64(size))
	return int64(hi<<1 | lo>>63) // pos * size / 2^63
}

func statSize(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}
