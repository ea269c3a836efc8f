package redislimit

// Time inside the scripts. Redis numbers in Lua are IEEE doubles, exact for
// integers below 2^53. An absolute time in nanoseconds (1.8e18) is not, so:
//   - GCRA keeps its theoretical arrival time (TAT) as "sec:nsec" and works on
//     d = TAT - now in nanoseconds, which is small (at most burst × interval).
//   - The sliding window counter works in microseconds since the Unix epoch
//     (1.8e15 < 2^53, exact) and checks limit × window_us < 2^53 in Go.
//
// Every quantity the scripts compute is an integer; divisions go through
// fdiv, which corrects the rounded quotient so the floor is exact.
//
// ARGV[1], ARGV[2]: "" and "" to read the server's clock with TIME (normal
// operation), or unix seconds and nanoseconds to script a timeline in tests.
const luaPrelude = `
redis.replicate_commands()
local function fdiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1 elseif r >= b then q = q + 1 end
  return q
end
local now_s, now_ns
if ARGV[1] == "" then
  local t = redis.call("TIME")
  now_s = tonumber(t[1])
  now_ns = tonumber(t[2]) * 1000
else
  now_s = tonumber(ARGV[1])
  now_ns = tonumber(ARGV[2])
end
local now_us = now_s * 1000000 + fdiv(now_ns, 1000)

-- swc_load reads a sliding-window-counter state "idx:prev:curr" for the
-- window of length W (µs) that contains now. prev is the count of window
-- idx-1, curr of window idx; r is the position of now inside window idx.
local function swc_load(v, W)
  local idx = fdiv(now_us, W)
  local r = now_us - idx * W
  local prev, curr = 0, 0
  if v then
    local si, sp, sc = string.match(v, "^(%-?%d+):(%d+):(%d+)$")
    if si then
      si = tonumber(si)
      if si == idx then
        prev = tonumber(sp)
        curr = tonumber(sc)
      elseif si == idx - 1 then
        prev = tonumber(sc)
      end
    end
  end
  return idx, r, prev, curr
end

-- swc_remaining is limit minus the estimate prev × (W - r) / W + curr,
-- rounded so that the estimate is never under-counted.
local function swc_remaining(limit, W, r, prev, curr)
  return fdiv(limit * W - prev * (W - r), W) - curr
end

local function swc_store(key, W, idx, r, prev, curr)
  redis.call("SET", key, idx .. ":" .. prev .. ":" .. curr, "PX", math.ceil((2 * W - r) / 1000))
end
`

