package fleet

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/policy"
)

// NewClient connects to the fleet's Redis (one server, or a Redis Cluster
// through its seeds) with the policy's AUTH and TLS settings. Like the L7
// stage's client (redislimit.ClientOptions): one dial attempt, no command
// retries (the sync loop retries on its own schedule) and the timeout on
// every dial, read and write, so a Redis that hangs costs one timeout per
// interval and never stalls enforcement.
func NewClient(r policy.FleetRedis) (redis.UniversalClient, error) {
	if len(r.Addrs) == 0 {
		return nil, errors.New("fleet redis: no address")
	}
	o := &redis.UniversalOptions{
		Addrs:         r.Addrs,
		IsClusterMode: r.Cluster,
		DB:            r.DB,
		Username:      r.Username,
		DialTimeout:   r.Timeout,
		ReadTimeout:   r.Timeout,
		WriteTimeout:  r.Timeout,
		MaxRetries:    -1,
		DialerRetries: 1,
		PoolSize:      8,
	}
	if r.PasswordFile != "" {
		b, err := os.ReadFile(r.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("fleet redis password_file: %w", err)
		}
		o.Password = strings.TrimRight(string(b), "\r\n")
	}
	if r.TLS != nil {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: r.TLS.ServerName}
		if r.TLS.CAFile != "" {
			pem, err := os.ReadFile(r.TLS.CAFile)
			if err != nil {
				return nil, fmt.Errorf("fleet redis tls ca_file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("fleet redis tls ca_file %s: no PEM certificate in it", r.TLS.CAFile)
			}
			tc.RootCAs = pool
		}
		if r.TLS.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(r.TLS.CertFile, r.TLS.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("fleet redis tls client certificate: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		o.TLSConfig = tc
	}
	if r.Cluster {
		return redis.NewClusterClient(o.Cluster()), nil
	}
	return redis.NewClient(o.Simple()), nil
}
