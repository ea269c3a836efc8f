package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// publishLists writes this host's queued list changes: the stream entry
// and the snapshot field in one transaction (both keys share a slot).
func (f *Fleet) publishLists(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-f.pub:
			if err := f.publish(ctx, e); err != nil {
				f.stats.publishFailed.Inc()
				f.log.Warn("fleet: list change not published; the next resync publishes it", "prefix", e.Prefix, "err", err)
				// Have the follower resync (and republish) as soon as it can.
				select {
				case f.kick <- struct{}{}:
				default:
				}
			}
		}
	}
}

// publish writes one change. An addition is refused when the snapshot
// already holds maxSnapshot entries.
func (f *Fleet) publish(ctx context.Context, e ListEntry) error {
	ctx, cancel := context.WithTimeout(ctx, 4*f.o.Interval)
	defer cancel()
	if e.Op == OpAdd {
		n, err := f.o.Client.HLen(ctx, f.k.snap).Result()
		if err != nil {
			return err
		}
		if n >= maxSnapshot {
			return fmt.Errorf("the fleet snapshot holds %d entries, at most %d", n, maxSnapshot)
		}
	}
	data := e.Encode()
	_, err := f.o.Client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.XAdd(ctx, &redis.XAddArgs{Stream: f.k.stream, MaxLen: streamMaxLen, Approx: true, Values: []any{"e", data}})
		if e.Op == OpAdd {
			p.HSet(ctx, f.k.snap, e.field(), data)
		} else {
			p.HDel(ctx, f.k.snap, e.field())
		}
		return nil
	})
	if err == nil {
		f.stats.published.Inc()
	}
	return err
}

// followLists keeps this host's copy of the fleet's lists: load the
// snapshot (after noting the stream's last id, so nothing written
// meanwhile is missed), reconcile this host's own entries with it, then
// follow the stream. Any error, a kick from a failed publish, or every
// resyncEvery intervals starts over from the snapshot.
func (f *Fleet) followLists(ctx context.Context) {
	backoff := f.o.Interval
	for ctx.Err() == nil {
		last, err := f.resync(ctx)
		if err != nil {
			f.setListSynced(false)
			f.setRedis(err)
			if !sleep(ctx, backoff) {
				return
			}
			continue
		}
		f.setListSynced(true)
		err = f.follow(ctx, last)
		if err != nil && ctx.Err() == nil {
			f.setListSynced(false)
			f.setRedis(err)
			if !sleep(ctx, backoff) {
				return
			}
		}
	}
}

func (f *Fleet) setListSynced(v bool) {
	f.mu.Lock()
	f.st.listSynced = v
	f.mu.Unlock()
}

// resync loads the snapshot and reconciles this host's entries. It
// returns the stream id to follow from.
func (f *Fleet) resync(ctx context.Context) (string, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*f.o.Interval)
	defer cancel()
	c := f.o.Client
	last := "0-0"
	tail, err := c.XRevRangeN(rctx, f.k.stream, "+", "-", 1).Result()
	if err != nil {
		return "", fmt.Errorf("read the list stream: %w", err)
	}
	if len(tail) == 1 {
		last = tail[0].ID
	}
	now := f.o.Now()
	snap, expired, err := f.readSnapshot(rctx, now)
	if err != nil {
		return "", err
	}
	if len(expired) > 0 {
		// Any host may prune: HDEL of a field another host just
		// rewrote is harmless (it is written again on its next
		// change), and expired entries are ignored on read anyway.
		if err := c.HDel(rctx, f.k.snap, expired...).Err(); err != nil {
			return "", fmt.Errorf("prune the list snapshot: %w", err)
		}
	}
	var remote []ListEntry
	mine := map[string]ListEntry{}
	for _, e := range snap {
		if e.Host == f.o.Host {
			mine[e.field()] = e
			continue
		}
		remote = append(remote, e)
	}
	if err := f.applyRemote(remote, true, now); err != nil {
		return "", err
	}
	// Reconcile: what this host holds and the snapshot lacks (added while
	// Redis was away, or a refresh) is published; what the snapshot holds
	// in this host's name and the host no longer has is removed.
	local := map[string]ListEntry{}
	for _, e := range f.o.Lists.Local() {
		e.Op, e.Host = OpAdd, f.o.Host
		if e.At.IsZero() {
			e.At = now
		}
		local[e.field()] = e
	}
	for field, e := range local {
		if e.Expired(now) {
			continue
		}
		if have, ok := mine[field]; ok && have.Expires.Equal(e.Expires.Truncate(time.Millisecond)) {
			continue
		}
		if err := f.publish(ctx, e); err != nil {
			return "", fmt.Errorf("republish %s: %w", e.Prefix, err)
		}
	}
	for field, e := range mine {
		if _, ok := local[field]; ok {
			continue
		}
		e.Op, e.At = OpDel, now
		if err := f.publish(ctx, e); err != nil {
			return "", fmt.Errorf("withdraw %s: %w", e.Prefix, err)
		}
	}
	f.setRedis(nil)
	return last, nil
}