// decideSource decides a batch of requests, each all-or-nothing over its
// limits, in order. ARGV[3] is k, the number of limits per request; KEYS
// holds k keys per request (request q's limit i is KEYS[(q-1)k+i]).
// ARGV[4+4(i-1) .. 7+4(i-1)] are limit i's algorithm (1 GCRA, 2 sliding
// window counter), two parameters and its cost:
//
//	GCRA: emission interval T (ns), burst B (requests)
//	SWC:  window W (µs), limit L (requests)
//
// For each request, phase one computes every limit without writing; phase
// two writes the new states only if every limit allows, so a rejected
// request charges nothing. One request alone is a batch of one; a batch is
// one atomic script run, so requests later in it see earlier ones' charges.
//
// A GCRA state is "sec:nsec:refunds": the TAT and how many refunds were
// applied to it (see refundSource; an old "sec:nsec" reads as 0 refunds).
//
// Reply, per request: {committed, now_s, now_ns, then per limit: allowed,
// remaining, reset_ns, retry_ns, before_ns, refunds}. When nothing was
// committed, remaining and reset describe the state as it is (not charged)
// and retry_ns is set for the limits that refused. before_ns is the reset
// before the charge (for GCRA the TAT before the charge minus now, at least
// 0). now_s, now_ns (the script's time), before_ns and refunds (GCRA: the
// state's refund count) are what refundSource needs to give a committed
// charge back.
const decideSource = luaPrelude + `
local k = tonumber(ARGV[3])
local alg, pa, pb, pc = {}, {}, {}, {}
for i = 1, k do
  local o = 3 + (i - 1) * 4
  alg[i] = tonumber(ARGV[o + 1])
  pa[i] = tonumber(ARGV[o + 2])
  pb[i] = tonumber(ARGV[o + 3])
  pc[i] = tonumber(ARGV[o + 4])
end
local reply = {}
for base = 0, #KEYS - k, k do
  local all = 1
  local out = {}
  local writes = {}
  for i = 1, k do
    local key = KEYS[base + i]
    local a, b, cost = pa[i], pb[i], pc[i]
    local v = redis.call("GET", key)
    if alg[i] == 1 then
      local T, burst = a, b
      local d, ep = 0, 0
      if v then
        local ts, tn, te = string.match(v, "^(%-?%d+):(%d+):?(%d*)$")
        if ts then
          d = (tonumber(ts) - now_s) * 1000000000 + (tonumber(tn) - now_ns)
          ep = tonumber(te) or 0
        end
      end
      if d < 0 then d = 0 end
      local nd = d + T * cost
      local wait = nd - burst * T
      local rem_before = fdiv(burst * T - d, T)
      if rem_before < 0 then rem_before = 0 end
      if wait > 0 then
        all = 0
        out[i] = {0, rem_before, d, wait, rem_before, d, 0, ep}
      else
        out[i] = {1, fdiv(-wait, T), nd, 0, rem_before, d, 0, ep}
        writes[i] = nd
      end
    else
      local W, limit = a, b
      local idx, r, prev, curr = swc_load(v, W)
      local rem = swc_remaining(limit, W, r, prev, curr)
      local function reset_us(c)
        if c > 0 then return (W - r) + W end
        if prev > 0 then return W - r end
        return 0
      end
      if rem < cost then
        all = 0
        local retry
        local avail = limit - curr - cost
        if avail >= 0 then
          retry = W - fdiv(avail * W, prev) - r
        elseif curr <= limit - cost then
          retry = W - r
        else
          retry = (W - r) + W - fdiv((limit - cost) * W, curr)
        end
        if rem < 0 then rem = 0 end
        out[i] = {0, rem, reset_us(curr) * 1000, retry * 1000, rem, reset_us(curr) * 1000, 0, 0}
      else
        out[i] = {1, rem - cost, reset_us(curr + cost) * 1000, 0, rem, reset_us(curr) * 1000, 0, 0}
        writes[i] = {idx, r, prev, curr + cost, W}
      end
    end
  end
  reply[#reply + 1] = all
  reply[#reply + 1] = now_s
  reply[#reply + 1] = now_ns
  for i = 1, k do
    local e = out[i]
    if all == 1 then
      local w = writes[i]
      if type(w) == "table" then
        swc_store(KEYS[base + i], w[5], w[1], w[2], w[3], w[4])
      else
        local t = now_ns + w
        local ts = now_s + fdiv(t, 1000000000)
        local tn = t - fdiv(t, 1000000000) * 1000000000
        redis.call("SET", KEYS[base + i], ts .. ":" .. tn .. ":" .. e[8], "PX", math.max(1, math.ceil(w / 1000000)))
      end
      reply[#reply + 1] = 1
      reply[#reply + 1] = e[2]
      reply[#reply + 1] = e[3]
      reply[#reply + 1] = 0
    else
      reply[#reply + 1] = e[1]
      reply[#reply + 1] = e[5]
      reply[#reply + 1] = e[6]
      reply[#reply + 1] = e[4]
    end
    reply[#reply + 1] = e[6]
    reply[#reply + 1] = e[8]
  end
end
return reply
`

