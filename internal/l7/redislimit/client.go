package redislimit

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClientOptions are the go-redis client settings a Limiter's decisions
// rely on (docs/l7-redis.md, "Failure policies and the circuit breaker"):
// one dial attempt (go-redis would otherwise retry a refused dial 5 times
// with 100ms backoff inside a decision), no command retries (the breaker
// decides), and timeout bounding a dial, a read and a write alike.
func ClientOptions(addr string, timeout time.Duration) *redis.Options {
	return &redis.Options{
		Addr:          addr,
		DialTimeout:   timeout,
		ReadTimeout:   timeout,
		WriteTimeout:  timeout,
		MaxRetries:    -1,
		DialerRetries: 1,
		PoolSize:      64,
	}
}

// ClientLogger adapts a slog.Logger to go-redis's process-wide logger
// (redis.SetLogger, which edgectl's main sets): its messages become
// structured warnings with the text in "message".
func ClientLogger(l *slog.Logger) interface {
	Printf(ctx context.Context, format string, v ...any)
} {
	return clientLogger{l}
}

type clientLogger struct{ l *slog.Logger }

func (c clientLogger) Printf(ctx context.Context, format string, v ...any) {
	c.l.WarnContext(ctx, "redis client", slog.String("message", fmt.Sprintf(format, v...)))
}