// readSnapshot reads the snapshot hash, at most maxSnapshot entries, with
// the fields of expired additions (to prune). Malformed fields are counted
// and skipped.
func (f *Fleet) readSnapshot(ctx context.Context, now time.Time) ([]ListEntry, []string, error) {
	var out []ListEntry
	var expired []string
	var cursor uint64
	for {
		kv, next, err := f.o.Client.HScan(ctx, f.k.snap, cursor, "", 1000).Result()
		if err != nil {
			return nil, nil, fmt.Errorf("read the list snapshot: %w", err)
		}
		for i := 0; i+1 < len(kv); i += 2 {
			e, err := DecodeEntry([]byte(kv[i+1]), now)
			if err != nil || e.Op != OpAdd || e.field() != kv[i] {
				f.stats.malformed.Inc()
				f.log.Warn("fleet: malformed list snapshot entry skipped", "field", trim(kv[i]), "err", err)
				continue
			}
			if e.Expired(now) {
				expired = append(expired, kv[i])
				continue
			}
			if len(out) >= maxSnapshot {
				return out, expired, nil
			}
			out = append(out, e)
		}
		cursor = next
		if cursor == 0 {
			return out, expired, nil
		}
	}
}

// follow reads the stream from last until an error, a kick or the next
// periodic resync.
func (f *Fleet) follow(ctx context.Context, last string) error {
	resyncAt := f.o.Now().Add(resyncEvery * f.o.Interval)
	block := min(f.o.Interval, time.Second)
	for ctx.Err() == nil {
		select {
		case <-f.kick:
			return nil
		default:
		}
		if f.o.Now().After(resyncAt) {
			return nil
		}
		// The read timeout covers the block on top of the round trip.
		rctx, cancel := context.WithTimeout(ctx, block+4*f.o.Interval)
		res, err := f.o.Client.XRead(rctx, &redis.XReadArgs{Streams: []string{f.k.stream, last}, Count: readBatch, Block: block}).Result()
		cancel()
		if errors.Is(err, redis.Nil) {
			f.setRedis(nil)
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("follow the list stream: %w", err)
		}
		f.setRedis(nil)
		now := f.o.Now()
		var batch []ListEntry
		for _, s := range res {
			for _, m := range s.Messages {
				last = m.ID
				raw, _ := m.Values["e"].(string)
				e, err := DecodeEntry([]byte(raw), now)
				if err != nil || len(m.Values) != 1 {
					f.stats.malformed.Inc()
					f.log.Warn("fleet: malformed list stream entry skipped", "id", m.ID, "err", err)
					continue
				}
				if e.Host == f.o.Host || (e.Op == OpAdd && e.Expired(now)) {
					continue
				}
				batch = append(batch, e)
			}
		}
		if len(batch) > 0 {
			if err := f.applyRemote(batch, false, now); err != nil {
				return err
			}
		}
	}
	return nil
}

// applyRemote hands entries to the daemon and records the outcome.
func (f *Fleet) applyRemote(entries []ListEntry, replace bool, now time.Time) error {
	remote, refused, err := f.o.Lists.ApplyRemote(entries, replace)
	if err != nil {
		return fmt.Errorf("apply fleet list entries: %w", err)
	}
	for _, r := range refused {
		f.log.Warn("fleet: list entry refused", "list", r.Entry.List, "prefix", r.Entry.Prefix, "host", r.Entry.Host,
			"origin", r.Entry.Origin, "err", r.Err)
	}
	f.stats.refused.Add(float64(len(refused)))
	f.stats.applied.Add(float64(len(entries) - len(refused)))
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.remote = remote
	if !replace && len(entries) > 0 {
		newest := entries[len(entries)-1]
		f.st.lastChange = now
		f.st.lag = max(now.Sub(newest.At), 0)
		f.stats.lag.Set(f.st.lag.Seconds())
	}
	return nil
}

func trim(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
