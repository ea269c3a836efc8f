package rls

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7/l7test"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

const httpPolicy = `
l7:
  trusted_proxies: [198.18.0.0/15]
  rls:
    http_listen: 127.0.0.1:0
    rules:
      - name: nginx-ip
        domain: nginx
        descriptor: [remote_address]
        limits:
          - {name: ip-5m, rate: 5/min, algorithm: fixed-window}
`

// TestHTTPEndpoint is the subrequest endpoint as Traefik's ForwardAuth
// calls it: 200 with the RateLimit headers, then 429 with Retry-After and
// a problem body; a malformed request is 400.
func TestHTTPEndpoint(t *testing.T) {
	clock := new(l7test.ManualClock)
	clock.Set(int64(10 * time.Second))
	s, _ := startServer(t, httpPolicy, clock, nil)
	base := "http://" + s.Addrs()["http"]
	get := func(path string, descs ...string) *http.Response {
		req, _ := http.NewRequest("GET", base+path, nil)
		for _, d := range descs {
			req.Header.Add(DescriptorHeader, d)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res
	}
	for i := range 5 {
		res := get("/v1/check/nginx", "remote_address=192.0.2.10")
		want := fmt.Sprintf(`"ip-5m";r=%d;t=50`, 4-i)
		if res.StatusCode != 200 || res.Header.Get("RateLimit") != want || res.Header.Get("RateLimit-Policy") != `"ip-5m";q=5;w=60` {
			t.Fatalf("request %d: %d %v, want 200 with RateLimit %s", i, res.StatusCode, res.Header, want)
		}
	}
	res := get("/v1/check/nginx", "remote_address=192.0.2.10")
	if res.StatusCode != 429 || res.Header.Get("Retry-After") != "50" || res.Header.Get("RateLimit") != `"ip-5m";r=0;t=50` ||
		res.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("6th: %d %v, want 429 with Retry-After 50 and a problem body", res.StatusCode, res.Header)
	}
	if res := get("/v1/check/nginx?refuse=403", "remote_address=192.0.2.10"); res.StatusCode != 403 || res.Header.Get("Retry-After") != "50" {
		t.Errorf("refuse=403: %d %v, want 403 with Retry-After 50", res.StatusCode, res.Header)
	}
	// Traefik: the client from X-Forwarded-For's last address.
	req, _ := http.NewRequest("GET", base+"/v1/check/nginx?forwarded=1", nil)
	req.Header.Set("X-Forwarded-For", "203.0.113.50, 192.0.2.10, 198.18.0.1") // 198.18.0.0/15 is trusted
	fres, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	fres.Body.Close()
	if fres.StatusCode != 429 || fres.Header.Get("Retry-After") != "50" {
		t.Errorf("forwarded=1 from 192.0.2.10: %d, want 429 (its budget is spent)", fres.StatusCode)
	}
	for _, tc := range []struct {
		path  string
		descs []string
		want  int
	}{
		{"/v1/check/nginx", nil, 400},
		{"/v1/check/nginx", []string{"remote_address"}, 400},
		{"/v1/check/nginx", []string{"remote_address=nope"}, 400},
		{"/v1/check/nginx?refuse=500", []string{"remote_address=192.0.2.1"}, 400},
		{"/v1/check/other", []string{"remote_address=192.0.2.10"}, 200}, // no rule: not limited
		{"/elsewhere", []string{"remote_address=192.0.2.10"}, 404},
		{"/v1/check/nginx?forwarded=1", nil, 400}, // no X-Forwarded-For
	} {
		if res := get(tc.path, tc.descs...); res.StatusCode != tc.want {
			t.Errorf("%s %v: %d, want %d", tc.path, tc.descs, res.StatusCode, tc.want)
		}
	}
}

