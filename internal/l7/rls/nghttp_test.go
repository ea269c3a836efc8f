package rls

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/edgeguard/edgeguard/internal/l7/l7test"
)

// TestNghttpInterop: a second, independent HTTP/2 implementation
// (nghttp2's client, Debian's nghttp2-client) speaks to the gRPC
// listener: four concurrent streams on one connection get the service's
// decisions (3 OK, then OVER_LIMIT) with grpc-status 0 trailers; another
// method gets grpc-status 12.
func TestNghttpInterop(t *testing.T) {
	nghttp, err := exec.LookPath("nghttp")
	if err != nil {
		t.Skip("nghttp not found (Debian's nghttp2-client, scripts/install-deps.sh)")
	}
	s, _ := startServer(t, fieldsPolicy, new(l7test.ManualClock), nil)
	msg, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address=198.51.100.7")}})
	if err != nil {
		t.Fatal(err)
	}
	body := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	body = append(body, msg...)
	file := filepath.Join(t.TempDir(), "req.bin")
	if err := os.WriteFile(file, body, 0o600); err != nil {
		t.Fatal(err)
	}
	url := "http://" + s.Addrs()["grpc"] + shouldRateLimitPath
	args := []string{"-H", "content-type: application/grpc", "-H", "te: trailers", "-d", file}
	out, err := exec.Command(nghttp, append(args, "-m", "4", url)...).Output()
	if err != nil {
		t.Fatalf("nghttp: %v", err)
	}
	var codes []rlsv3.RateLimitResponse_Code
	for len(out) >= 5 {
		n := int(binary.BigEndian.Uint32(out[1:5]))
		if out[0] != 0 || len(out) < 5+n {
			t.Fatalf("not a gRPC message: %x", out)
		}
		var res rlsv3.RateLimitResponse
		if err := proto.Unmarshal(out[5:5+n], &res); err != nil {
			t.Fatal(err)
		}
		codes = append(codes, res.GetOverallCode())
		out = out[5+n:]
	}
	ok, over := 0, 0
	for _, c := range codes {
		switch c {
		case rlsv3.RateLimitResponse_OK:
			ok++
		case rlsv3.RateLimitResponse_OVER_LIMIT:
			over++
		}
	}
	if ok != 3 || over != 1 || len(out) != 0 {
		t.Fatalf("4 streams through nghttp: %v (rest %x), want 3 OK and 1 OVER_LIMIT", codes, out)
	}
	verbose := func(url string) string {
		out, err := exec.Command(nghttp, append(args, "-v", url)...).Output()
		if err != nil {
			t.Fatalf("nghttp -v %s: %v", url, err)
		}
		return string(out)
	}
	if v := verbose(url); !strings.Contains(v, "grpc-status: 0") || !strings.Contains(v, ":status: 200") {
		t.Errorf("nghttp -v: no :status 200 and grpc-status 0 trailers:\n%s", v)
	}
	if v := verbose("http://" + s.Addrs()["grpc"] + "/envoy.service.ratelimit.v3.RateLimitService/Nope"); !strings.Contains(v, "grpc-status: 12") {
		t.Errorf("nghttp -v, another method: no grpc-status 12:\n%s", v)
	}
	if !bytes.Contains([]byte(verbose(url)), []byte("END_STREAM")) {
		t.Error("no END_STREAM seen")
	}
}
