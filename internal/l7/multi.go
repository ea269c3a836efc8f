package l7

import "sync"

// MaxChecks is the most limits one request is checked against at once.
const MaxChecks = 8

// Check is one limit of a multi-limit request: n units of key in store.
// Reserve is the units of the limit a request outside the first class of
// the L7 ranking may not use (Rule.Reserve; takeOutsideReserve); takeAll
// ignores it.
type Check struct {
	Store   *Store
	Key     uint64
	N       int64
	Reserve int64
}

// takeAll applies several limits all-or-nothing: the request is charged
// on every check only if every check allows it; if any rejects, nothing is
// charged anywhere. It locks every shard involved (in a global order: store
// id, then shard, so concurrent calls cannot deadlock), decides and writes
// under those locks, and rolls back on failure, so two concurrent requests
// can neither lose an update nor observe a charge that is later undone.
// out[i] receives the decision of checks[i]; for a rejected request the
// decisions of the checks that passed report their uncharged state.
// len(checks) must be at most MaxChecks and len(out) at least len(checks).
// full, if not nil, marks the checks rejected only
// because their store was full (StoreConfig.FailClosed); charges, if not
// nil, receives what an admitted request wrote, for refundAll.
func takeAll(now int64, checks []Check, out []Decision, full *[MaxChecks]bool, charges *[MaxChecks]undo) bool {
	if len(checks) > MaxChecks {
		panic("l7: takeAll: more than MaxChecks checks")
	}
	if len(checks) == 1 {
		// One limit: its shard lock alone makes it atomic.
		c := checks[0]
		key := normKey(c.Key)
		sh := &c.Store.shards[c.Store.shardIndex(key)]
		var u *undo
		if charges != nil {
			u = &charges[0]
		}
		sh.mu.Lock()
		ok := c.Store.takeLocked(sh, key, now, c.N, u, &out[0])
		sh.mu.Unlock()
		if full != nil {
			full[0] = !ok
		}
		return out[0].Allowed
	}
	var shards [MaxChecks]*storeShard
	var keys [MaxChecks]uint64
	locks, nlocks := lockShards(checks, &shards, &keys)
	var undos [MaxChecks]undo
	allowed := true
	for i, c := range checks {
		var ok bool
		ok = c.Store.takeLocked(shards[i], keys[i], now, c.N, &undos[i], &out[i])
		if !ok || !out[i].Allowed {
			allowed = false
		}
		if full != nil {
			full[i] = !ok
		}
	}
	if !allowed {
		for i := len(checks) - 1; i >= 0; i-- {
			undos[i].rollback()
		}
		for i, c := range checks {
			if out[i].Allowed {
				c.Store.takeLocked(shards[i], keys[i], now, 0, nil, &out[i])
			}
		}
	} else if charges != nil {
		*charges = undos
	}
	for i := nlocks - 1; i >= 0; i-- {
		locks[i].Unlock()
	}
	return allowed
}

// refundAll gives back the charges an admitted takeAll recorded, under the
// same shard locks, at a time read from clock once they are held (so no
// request applied to these keys is later than it), and reports each
// check's state after the refund in out.
func refundAll(clock Clock, checks []Check, charges *[MaxChecks]undo, out []Decision) {
	var shards [MaxChecks]*storeShard
	var keys [MaxChecks]uint64
	locks, nlocks := lockShards(checks, &shards, &keys)
	now := clock.Now()
	for i := len(checks) - 1; i >= 0; i-- {
		checks[i].Store.refundLocked(shards[i], keys[i], &charges[i], now)
	}
	for i, c := range checks {
		c.Store.takeLocked(shards[i], keys[i], now, 0, nil, &out[i])
		charges[i] = undo{}
	}
	for i := nlocks - 1; i >= 0; i-- {
		locks[i].Unlock()
	}
}

// lockShards locks the shards of checks in a global order (store id, then
// shard), each once, and returns them for unlocking in reverse; shards and
// keys receive each check's shard and normalized key.
func lockShards(checks []Check, shards *[MaxChecks]*storeShard, keys *[MaxChecks]uint64) ([MaxChecks]*sync.Mutex, int) {
	type lockRef struct {
		id    uint64
		shard int
		sh    *storeShard
	}
	var locks [MaxChecks]lockRef
	nlocks := 0
	for i, c := range checks {
		keys[i] = normKey(c.Key)
		idx := c.Store.shardIndex(keys[i])
		sh := &c.Store.shards[idx]
		shards[i] = sh
		ref := lockRef{id: c.Store.id, shard: idx, sh: sh}
		// Insertion sort by (id, shard), dropping duplicates.
		j := nlocks
		dup := false
		for j > 0 {
			p := locks[j-1]
			if p.sh == sh {
				dup = true
				break
			}
			if p.id < ref.id || (p.id == ref.id && p.shard < ref.shard) {
				break
			}
			j--
		}
		if dup {
			continue
		}
		copy(locks[j+1:nlocks+1], locks[j:nlocks])
		locks[j] = ref
		nlocks++
	}
	var mus [MaxChecks]*sync.Mutex
	for i := range nlocks {
		mus[i] = &locks[i].sh.mu
		mus[i].Lock()
	}
	return mus, nlocks
}