// refundSource gives back one request's committed charge (see
// l7.Algorithm.Refund for why each step never admits more than the limit's
// definition without the refunded request). KEYS: the request's keys, as
// for decideSource. ARGV[3] k, ARGV[4] and ARGV[5] the decide script's time
// (seconds, nanoseconds), then per limit ARGV[6+6(i-1) ..]: algorithm, two
// parameters and cost as in decideSource, then before_ns and refunds from
// the decide reply.
//
//	GCRA: seen from now, the charge raised max(TAT, now) by
//	      R = max(after-now, 0) - max(before-now, 0); R comes off the
//	      current TAT unless another refund came in between (the refund
//	      count moved), which would make before and after stale; then the
//	      charge stays (the strict side).
//	SWC:  the cost leaves the count of the window it was charged to if that
//	      window is still the current or the previous one.
//
// Reply: the number of limits that gave something back.
const refundSource = luaPrelude + `
local k = tonumber(ARGV[3])
local t0_s, t0_ns = tonumber(ARGV[4]), tonumber(ARGV[5])
local t0_us = t0_s * 1000000 + fdiv(t0_ns, 1000)
local off = (t0_s - now_s) * 1000000000 + (t0_ns - now_ns)
local given = 0
for i = 1, k do
  local o = 5 + (i - 1) * 6
  local alg, a, b, cost = tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4])
  local before, ep = tonumber(ARGV[o + 5]), tonumber(ARGV[o + 6])
  local key = KEYS[i]
  local v = redis.call("GET", key)
  if v and alg == 1 then
    local ts, tn, te = string.match(v, "^(%-?%d+):(%d+):?(%d*)$")
    if ts and (tonumber(te) or 0) == ep then
      local cur = (tonumber(ts) - now_s) * 1000000000 + (tonumber(tn) - now_ns)
      local r = math.max(off + before + a * cost, 0) - math.max(off + before, 0)
      if r > 0 then
        local nd = math.max(cur, 0) - r
        if nd <= 0 then nd = 0 end
        local t = now_ns + nd
        local s2 = now_s + fdiv(t, 1000000000)
        local n2 = t - fdiv(t, 1000000000) * 1000000000
        redis.call("SET", key, s2 .. ":" .. n2 .. ":" .. (ep + 1), "PX", math.max(1, math.ceil(nd / 1000000)))
        given = given + 1
      end
    end
  elseif v and alg == 2 then
    local W = a
    local idx0 = fdiv(t0_us, W)
    local idx, r, prev, curr = swc_load(v, W)
    local changed = false
    if idx == idx0 and curr > 0 then
      curr = math.max(curr - cost, 0)
      changed = true
    elseif idx == idx0 + 1 and prev > 0 then
      prev = math.max(prev - cost, 0)
      changed = true
    end
    if changed then
      swc_store(key, W, idx, r, prev, curr)
      given = given + 1
    end
  end
end
return given
`

// leaseSource syncs one hybrid-mode instance with the shared sliding window
// counter of one key and grants it a new local allowance.
//
// KEYS[1]: the same state a plain sliding-window rule uses.
// ARGV[3] W (µs), ARGV[4] limit, ARGV[5] used: requests this instance admitted
// since its last sync (a count, added unconditionally: they happened),
// ARGV[6] max lease L, ARGV[7] share S, ARGV[8] need: the cost of the
// request that asked (its hits_addend; 1 for background syncs), ARGV[9]
// the window index the used count was admitted in (-1: count it in now's
// window) and ARGV[10] a count admitted in the window before that one: a
// single host reports its admissions in the windows they happened in
// (counts of a window that has slid out are dropped: they no longer weigh).
//
// The grant is min(L, ceil(remaining / S)), raised to need when remaining
// covers need (a request costing more than L still passes while the window
// has room for it), and is not charged: it is paid for by the counts the
// next sync brings.
// Reply: {grant, remaining, retry_ns, reset_ns, need_retry_ns, idx, r, prev,
// curr}: retry_ns is when one more request fits (0 unless nothing does),
// need_retry_ns when need more fit (0 unless remaining < need); then the
// window's state after the count was added (window index, position in it
// in µs, the previous and current windows' counts), from which a single
// host (S = 1) decides between syncs as the window slides.
const leaseSource = luaPrelude + `
local W = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local used = tonumber(ARGV[5])
local maxLease = tonumber(ARGV[6])
local share = tonumber(ARGV[7])
local need = tonumber(ARGV[8])
local uidx = tonumber(ARGV[9])
local uprev = tonumber(ARGV[10])
local idx, r, prev, curr = swc_load(redis.call("GET", KEYS[1]), W)
if used > 0 or uprev > 0 then
  if uidx < 0 or uidx >= idx then
    curr = curr + used
    prev = prev + uprev
  elseif uidx == idx - 1 then
    prev = prev + used
  end
  swc_store(KEYS[1], W, idx, r, prev, curr)
end
local rem = swc_remaining(limit, W, r, prev, curr)
local function retry_for(cost)
  if rem >= cost then return 0 end
  local avail = limit - curr - cost
  if avail >= 0 then
    return (W - fdiv(avail * W, prev) - r) * 1000
  elseif curr <= limit - cost then
    return (W - r) * 1000
  end
  return ((W - r) + W - fdiv((limit - cost) * W, curr)) * 1000
end
if rem <= 0 then
  return {0, 0, retry_for(1), (2 * W - r) * 1000, retry_for(need), idx, r, prev, curr}
end
-- The reset the grant's requests see: the request that asked for it
-- (need > 0) is charged in this window, as the local sliding window
-- reports it after its charge.
local reset = 0
if curr > 0 or need > 0 then reset = 2 * W - r elseif prev > 0 then reset = W - r end
local grant = fdiv(rem + share - 1, share)
if grant > maxLease then grant = maxLease end
if grant < need and rem >= need then grant = need end
return {grant, rem, 0, reset * 1000, retry_for(need), idx, r, prev, curr}
`
