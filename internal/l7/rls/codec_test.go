package rls

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// TestCodec: responses are the bytes protobuf-go writes for Envoy's
// message built from the same Verdict (responseMessage), for every field
// the service sets, its zero values and its bounds, appended after what
// dst holds; requests are refused where protobuf-go refuses them.
func TestCodec(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pers := []time.Duration{0, time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 90 * time.Second,
		time.Minute, 2 * time.Hour, 24 * time.Hour, 48 * time.Hour, 1<<63 - 1}
	durs := []time.Duration{-1500 * time.Millisecond, -1, 0, 1, time.Millisecond, 999999999, time.Second, 1500 * time.Millisecond, 50 * time.Second, 1<<63 - 1}
	counts := []int64{0, 1, 3, 1 << 31, 1<<32 - 1, 1 << 32, 1 << 62}
	remains := []int64{-5, 0, 1, 97, 1<<32 - 1, 1 << 40}
	names := []string{"", "ip-2", "ü-limit", strings.Repeat("n", 200)}
	for n := range 2000 {
		v := &Verdict{Allowed: rng.IntN(2) == 0}
		for range rng.IntN(5) {
			st := Status{Over: rng.IntN(2) == 0}
			if rng.IntN(4) > 0 {
				st.Current = &LimitStatus{Name: names[rng.IntN(len(names))], Count: counts[rng.IntN(len(counts))], Per: pers[rng.IntN(len(pers))]}
				st.Decision = l7.Decision{Allowed: rng.IntN(2) == 0, Remaining: remains[rng.IntN(len(remains))],
					Reset: durs[rng.IntN(len(durs))], RetryAfter: durs[rng.IntN(len(durs))]}
			}
			v.Statuses = append(v.Statuses, st)
		}
		for range rng.IntN(3) {
			v.Headers = append(v.Headers, [2]string{names[rng.IntN(len(names))], names[rng.IntN(len(names))]})
		}
		if n == 0 {
			v.Statuses = make([]Status, 400)
		}
		got, err := appendResponse([]byte("head"), v)
		if err != nil {
			t.Fatal(err)
		}
		want, err := proto.Marshal(responseMessage(v))
		if err != nil {
			t.Fatal(err)
		}
		if string(got[:4]) != "head" || !bytes.Equal(got[4:], want) {
			t.Fatalf("verdict %+v:\n got %x\nwant %x", v, got[4:], want)
		}
		back := &rlsv3.RateLimitResponse{}
		if err := proto.Unmarshal(got[4:], back); err != nil || !proto.Equal(back, responseMessage(v)) {
			t.Fatalf("round trip: %v", err)
		}
	}
	if _, err := appendResponse(nil, &Verdict{Headers: [][2]string{{"k", "\xff"}}}); err == nil {
		t.Fatal("a header value that is not UTF-8 was written (protobuf-go refuses it)")
	}
}

// requestFromProto is how the service reads Envoy's message: the
// reference decodeRequest is held equal to.
func requestFromProto(in *rlsv3.RateLimitRequest) Request {
	req := Request{Domain: in.GetDomain(), HitsAddend: uint64(in.GetHitsAddend())}
	for _, d := range in.GetDescriptors() {
		var rd Descriptor
		for _, e := range d.GetEntries() {
			rd.Entries = append(rd.Entries, Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		if h := d.GetHitsAddend(); h != nil {
			rd.Hits, rd.HasHits = h.GetValue(), true
		}
		req.Descriptors = append(req.Descriptors, rd)
	}
	return req
}

func checkDecodeRequest(t *testing.T, msg []byte) {
	t.Helper()
	var in rlsv3.RateLimitRequest
	werr := proto.Unmarshal(msg, &in)
	var got Request
	err := decodeRequest(msg, &got)
	if (err != nil) != (werr != nil) {
		t.Fatalf("%x: decodeRequest %v, protobuf-go %v", msg, err, werr)
	}
	if err == nil {
		if want := requestFromProto(&in); !reflect.DeepEqual(got, want) {
			t.Fatalf("%x:\n got %+v\nwant %+v", msg, got, want)
		}
	}
}

func requestSeeds(t testing.TB) [][]byte {
	m := func(r *rlsv3.RateLimitRequest) []byte {
		b, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	full := m(&rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 7, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("remote_address=192.0.2.1", "k=v"), {}, {Entries: desc("a=b").Entries, HitsAddend: wrapperspb.UInt64(0),
			Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: 2}}}})
	seeds := [][]byte{nil, full, m(&rlsv3.RateLimitRequest{Domain: "d"}),
		{0x0a, 0x03, 0xff, 0xfe, 0xfd},                               // domain: invalid UTF-8
		{0x18, 0xff, 0xff, 0xff, 0xff, 0x1f},                         // hits_addend above 32 bits
		{0x08, 0x01, 0x0a, 0x01, 'x'},                                // domain as a varint, then as a string
		{0x12, 0x02, 0x1a, 0x00, 0x12, 0x04, 0x1a, 0x02, 0x08, 0x05}, // hits_addend merged across two descriptors? (two descriptors)
		{0x12, 0x06, 0x1a, 0x02, 0x08, 0x05, 0x1a, 0x00},             // one descriptor, hits_addend twice: merged (5 stays)
		{0x12, 0x04, 0x0a, 0x02, 0x0a, 0x80},                         // an entry with a broken key
		{0x12, 0x03, 0x13, 0x14, 0x00},                               // a group in a descriptor
		{0x12, 0x02, 0x12, 0x01},                                     // a truncated limit
		{0x12, 0x02, 0x12, 0x01, 0xff},
		{0x2a, 0x01, 0x00, 0x35, 0x01, 0x02, 0x03, 0x04}, // unknown fields
		{0x0f}, {0x12}, {0x12, 0x05, 0x0a, 0x03, 0x0a, 0x01, 0xc3}, // truncations, invalid UTF-8 in a key
	}
	return append(seeds, full[:len(full)-3], append(bytes.Clone(full), full...))
}

// TestDecodeRequest: decodeRequest reads what protobuf-go reads and
// refuses what it refuses.
func TestDecodeRequest(t *testing.T) {
	for _, b := range requestSeeds(t) {
		checkDecodeRequest(t, b)
	}
}

func FuzzDecodeRequest(f *testing.F) {
	for _, b := range requestSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkDecodeRequest(t, b) })
}