// startNginx runs Debian's nginx with conf (a full nginx.conf body) in a
// private prefix on loopback until the test ends.
func startNginx(t *testing.T, conf string) {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		for _, p := range []string{"/usr/sbin/nginx", "/sbin/nginx"} {
			if _, serr := os.Stat(p); serr == nil {
				bin, err = p, nil
			}
		}
	}
	if err != nil {
		if testenv.InCI() {
			t.Fatal("nginx not installed (CI=true): scripts/install-deps.sh installs it")
		}
		t.Skip("nginx not installed: apt-get install -y nginx to run the auth_request test")
	}
	dir := t.TempDir()
	_ = os.Chmod(dir, 0o755)
	path := filepath.Join(dir, "nginx.conf")
	conf = strings.ReplaceAll(conf, "PREFIX", dir)
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-t", "-p", dir, "-c", path).CombinedOutput(); err != nil {
		t.Fatalf("nginx -t: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", path, "-g", "daemon off;")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// SIGTERM: the master stops its workers and exits (a SIGKILL
		// would leave the worker behind, orphaned); SIGKILL only if it
		// does not within 5 s.
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("nginx error.log:\n%s", log)
		}
	})
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// nginxConf is an nginx.conf protecting / with the shipped snippets
// (deploy/nginx), proxying to upstream.
func nginxConf(t *testing.T, listen, rlsAddr, upstream string) string {
	t.Helper()
	root, err := filepath.Abs("../../../deploy/nginx")
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`
worker_processes 1;
pid PREFIX/nginx.pid;
error_log PREFIX/error.log warn;
events { worker_connections 256; }
http {
	access_log off;
	client_body_temp_path PREFIX/body;
	proxy_temp_path PREFIX/proxy;
	fastcgi_temp_path PREFIX/fastcgi;
	uwsgi_temp_path PREFIX/uwsgi;
	scgi_temp_path PREFIX/scgi;
	upstream edgeguard_rls { server %s; keepalive 16; }
	upstream app { server %s; keepalive 16; }
	server {
		listen %s;
		include %s/edgeguard-rls.conf;
		location / {
			include %s/edgeguard-rls-check.conf;
			proxy_pass http://app;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
		}
	}
}
`, rlsAddr, upstream, listen, root, root)
}

// TestNginxAuthRequest: a real nginx with the shipped auth_request snippet
// in front of an upstream: a client sees 200s with the RateLimit headers,
// then real 429s with the correct Retry-After and RateLimit headers, never
// a 500.
func TestNginxAuthRequest(t *testing.T) {
	clock := new(l7test.ManualClock)
	clock.Set(int64(10 * time.Second))
	s, _ := startServer(t, httpPolicy, clock, nil)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello from the app\n")
	}))
	t.Cleanup(app.Close)
	listen := freeAddr(t)
	startNginx(t, nginxConf(t, listen, s.Addrs()["http"], strings.TrimPrefix(app.URL, "http://")))
	client := &http.Client{Timeout: 5 * time.Second}
	var res *http.Response
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		if res, err = client.Get("http://" + listen + "/ready-probe"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx did not answer on %s: %v", listen, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	res.Body.Close()
	// The probe took one unit: 4 left of 5.
	seen := map[int]int{}
	for i := range 10 {
		res, err := client.Get("http://" + listen + "/api/items")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		seen[res.StatusCode]++
		switch {
		case i < 4:
			want := fmt.Sprintf(`"ip-5m";r=%d;t=50`, 3-i)
			if res.StatusCode != 200 || string(body) != "hello from the app\n" || res.Header.Get("RateLimit") != want ||
				res.Header.Get("RateLimit-Policy") != `"ip-5m";q=5;w=60` {
				t.Errorf("request %d: %d %q %v, want 200 from the app with RateLimit %s", i, res.StatusCode, body, res.Header, want)
			}
		default:
			if res.StatusCode != 429 || res.Header.Get("Retry-After") != "50" || res.Header.Get("RateLimit") != `"ip-5m";r=0;t=50` ||
				res.Header.Get("RateLimit-Policy") != `"ip-5m";q=5;w=60` || !strings.Contains(string(body), "quota-exceeded") {
				t.Errorf("request %d: %d %q %v, want 429 with Retry-After 50 and the RateLimit headers", i, res.StatusCode, body, res.Header)
			}
		}
	}
	if seen[500] > 0 {
		t.Errorf("the client saw %d 500s", seen[500])
	}
	// The window ends: allowed again.
	clock.Advance(50 * time.Second)
	res, err = client.Get("http://" + listen + "/api/items")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("RateLimit") != `"ip-5m";r=4;t=60` {
		t.Errorf("next window: %d %v, want 200 with r=4", res.StatusCode, res.Header)
	}
	t.Logf("through nginx auth_request: %v (status: count)", seen)
}
