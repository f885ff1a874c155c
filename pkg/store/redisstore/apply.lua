-- apply.lua applies the charges of one decision atomically: limit.Store's
-- contract, run as limit.Counter (algo.go) runs it, step for step, so that
-- this store and memstore agree to the millisecond and the bit. Time comes
-- from the caller; the script never reads the server clock.
--
-- The file defines apply(keys, argv); its top level only defines
-- constants and functions. script.go makes it a script (ending "return
-- apply(KEYS, ARGV)") and a function library (registering apply), so that
-- Redis 7 runs the top level once, at FUNCTION LOAD, not on every call.
-- There the top level sees no global but redis (not math, string or
-- cmsgpack: the functions read those when called), and per-call state
-- lives in apply's locals and in now and mode, which apply sets first.
--
-- KEYS: the decision's distinct counter keys (all in one cluster slot).
-- ARGV[1]: mode: "apply", "try", "undo" or "void" (below).
-- ARGV[2]: now, integer Unix milliseconds.
-- ARGV[3]: n, the number of charges; then 8 values per charge, then the
-- number of fair entries and 11 values each (see "Fair share" below and
-- apply), then, for undo, one value per key:
--   key index into KEYS, kind, amount, p1, p2, p3, cost, flags
--   kind "s", sliding window: p1 = bucket width w, p2 = M, p3 = At (0: unset)
--   kind "f", fixed window:   p1 = window W,       p2 = 0, p3 = 0
--   kind "i", fixed window counted in the key of its own window (below):
--                             p1 = window W,       p2 = 0, p3 = 0
--   kind "t", token bucket:   p1 = window W,       p2 = burst B, p3 = 0
--   kind "c", concurrency:    p1 = lease W,        p2 = 0, p3 = member
--   kind "o", once:           p1 = mark W,         p2 = 0, p3 = 0
--   flags: "" or any of "s" (Shadow) and "f" (Force)
--
-- State. A window is a string, the MessagePack array {w, h, c0, c1, ...}:
-- w the width its buckets are counted in, h its high-water bucket index,
-- and ci the count of bucket h-i, with no trailing zeros. Every bucket a
-- window keeps is in [h-M, h], so the array is dense and short, and one
-- GET and one SET read and write it (a hash of bucket fields took three
-- or four commands and most of the script's time to parse and diff). A
-- token bucket is the string "At:Debt": tat = At + Debt, At the integer
-- ms of the last write, Debt the float ms the bucket was then short of
-- full.
-- A kind "i" fixed window is the decimal integer count of one window, at a
-- key of that window's own (the caller names it, see counts below): it
-- is charged as a fixed window of one bucket, the window now is in, and
-- saved as its count, or deleted at 0, expiring a margin after the
-- window ends.
-- Concurrency leases are a sorted set, member -> deadline (ms): the live
-- ones are those scored above now, and every write first drops the rest
-- (ZREMRANGEBYSCORE), as limit.Counter drops them on every step. A Once
-- mark is the string of its deadline (ms). Every key written expires once
-- its counter is equivalent to a fresh one (a sorted set: its latest
-- deadline), plus ttlMargin: Redis expires keys by its own clock, and the
-- replicas that pass now may be a little behind it.
--
-- Reply: {admitted (1 or 0), then 4 values per charge}: fits (1 or 0),
-- retry after (ms), then, after the whole Apply, for a window its usage
-- and reset after (ms), for a token bucket its Debt at now (a string: a
-- Lua number becomes an integer in a reply) and 0, for concurrency the
-- live leases and the time until the earliest deadline, for Once 0 and 0.
--
-- A Once charge with cost >= 0 that does not fit voids the call: nothing
-- is written and every counter reports as stored. "void" evaluates the
-- charges as a voided "apply" does, whatever they find.
--
-- A fair-shared charge (a fair entry names it) is gated before its step:
-- with fairGate's denial it does not fit, its counter is not stepped and
-- its retry after is fairRetry's. Once the verdict is known every fair
-- charge is recorded in its state (KEYS holds the state's key too), even
-- when the decision is denied; not when it is void. A try that admits
-- records the admission and gives undo the state a denial elsewhere
-- would have recorded, which undo puts back if no decision has changed
-- the state since.
--
-- A Redis Cluster decision whose keys span slots runs "try" on each slot:
-- "apply", plus, when the slot admits, 1 value per key that "undo" needs
-- to take back what the slot kept if another slot denies. "undo" takes
-- the same charges at the same now, then those values, one per key, and
-- leaves each key as a denied "apply" would have, except Once marks: a
-- try holds either Once charges only or none, and one with Once charges
-- is undone only when the decision is void, so undo puts a mark back as
-- it was before the try, if it is still the one the try left.

local ttlMargin = 1000
-- eps = B*T / 2^32: the token bucket's tolerance, as in algo.go.
local tbEps = 1 / 4294967296
-- maxBuckets is limit.MaxBuckets: no window counts more than M+1 <= 601
-- buckets.
local maxBuckets = 600
-- maxCount is limit.MaxCount (2^53, exact in a double): counts, usage and
-- a charge's |cost| saturate there. maxDebt is limit.MaxWindow in ms: a
-- token bucket's debt and retry after saturate there.
local maxCount = 9007199254740992
local maxDebt = 9223372036854

-- The call's mode and now, set first by apply.
local mode, now

-- The library functions used most, bound by apply's first call (the top
-- level sees none of them): an upvalue is one step for Lua where
-- math.floor is two table look-ups.
local floor, ceil, min, max, mpack, munpack, sformat

local function bind()
  floor, ceil, min, max = math.floor, math.ceil, math.min, math.max
  mpack, munpack, sformat = cmsgpack.pack, cmsgpack.unpack, string.format
end

local function fmtint(x) return sformat('%d', x) end
local function fmtfloat(x) return sformat('%.17g', x) end

local function fail(key, what)
  error({err = 'ERR tollgate apply: ' .. key .. ' ' .. what})
end

-- Counters, one per key index: {key, type, stored, work, exists}, type
-- "window", "token", "lease" or "mark"; exists says whether the key held
-- state. A window counter is the array of its string, {w, h, c0, c1, ...}
-- ({0, 0} when fresh: no width); a token bucket counter is {at, debt}; a
-- lease counter is {l}, l its live leases {member, deadline}; a mark
-- counter is {untl}, the mark's deadline or nil.

-- Windows ---------------------------------------------------------------

-- A window counter c: c[1] is the width, c[2] the high-water index h,
-- and c[3 + i] the count of bucket h - i.

-- loadWindow returns the stored counter, whether the key exists, and the
-- string it holds (save writes only a counter whose string differs). raw
-- is GET's reply when the caller has it already.
local function loadWindow(key, raw)
  if raw == nil then raw = redis.pcall('GET', key) end
  if raw == false then return {0, 0}, false, nil end
  -- A table is WRONGTYPE: a key of another type.
  if type(raw) ~= 'string' then fail(key, 'does not hold a window') end
  local ok, c = pcall(munpack, raw)
  if not ok or type(c) ~= 'table' or type(c[1]) ~= 'number' or c[1] <= 0 or type(c[2]) ~= 'number' then
    fail(key, 'does not hold a window')
  end
  local n = #c
  for i = 3, n do
    local v = c[i]
    if type(v) ~= 'number' or v < 0 then fail(key, 'does not hold a window') end
  end
  if n > 3 + maxBuckets then fail(key, 'does not hold a window') end
  return c, true, raw
end

-- parseCount is the count a kind "i" key holds (GET's reply raw); nil
-- when raw is not one.
local function parseCount(raw)
  local n = type(raw) == 'string' and tonumber(raw)
  if not n or n < 0 or n ~= floor(n) or n > maxCount then return nil end
  return n
end

-- loadCount reads a kind "i" window of width w at key, the count of the
-- window now is in, as a window counter (see loadWindow), and returns the
-- key it read. When the next window's key exists (its name is key's with
-- the next index), a replica whose clock is ahead has started it: the
-- count is that window's, as a window's high-water mark makes it
-- (view). A replica further behind than one window counts in its own.
local function loadCount(key, w)
  local pre, idx = string.match(key, '^(.*#)(-?%d+)$')
  local cur = floor(now / w)
  if pre ~= nil then
    local nk = pre .. fmtint(tonumber(idx) + 1)
    local raw = redis.pcall('GET', nk)
    if raw ~= false then key, cur = nk, cur + 1 end
  end
  local raw = redis.pcall('GET', key)
  if raw == false then return {0, 0}, false, nil, key end
  local n = parseCount(raw)
  if n == nil then fail(key, 'does not hold a count') end
  local c = {w, cur}
  if n > 0 then c[3] = n end
  return c, true, raw, key
end

-- touch makes c a window of width w whose high-water mark is at least
-- now's bucket, and drops the buckets older than high-M.
local function touch(c, w, m)
  local cur = floor(now / w)
  local n = #c
  if c[1] ~= w then
    -- Fresh, or counted in another width: start over.
    for i = n, 3, -1 do c[i] = nil end
    c[1], c[2], n = w, cur, 2
  end
  local s = cur - c[2]
  if s > 0 then
    c[2] = cur
    if s > m then
      for i = n, 3, -1 do c[i] = nil end
      n = 2
    elseif n > 2 then
      -- Every bucket moves s places older; those past M drop out.
      local last = min(n + s, 3 + m)
      for i = last, 3 + s, -1 do c[i] = c[i - s] end
      for i = 3, min(2 + s, last) do c[i] = 0 end
      for i = n, last + 1, -1 do c[i] = nil end
      n = last
    end
  end
  for i = n, 4 + m, -1 do c[i] = nil end
end

-- view is c as one charge sees it: cur = max(floor(now/w), h), and
-- c[3..top] are the counted buckets, [cur-M, cur] (top < 3: none, as
-- when c has another width).
local function view(c, w, m)
  local cur = floor(now / w)
  if c[1] ~= w then return cur, 2 end
  local high = c[2]
  if high > cur then cur = high end
  return cur, min(#c, 3 + m - (cur - high))
end

-- usage is the sum of the counted buckets, saturated at maxCount. Every
-- count is >= 0, so clamping once at the end gives what clamping every
-- partial sum did: the partial sums below maxCount are the same additions,
-- and one that reaches it only grows (or is NaN in both).
local function usage(c, top)
  local u = 0
  for i = 3, top do u = u + c[i] end
  if u > maxCount then return maxCount end
  return u
end

-- resetAfter is the time until the newest nonzero counted bucket leaves
-- the count; for a fixed window, the time to the end of the window.
local function resetAfter(c, top, cur, w, m, fixed)
  if fixed then return (cur + 1) * w - now end
  for i = 3, top do
    if c[i] > 0 then return (c[2] - (i - 3) + m + 1) * w - now end
  end
  return 0
end

-- retryAfter is the earliest time at which a charge of need (> 0) fits as
-- the oldest counted buckets leave one by one.
local function retryAfter(c, top, cur, w, m, fixed, need, amount)
  if need <= amount then
    local u = usage(c, top)
    for i = top, 3, -1 do
      local x = c[i]
      if x > 0 then
        u = u - x
        if u <= amount - need then return (c[2] - (i - 3) + m + 1) * w - now end
      end
    end
  end
  return resetAfter(c, top, cur, w, m, fixed)
end

local function windowStep(c, ch)
  local w, m = ch.p1, ch.p2
  touch(c, w, m)
  local cur, top = view(c, w, m)
  local fixed = ch.kind ~= 's'
  local cost, amount = ch.cost, ch.amount
  if cost < 0 then
    local r = -cost
    if ch.p3 ~= 0 and not fixed then
      -- The bucket the refunded cost was charged in, while it counts.
      local i = 3 + cur - floor(ch.p3 / w)
      if i >= 3 and i <= top then
        local take = min(r, c[i])
        c[i] = c[i] - take
        r = r - take
      end
    end
    for i = 3, top do
      if r <= 0 then break end
      local take = min(r, c[i])
      c[i] = c[i] - take
      r = r - take
    end
    return true, 0
  elseif cost == 0 then
    -- A check: is the counter over its limit? (see limit.Charge)
    if amount > 0 and usage(c, top) <= amount then return true, 0 end
    local need = 0
    if amount == 0 then need = 1 end
    return false, retryAfter(c, top, cur, w, m, fixed, need, amount)
  end
  local fits, retry = true, 0
  if cost > amount or usage(c, top) > amount - cost then
    fits, retry = false, retryAfter(c, top, cur, w, m, fixed, cost, amount)
    if not ch.force then return false, retry end
  end
  -- touch left cur = h.
  c[3] = min((c[3] or 0) + cost, maxCount)
  return fits, retry
end

-- encodeWindow is c's string, without its trailing empty buckets.
local function encodeWindow(c)
  for i = #c, 3, -1 do
    if c[i] ~= 0 then break end
    c[i] = nil
  end
  return mpack(c)
end

-- windowReport is what a result says of window c after the Apply: its
-- usage and reset after, as charge ch sees it.
local function windowReport(c, ch)
  local w, m = ch.p1, ch.p2
  local cur, top = view(c, w, m)
  return usage(c, top), resetAfter(c, top, cur, w, m, ch.kind ~= 's')
end

-- Token buckets ---------------------------------------------------------

local function bucketParams(ch)
  local T = ch.p1 / ch.amount
  local BT = ch.p2 * T
  return T, BT, BT + BT * tbEps
end

-- debt is how far (ms) the bucket is from full at now.
local function debt(c)
  if c.debt <= 0 then return 0 end
  local d = c.debt - (now - c.at)
  if d < 0 then return 0 end
  return d
end

local function setDebt(c, d)
  if d <= 0 then
    c.at, c.debt = 0, 0
  else
    c.at, c.debt = now, min(d, maxDebt)
  end
end

local function tokenStep(c, ch)
  local cost = ch.cost
  if ch.amount == 0 then return cost < 0, 0 end
  local T, BT, lim = bucketParams(ch)
  local d = debt(c)
  if cost < 0 then
    setDebt(c, d - (-cost) * T)
    return true, 0
  elseif cost == 0 then
    local x = d + T
    if x <= lim then return true, 0 end
    return false, max(1, min(ceil(x - lim), maxDebt))
  end
  local nd = d + cost * T
  if cost > ch.p2 then
    if ch.force then setDebt(c, nd) end
    return false, max(0, ceil(d - BT * tbEps))
  end
  if nd <= lim then
    setDebt(c, nd)
    return true, 0
  end
  if ch.force then setDebt(c, nd) end
  return false, max(1, min(ceil(nd - lim), maxDebt))
end

local function tokenString(c)
  if c.debt <= 0 then return '' end
  return fmtint(c.at) .. ':' .. fmtfloat(c.debt)
end

-- parseToken reads "At:Debt"; nil when s is not one.
local function parseToken(s)
  local at, d = string.match(s, '^(-?%d+):(.+)$')
  at, d = tonumber(at), tonumber(d)
  if at == nil or d == nil then return nil end
  return {at = at, debt = d}
end

local function loadToken(key)
  local v = redis.call('GET', key)
  if not v then return {at = 0, debt = 0}, false end
  local c = parseToken(v)
  if c == nil then fail(key, 'does not hold a token bucket') end
  return c, true
end

-- Leases and marks --------------------------------------------------------

local function loadLeases(key)
  local flat = redis.call('ZRANGEBYSCORE', key, '(' .. fmtint(now), '+inf', 'WITHSCORES')
  local c = {l = {}}
  for i = 1, #flat, 2 do
    c.l[#c.l + 1] = {flat[i], tonumber(flat[i + 1])}
  end
  return c, #flat > 0
end

local function loadMark(key)
  local v = redis.call('GET', key)
  if not v then return {}, false end
  local u = tonumber(v)
  if u == nil or u ~= floor(u) then fail(key, 'does not hold a mark') end
  return {untl = u}, true
end

-- firstDeadline is the time until the earliest live deadline, 0 with none.
local function firstDeadline(c)
  local d
  for _, x in ipairs(c.l) do
    if d == nil or x[2] < d then d = x[2] end
  end
  if d == nil then return 0 end
  return d - now
end

local function findLease(c, member)
  for i, x in ipairs(c.l) do
    if x[1] == member then return i end
  end
  return nil
end

-- leaseStep is limit.Counter's leaseStep; c holds live leases only.
local function leaseStep(c, ch)
  local held = findLease(c, ch.p3)
  if ch.cost < 0 then
    if held then table.remove(c.l, held) end
    return true, 0
  elseif ch.cost == 0 then
    if #c.l < ch.amount then return true, 0 end
    return false, firstDeadline(c)
  end
  local fits = held ~= nil or #c.l < ch.amount
  local retry = 0
  if not fits then
    retry = firstDeadline(c)
    if not ch.force then return false, retry end
  end
  local deadline = now + ch.p1
  if held then
    c.l[held][2] = deadline
  else
    c.l[#c.l + 1] = {ch.p3, deadline}
  end
  return fits, retry
end

local function markStep(c, ch)
  if ch.cost < 0 then
    c.untl = nil
    return true, 0
  end
  if c.untl ~= nil and c.untl > now then return false, 0 end
  if ch.cost > 0 then c.untl = now + ch.p1 end
  return true, 0
end

-- Fair share ------------------------------------------------------------

-- The fair-share state of a shared counter (limit.FairState) is one
-- string at limit.FairStateKey (the layout is below, at fairRecLen): one
-- GET reads it, already in key order, and a decision writes back only the
-- clock and the record it changed (SETRANGE), or, when a key was added or
-- dropped, the whole string (SET). Doubles read back as the same doubles,
-- as tostring's %.14g would not; the times are integer ms, exact in a
-- double. Every decision still decodes and scans every key, so its cost
-- grows with the members kept (FairPolicy.MaxKeys; docs/fair-share-redis.md
-- has the figures). fairGate and fairRecord are limit.FairState's Gate
-- and Record operation for operation, over keys in the same order and
-- with every sum in the same order, so that the state here and in
-- memstore agree to the bit. Lua rounds every product on its own (the
-- interpreter has no fused multiply-add), as fairshare.go makes Go do.
-- Record reuses Gate's weights when the state has not changed between
-- them (the same key, weight, policy and now give the same weights).

-- fairKeep is 1 - limit's fairUnmet: a waiting key was admitted less than
-- this part of what it asked.
local fairKeep = 0.75
-- maxWeight is limit.MaxMultiplier, FairWeight's upper clamp.
local maxWeight = 1000

-- fmax and fmin are Go's max and min of two floats: NaN if either is,
-- and -0 below +0 (math.max and math.min say neither).
local function fmax(a, b)
  if a ~= a then return a end
  if b ~= b then return b end
  if a > b then return a end
  if b > a then return b end
  if a == 0 and 1 / a < 0 then return b end
  return a
end

local function fmin(a, b)
  if a ~= a then return a end
  if b ~= b then return b end
  if a < b then return a end
  if b < a then return b end
  if a == 0 and 1 / a > 0 then return b end
  return a
end

-- fairWeight is limit.FairWeight.
local function fairWeight(w)
  if w ~= w then return 1 end
  return fmin(fmax(w, 1e-6), maxWeight)
end

-- fairDecay is limit's fairDecay, e^-x with + - * / only: halve x to at
-- most 1/2, the 14-term Taylor series in Horner form, square back.
local function fairDecay(x)
  if not (x > 0) then return 1 end
  if x > 64 then return 0 end
  local k = 0
  while x > 0.5 do
    x = x / 2
    k = k + 1
  end
  local r = 1
  for i = 14, 1, -1 do
    r = 1 - (x / i) * r
  end
  for _ = 1, k do
    r = r * r
  end
  return r
end

-- The state string: the clock, then one record per key in key order, ten
-- little-endian doubles: the member as two numbers, hi and lo (its first
-- and last 8 hex digits; -1 and 0 for ""), then Weight Finish Asked Denied
-- Admitted Asks Admits Aged. Numbers order members as Go's
-- strings.Compare orders their hex ("" first), with no strcoll and no Lua
-- string per member: making those strings was most of the decode.
local fairRecLen = 80
local fairRec = '<dddddddddd'

-- A decoded state keeps its keys in parallel arrays (a table per key
-- cost twice the time), one per column: H L member, W weight, F finish,
-- AS asked, D denied, AD admitted, SK asks, SM admits, AG aged, and P the
-- record's offset in st.src, false once a record changed the key, so
-- that fairEncode copies the unchanged runs of records as substrings.
local fairCols = {'H', 'L', 'W', 'F', 'AS', 'D', 'AD', 'SK', 'SM', 'AG', 'P'}

-- fairMember reports whether m is a limit.FairMember.
local function fairMember(m)
  return m == '' or (#m == 16 and string.find(m, '[^0-9a-f]') == nil)
end

-- fairHL is member m's hi and lo.
local function fairHL(m)
  if m == '' then return -1, 0 end
  return tonumber(string.sub(m, 1, 8), 16), tonumber(string.sub(m, 9, 16), 16)
end

local function fairEmpty(src)
  local st = {clock = 0, n = 0, src = src}
  for _, c in ipairs(fairCols) do st[c] = {} end
  return st
end

-- fairDecode reads a state string; nil when it is not one.
local function fairDecode(src)
  local n = (#src - 8) / fairRecLen
  if n < 0 or n ~= floor(n) then return nil end
  local st = fairEmpty(src)
  st.clock, st.n = struct.unpack('<d', src), n
  local H, L, W, F, AS, D, AD, SK, SM, AG, P = st.H, st.L, st.W, st.F, st.AS, st.D, st.AD, st.SK, st.SM, st.AG, st.P
  local ph, pl, pos = nil, nil, 9
  for i = 1, n do
    local h, l, nxt
    h, l, W[i], F[i], AS[i], D[i], AD[i], SK[i], SM[i], AG[i], nxt = struct.unpack(fairRec, src, pos)
    -- Keys in order and each once, or fairFind would be wrong.
    if ph ~= nil and not (ph < h or (ph == h and pl < l)) then return nil end
    H[i], L[i], P[i] = h, l, pos
    ph, pl, pos = h, l, nxt
  end
  return st
end

-- fairPack is key i's record.
local function fairPack(st, i)
  return struct.pack(fairRec, st.H[i], st.L[i], st.W[i], st.F[i], st.AS[i], st.D[i], st.AD[i], st.SK[i], st.SM[i],
    st.AG[i])
end

-- fairEncode is st as the string it is saved as.
local function fairEncode(st)
  local parts = {struct.pack('<d', st.clock)}
  local src, P, from, to = st.src, st.P, nil, nil
  for i = 1, st.n do
    local pos = P[i]
    if pos and pos == to then
      to = to + fairRecLen
    else
      if from ~= nil then parts[#parts + 1] = string.sub(src, from, to - 1) end
      from, to = nil, nil
      if pos then
        from, to = pos, pos + fairRecLen
      else
        parts[#parts + 1] = fairPack(st, i)
      end
    end
  end
  if from ~= nil then parts[#parts + 1] = string.sub(src, from, to - 1) end
  return table.concat(parts)
end

local function loadFair(key)
  local raw = redis.pcall('GET', key)
  local st
  if raw == false then
    st = fairEmpty('')
  elseif type(raw) == 'string' then
    st = fairDecode(raw)
  end
  if st == nil then fail(key, 'does not hold a fair-share state') end
  st.name, st.stored, st.ttl, st.ver, st.moved, st.changed = key, raw, 1, 0, raw == false, {}
  return st
end

-- fairSet makes st's keys and clock those of from.
local function fairSet(st, from)
  st.clock, st.n, st.src = from.clock, from.n, from.src
  for _, c in ipairs(fairCols) do
    local a, b = {}, from[c]
    for i = 1, from.n do a[i] = b[i] end
    st[c] = a
  end
end

local function copyFair(st)
  local c = {name = st.name, stored = st.stored, ttl = st.ttl, ver = st.ver, moved = st.moved, changed = {}}
  fairSet(c, st)
  return c
end

-- saveFair writes the state and renews the TTL, plus ttlMargin as every
-- other key: every record renews it, as every decision on the limit
-- records. When no key was added or dropped (st.moved) every record is
-- where it was read, and SETRANGE writes the clock and the records that
-- changed (st.changed): copying and writing the whole string took about
-- as long as the gate.
local function saveFair(st)
  local ttl = fmtint(st.ttl + ttlMargin)
  if st.moved then
    local s = fairEncode(st)
    if s ~= st.stored then
      redis.call('SET', st.name, s, 'PX', ttl)
      return
    end
  else
    local done = {}
    for _, i in ipairs(st.changed) do
      if not done[i] then
        done[i] = true
        redis.call('SETRANGE', st.name, fmtint(8 + (i - 1) * fairRecLen), fairPack(st, i))
      end
    end
    local clock = struct.pack('<d', st.clock)
    if clock ~= string.sub(st.stored, 1, 8) then redis.call('SETRANGE', st.name, '0', clock) end
  end
  redis.call('PEXPIRE', st.name, ttl)
end

-- fairFind returns the index of member h, l, or where it goes and false.
local function fairFind(st, h, l)
  local H, L = st.H, st.L
  local lo, hi = 1, st.n + 1
  while lo < hi do
    local mid = floor((lo + hi) / 2)
    local mh, ml = H[mid], L[mid]
    if mh == h and ml == l then return mid, true end
    if mh < h or (mh == h and ml < l) then lo = mid + 1 else hi = mid end
  end
  return lo, false
end

-- fairSlot is FairState.slot: the member fc counts under, its index, and
-- whether the state knows it.
local function fairSlot(st, fc)
  local i, ok = fairFind(st, fc.h, fc.l)
  if ok or st.n < fc.p.maxKeys then return fc.h, fc.l, i, ok end
  return -1, 0, fairFind(st, -1, 0)
end

-- fairLift is FairState.lift: the floor is Credit behind the clock in
-- virtual time, the same for every weight (w is unused).
local function fairLift(st, p, f, w)
  return fmax(f, st.clock - p.credit)
end

-- fairFloor is limit's fairFloor: water-filling up to share of the total.
local function fairFloor(share, ws)
  if share <= 0 then return end
  local sorted, total = {}, 0
  for i = 1, #ws do
    local w = ws[i]
    if w > 0 then
      sorted[#sorted + 1] = w
      total = total + w
    end
  end
  table.sort(sorted)
  local raised, rest = math.huge, total
  for r = 0, #sorted - 1 do
    local w = sorted[r + 1]
    local left = 1 - r * share
    if left <= 0 then break end
    local x = share * rest / left
    if w >= x then
      raised = x
      break
    end
    rest = rest - w
  end
  for i = 1, #ws do
    local w = ws[i]
    if w == 0 then
      -- No demand.
    elseif raised == math.huge then
      ws[i] = total / #sorted
    else
      ws[i] = fmax(w, raised)
    end
  end
end

-- fairWeights is FairState.weights, with key at index ki (0: not in the
-- state); it also returns which other keys wait, which Gate reads again.
local function fairWeights(st, p, ki, w)
  local ws, wt = {}, {}
  local backlog, W, D, SK, SM = p.backlog, st.W, st.D, st.SK, st.SM
  for i = 1, st.n do
    local d = D[i]
    if i == ki then
      ws[i], wt[i] = w, false
    elseif d > 0 and now - d < backlog and SM[i] < fairKeep * SK[i] then
      ws[i], wt[i] = W[i], true
    else
      ws[i], wt[i] = 0, false
    end
  end
  fairFloor(p.minShare, ws)
  return ws, wt
end

-- fairGate is FairState.Gate: whether fc's key may ask a counter with
-- room left. It leaves in fc.gate the weights Record can reuse while the
-- state is unchanged (st.ver).
local function fairGate(st, fc, room)
  local p = fc.p
  local weight = fairWeight(fc.weight)
  local _, _, i, known = fairSlot(st, fc)
  local ki = 0
  if known then ki = i end
  local ws, wt = fairWeights(st, p, ki, weight)
  fc.gate = {ver = st.ver, ws = ws}
  local w = weight
  local f = fairLift(st, p, st.clock, w)
  if known then
    w = ws[i]
    f = fairLift(st, p, st.F[i], w)
  end
  if w <= 0 then w = weight end
  local reserve, ahead = 0, false
  local F, q, clock, credit = st.F, p.quantum / w, st.clock, p.credit
  local SK, AG, backlog = st.SK, st.AG, fmax(p.backlog, 1)
  for j = 1, st.n do
    if wt[j] then
      local kw = ws[j]
      -- fairLift and fmax inlined: fmax(a, b) is the larger when they
      -- compare, and fmax itself only when equal or NaN.
      local g, lb = F[j], clock - credit
      if lb > g then g = lb elseif not (g > lb) then g = fmax(g, lb) end
      if f >= g + q then ahead = true end
      local d = f - g
      if not (d > 0) then d = fmax(d, 0) end
      d = kw * d
      if d > 0 then
        -- FairKey.recentAsks: j holds no more than it asked lately.
        local asks = SK[j]
        if now > AG[j] then asks = asks * fairDecay((now - AG[j]) / backlog) end
        d = fmin(d, asks)
      end
      reserve = reserve + d
    end
  end
  return not ahead or room - fc.cost >= reserve
end

-- fairRecord is FairState.Record; out is "a" (FairAdmitted), "d"
-- (FairDenied) or "e" (FairElsewhere).
local function fairRecord(st, fc, out)
  local p, cost = fc.p, fc.cost
  local weight = fairWeight(fc.weight)
  local h, l, i, ok = fairSlot(st, fc)
  local ws
  if ok and fc.gate ~= nil and fc.gate.ver == st.ver then
    -- The state Gate saw, and the key in it: the same weights.
    ws = fc.gate.ws
  else
    if not ok then
      local vals = {H = h, L = l, W = 0, F = st.clock, AS = 0, D = 0, AD = 0, SK = 0, SM = 0, AG = 0, P = false}
      for _, c in ipairs(fairCols) do table.insert(st[c], i, vals[c]) end
      st.n, st.moved = st.n + 1, true
    end
    ws = fairWeights(st, p, i, weight)
  end
  st.ver = st.ver + 1
  st.changed[#st.changed + 1] = i
  local F, SK, SM = st.F, st.SK, st.SM
  st.W[i], st.AS[i], st.P[i] = weight, now, false
  local aged = st.AG[i]
  if now > aged then
    local f = fairDecay((now - aged) / fmax(p.backlog, 1))
    SK[i] = SK[i] * f
    SM[i] = SM[i] * f
    st.AG[i] = now
  end
  if out ~= 'e' then SK[i] = SK[i] + cost end
  if out == 'a' then SM[i] = SM[i] + cost end
  F[i] = fairLift(st, p, F[i], ws[i])
  if out == 'a' then
    F[i] = F[i] + cost / ws[i]
    st.AD[i] = now
    local total = 0
    for j = 1, #ws do total = total + ws[j] end
    st.clock = st.clock + cost / total
  elseif out == 'd' then
    st.D[i] = now
  end
  -- settle: the clock no further than the waiting keys' weighted mean F.
  do
    local W, D, sw, sf, backlog = st.W, st.D, 0, 0, p.backlog
    for x = 1, st.n do
      local d = D[x]
      if d > 0 and now - d < backlog and SM[x] < fairKeep * SK[x] then
        sw = sw + W[x]
        sf = sf + W[x] * F[x]
      end
    end
    if sw > 0 then
      local m = sf / sw
      if st.clock > m then st.clock = m end
    end
  end
  -- forget: keys with no demand that owe nothing go.
  local AS, clock, backlog, n, j = st.AS, st.clock, p.backlog, st.n, 0
  for x = 1, n do
    local a = AS[x]
    if (a > 0 and now - a < backlog) or not (F[x] <= clock) then
      j = j + 1
      if j ~= x then
        for _, c in ipairs(fairCols) do st[c][j] = st[c][x] end
      end
    end
  end
  if j ~= n then
    for _, c in ipairs(fairCols) do
      local a = st[c]
      for x = j + 1, n do a[x] = nil end
    end
    st.n, st.moved = j, true
  end
end

-- fairRoom is the counter's Remaining before ch: Gate's room.
local function fairRoom(ch)
  local c = ch.k.work
  if ch.k.type == 'token' then
    if ch.amount == 0 then return 0 end
    local T, _, lim = bucketParams(ch)
    local r = floor((lim - debt(c)) / T)
    if r >= ch.p2 then return ch.p2 end
    if r > 0 then return r end
    return 0
  end
  touch(c, ch.p1, ch.p2)
  local _, top = view(c, ch.p1, ch.p2)
  local u = usage(c, top)
  if u < ch.amount then return ch.amount - u end
  return 0
end

-- fairRetry is a gate denial's retry after, as memstore's: when room
-- next frees, the end of the window's current bucket (a fixed window's
-- bucket is the window), or one emission interval T of a token bucket.
local function fairRetry(ch)
  if ch.k.type == 'token' then
    local T = bucketParams(ch)
    return max(1, min(ceil(T), maxDebt))
  end
  return (floor(now / ch.p1) + 1) * ch.p1 - now
end

-- fairOutcome is what ch's decision did on its shared limit.
local function fairOutcome(ch, admitted)
  if not ch.fits then return 'd' end
  if admitted then return 'a' end
  return 'e'
end

-- Charges ---------------------------------------------------------------

local types = {s = 'window', f = 'window', i = 'window', t = 'token', c = 'lease', o = 'mark'}
local loaders = {window = loadWindow, token = loadToken, lease = loadLeases, mark = loadMark}
local steps = {window = windowStep, token = tokenStep, lease = leaseStep, mark = markStep}

-- report is what a result says of counter c of type t after the Apply,
-- as charge ch sees it: a window's usage and reset after, a token
-- bucket's debt at now and 0, live leases and the time to the earliest
-- deadline, or 0 and 0 for a mark.
local function report(t, c, ch)
  if t == 'token' then return fmtfloat(debt(c)), 0 end
  if t == 'lease' then return #c.l, firstDeadline(c) end
  if t == 'mark' then return 0, 0 end
  return windowReport(c, ch)
end

local function step(ch)
  return steps[ch.k.type](ch.k.work, ch)
end

local function copy(k)
  local s = k.stored
  if k.type == 'window' then return {unpack(s)} end
  if k.type == 'token' then return {at = s.at, debt = s.debt} end
  if k.type == 'mark' then return {untl = s.untl} end
  local l = {}
  for i, x in ipairs(s.l) do l[i] = {x[1], x[2]} end
  return {l = l}
end

local function reset(order)
  for _, k in ipairs(order) do k.work = copy(k) end
end

-- denial starts over from the stored state and keeps the refunds, the
-- Force charges and the Once marks, and the time the other charges saw
-- (a lease counter holds live leases only, and save drops the others).
local function denial(charges, order)
  reset(order)
  for _, ch in ipairs(charges) do
    if ch.cost < 0 or (ch.cost > 0 and (ch.force or ch.kind == 'o')) then
      step(ch)
    elseif ch.k.type == 'window' then
      touch(ch.k.work, ch.p1, ch.p2)
    end
  end
end

-- Writes ----------------------------------------------------------------

-- expiry is the Unix ms from which k's counter is equivalent to a fresh
-- one, as its last charge counts; nil when it is fresh already.
local function tokenExpiry(c)
  if c.debt <= 0 then return nil end
  return c.at + ceil(c.debt)
end

local function windowExpiry(c, ch)
  if c[1] ~= ch.p1 then return nil end
  -- Until then the newest bucket may count, or h still moves cur.
  return (c[2] + ch.p2 + 1) * c[1]
end

local function expiry(k)
  local c, ch = k.work, k.last
  if k.type == 'token' then return tokenExpiry(c) end
  if k.type == 'mark' then return c.untl end
  if k.type == 'lease' then
    local d
    for _, x in ipairs(c.l) do
      if d == nil or x[2] > d then d = x[2] end
    end
    return d
  end
  return windowExpiry(c, ch)
end

-- saveLeases writes the leases that changed. Members whose deadline has
-- come go first, so the set holds what limit.Counter's would.
local function saveLeases(k, exp)
  local c, s = k.work, k.stored
  redis.call('ZREMRANGEBYSCORE', k.key, '-inf', fmtint(now))
  local had, kept = {}, {}
  for _, x in ipairs(s.l) do had[x[1]] = x[2] end
  for _, x in ipairs(c.l) do kept[x[1]] = x[2] end
  local del, set = {}, {}
  for _, x in ipairs(s.l) do
    if kept[x[1]] == nil then del[#del + 1] = x[1] end
  end
  for _, x in ipairs(c.l) do
    if had[x[1]] ~= x[2] then
      set[#set + 1] = fmtint(x[2])
      set[#set + 1] = x[1]
    end
  end
  if #del > 0 then redis.call('ZREM', k.key, unpack(del)) end
  if #set > 0 then redis.call('ZADD', k.key, unpack(set)) end
  if exp ~= nil and (#del > 0 or #set > 0) then
    redis.call('PEXPIRE', k.key, fmtint(exp - now + ttlMargin))
  end
end

-- saveMark writes a mark that changed. Only undo puts back a mark whose
-- time has come (as it was before the try, for the callers still behind
-- it), for as long as the margin keeps it.
local function saveMark(k)
  local u, s = k.work.untl, k.stored
  if u ~= nil and (u > now or (mode == 'undo' and u + ttlMargin > now)) then
    if u ~= s.untl then
      redis.call('SET', k.key, fmtint(u), 'PX', fmtint(u - now + ttlMargin))
    end
    return
  end
  if k.exists then redis.call('DEL', k.key) end
end

-- saveToken writes token bucket c at key when it differs from the stored
-- one (at, debt), or deletes the key once the bucket is full.
local function saveToken(key, c, at, debt, exists)
  local exp = tokenExpiry(c)
  if exp == nil or exp <= now then
    if exists then redis.call('DEL', key) end
    return
  end
  if c.at ~= at or c.debt ~= debt then
    redis.call('SET', key, tokenString(c), 'PX', fmtint(exp - now + ttlMargin))
  end
end

-- saveWindow writes window c at key, last charged by ch, when its string
-- differs from the stored raw (as the hash's fields did), or deletes the
-- key once the window is fresh. A kind "i" window (count) is written as
-- its count, 0 for a window touched but not charged.
local function saveWindow(key, c, ch, exists, raw, count)
  local exp = windowExpiry(c, ch)
  if exp == nil or exp <= now then
    if exists then redis.call('DEL', key) end
    return
  end
  local v
  if count then v = fmtint(c[3] or 0) else v = encodeWindow(c) end
  if v ~= raw then
    redis.call('SET', key, v, 'PX', fmtint(exp - now + ttlMargin))
  end
end

local function save(k)
  if k.type == 'lease' then return saveLeases(k, expiry(k)) end
  if k.type == 'mark' then return saveMark(k) end
  if k.type == 'token' then return saveToken(k.key, k.work, k.stored.at, k.stored.debt, k.exists) end
  return saveWindow(k.key, k.work, k.last, k.exists, k.raw, k.count)
end

-- Undo ------------------------------------------------------------------

-- undoData is what undo needs to take back what a try kept on k (work)
-- where a denial would have kept alt: '' when they agree, else the
-- MessagePack array of, for a window, its width then idx, count for each
-- bucket's count to take off; for a token bucket, at and debt of work,
-- then of alt; for leases, member, kept, alt for each member whose
-- deadline differs; for a mark, the kept and the stored deadlines (see
-- the head of the script). false stands for no lease or no mark.
local function undoData(k, work, alt)
  local d = {}
  if k.type == 'mark' then
    if work.untl ~= k.stored.untl then d = {work.untl or false, k.stored.untl or false} end
  elseif k.type == 'token' then
    if tokenString(work) ~= tokenString(alt) then d = {work.at, work.debt, alt.at, alt.debt} end
  elseif k.type == 'lease' then
    local was = {}
    for _, x in ipairs(alt.l) do was[x[1]] = x[2] end
    for _, x in ipairs(work.l) do
      if was[x[1]] ~= x[2] then d[#d + 1], d[#d + 2], d[#d + 3] = x[1], x[2], was[x[1]] or false end
      was[x[1]] = nil
    end
    for _, x in ipairs(alt.l) do
      if was[x[1]] ~= nil then d[#d + 1], d[#d + 2], d[#d + 3] = x[1], false, x[2] end
    end
  else
    local had = {}
    if alt[1] == work[1] then
      for i = 3, #alt do had[alt[2] - (i - 3)] = alt[i] end
    end
    for i = 3, #work do
      local idx = work[2] - (i - 3)
      local x = work[i] - (had[idx] or 0)
      if x > 0 then d[#d + 1], d[#d + 2] = idx, x end
    end
    if #d > 0 then table.insert(d, 1, work[1]) end
  end
  if #d == 0 then return '' end
  return mpack(d)
end

-- undo takes back what a try kept on k, as u (undoData's array) says. A
-- window loses the counts the try added, floored at zero. A token bucket
-- nothing has moved since goes to the state a denial would have kept; one
-- another decision moved loses the debt the try added but never goes
-- below that state, so a compensation can under-admit and never
-- over-admit. A lease or a mark goes back only if nothing has changed it
-- since the try.
local function undo(k, u)
  local c = k.work
  if k.type == 'mark' then
    if (c.untl or false) == u[1] then c.untl = u[2] or nil end
  elseif k.type == 'lease' then
    for i = 1, #u, 3 do
      local member, kept, alt = u[i], u[i + 1], u[i + 2]
      local j = findLease(c, member)
      if (j and c.l[j][2] or false) == kept then
        if not alt then
          table.remove(c.l, j)
        elseif j then
          c.l[j][2] = alt
        else
          c.l[#c.l + 1] = {member, alt}
        end
      end
    end
  elseif k.type == 'window' then
    if u[1] ~= c[1] then return end
    for i = 2, #u, 2 do
      local j = 3 + c[2] - u[i]
      if j >= 3 and j <= #c then c[j] = max(c[j] - u[i + 1], 0) end
    end
  else
    local kept, alt = {at = u[1], debt = u[2]}, {at = u[3], debt = u[4]}
    if tokenString(c) == tokenString(kept) then
      c.at, c.debt = alt.at, alt.debt
      return
    end
    local fl = debt(alt)
    setDebt(c, max(debt(c) - (debt(kept) - fl), fl))
  end
end

-- Plain calls ------------------------------------------------------------

-- Scratch tables plainRun reuses from decision to decision (Redis runs one
-- call at a time, and every entry is set before it is read): per charge
-- its parsed arguments, its working counter, its stored state and whether
-- its key existed. A table made per decision costs its allocation and its
-- share of the garbage collection.
local pChs, pCs, pStored, pExists = {}, {}, {}, {}

-- argsPlain is how many arguments plains takes per charge.
local argsPlain = 6

-- freshWindows ends a plain decision whose every charge is a window
-- charge (cost in (0, amount]) on a key that does not exist: each fits,
-- and starts its window, {w, cur, cost}. That is what the steps, save and
-- report would store and answer, without them: the first decision of
-- every key (a per-user limit, a tenant x model matrix, each window's
-- start) took 2-3 µs of a 7-8 µs call in them (TestScriptProfile).
local function freshWindows(keys, ko, chs, n, out, ob)
  for j = 1, n do
    local ch = chs[j]
    local w = ch.p1
    local cur = floor(now / w)
    local reset = (cur + ch.p2 + 1) * w - now -- windowExpiry - now, and resetAfter
    redis.call('SET', keys[ko + j], mpack({w, cur, ch.cost}), 'PX', fmtint(reset + ttlMargin))
    local o = ob + 4 * j - 2
    out[o], out[o + 1], out[o + 2], out[o + 3] = 1, 0, ch.cost, reset
  end
  return out
end

-- plainRun runs one of plains' decisions, the one nearly every decision
-- is: every charge a window or token bucket charge without flags on a
-- key of its own, no fair entry, mode "apply". Its n charges' keys are
-- KEYS[ko + 1 ..], their six arguments each from ARGV[a]; it writes its
-- reply, as apply's, into out after index ob. It does what apply does
-- for such a call, with the same steps, denial, writes and results in
-- the same order, but without per-key records, dispatch by type, or a
-- copy of the stored state on the way to an admission (a denial reads it
-- again). It returns nil, having written nothing, for a bad argument.
local function plainRun(keys, ko, argv, a, n, out, ob)
  -- stored: a window's string (nil: none) or the stored token bucket.
  local chs, cs, stored, exists = pChs, pCs, pStored, pExists
  local admitted = true
  out[ob + 1] = 1
  -- fresh: while every charge so far is a window charge that fits on a
  -- new key, the steps wait (see freshWindows); the first that is not
  -- steps them all.
  local fresh = true
  for j = 1, n do
    local b = a + argsPlain * (j - 1)
    local ch = chs[j]
    if ch == nil then
      ch = {}
      chs[j] = ch
    end
    ch.kind, ch.amount, ch.p1, ch.p2 = argv[b], tonumber(argv[b + 1]), tonumber(argv[b + 2]), tonumber(argv[b + 3])
    ch.p3, ch.cost, ch.shadow, ch.force = tonumber(argv[b + 4]), tonumber(argv[b + 5]), false, false
    if ch.kind ~= 's' and ch.kind ~= 'f' and ch.kind ~= 't' then return nil end
    if ch.amount == nil or ch.p1 == nil or ch.p2 == nil or ch.p3 == nil or ch.cost == nil or ch.p1 <= 0 then
      return nil
    end
    ch.cost = max(min(ch.cost, maxCount), -maxCount)
    local pre
    if fresh then
      if ch.kind ~= 't' and ch.cost > 0 and ch.cost <= ch.amount then
        pre = redis.pcall('GET', keys[ko + j])
        fresh = pre == false
      else
        fresh = false
      end
      if not fresh then
        -- Step the charges before this one, on their new keys.
        for i = 1, j - 1 do
          local c = {0, 0}
          local fits, retry = windowStep(c, chs[i])
          cs[i], exists[i], stored[i] = c, false, nil
          out[ob + 4 * i - 2], out[ob + 4 * i - 1] = fits and 1 or 0, retry
        end
      end
    end
    if not fresh then
      local c, fits, retry
      if ch.kind == 't' then
        local s
        s, exists[j] = loadToken(keys[ko + j])
        stored[j], c = s, {at = s.at, debt = s.debt}
        fits, retry = tokenStep(c, ch)
      else
        c, exists[j], stored[j] = loadWindow(keys[ko + j], pre)
        fits, retry = windowStep(c, ch)
      end
      cs[j] = c
      local o = ob + 4 * j - 2
      if fits then out[o] = 1 else out[o] = 0 end
      out[o + 1] = retry
      if ch.cost >= 0 and not fits then admitted = false end
    end
  end
  if fresh then return freshWindows(keys, ko, chs, n, out, ob) end
  if not admitted then
    -- denial: each key from its stored state, refunds stepped, windows
    -- touched.
    out[ob + 1] = 0
    for j = 1, n do
      local ch, c = chs[j], nil
      if ch.kind == 't' then
        c = {at = stored[j].at, debt = stored[j].debt}
        if ch.cost < 0 then tokenStep(c, ch) end
      else
        c = {0, 0}
        if stored[j] ~= nil then c = munpack(stored[j]) end
        if ch.cost < 0 then windowStep(c, ch) else touch(c, ch.p1, ch.p2) end
      end
      cs[j] = c
    end
  end
  for j = 1, n do
    if chs[j].kind == 't' then
      saveToken(keys[ko + j], cs[j], stored[j].at, stored[j].debt, exists[j])
    else
      saveWindow(keys[ko + j], cs[j], chs[j], exists[j], stored[j])
    end
  end
  for j = 1, n do
    local ch, o = chs[j], ob + 4 * j - 2
    out[o + 2], out[o + 3] = report(types[ch.kind], cs[j], ch)
  end
  return out
end

-- sizesOK checks, before a batch function writes anything, that argv
-- and keys hold whole decisions: each a count n >= 1, head - 1 more
-- values (head >= 1), then per values and keysPer keys a charge.
local function sizesOK(keys, argv, head, per, keysPer)
  local na, ai, ki = #argv, 1, 0
  while ai <= na do
    local n = tonumber(argv[ai])
    if n == nil or n < 1 or n ~= floor(n) then return false end
    for h = 1, head - 1 do
      if tonumber(argv[ai + h]) == nil then return false end
    end
    ai, ki = ai + head + per * n, ki + keysPer * n
  end
  return ai == na + 1 and ki == #keys
end

-- plains runs a batch of plain decisions (see plainRun: every charge a
-- window or token bucket charge without flags or fair share, each on a
-- key of its own) one after another, each all or nothing: the batch of
-- concurrent decisions a batching store merges into one call, or one
-- decision alone. apply runs such a decision the same way, by its general
-- path; the store never sends it one.
--
-- KEYS: every decision's keys, in order. ARGV: for each decision, n its
-- number of charges, its now (ms), then for each charge kind, amount, p1,
-- p2, p3 and cost, as apply's (see the head of the file).
-- Reply: for each decision, apply's reply, 1 + 4n values; or, for a
-- decision that failed (a key that holds no such counter, a bad
-- argument), -1 and the error's message: that decision wrote nothing.
local function plains(keys, argv)
  if sformat == nil then bind() end
  if not sizesOK(keys, argv, 2, argsPlain, 1) then return redis.error_reply('ERR tollgate plains: bad arguments') end
  local na = #argv
  mode = 'apply'
  local out = {}
  local ai, ki = 1, 0
  while ai <= na do
    local n = tonumber(argv[ai])
    now = tonumber(argv[ai + 1])
    local ob = #out
    local ok, r = pcall(plainRun, keys, ki, argv, ai + 2, n, out, ob)
    if not ok or r == nil then
      for i = #out, ob + 1, -1 do out[i] = nil end
      out[#out + 1] = -1
      if not ok and type(r) == 'table' and r.err then
        out[#out + 1] = r.err
      elseif not ok then
        out[#out + 1] = 'ERR tollgate plains: ' .. tostring(r)
      else
        out[#out + 1] = 'ERR tollgate plains: bad charge arguments'
      end
    end
    ai, ki = ai + 2 + argsPlain * n, ki + n
  end
  return out
end

-- Counts ------------------------------------------------------------------

-- counts runs a batch of decisions whose every charge is a kind "i" fixed
-- window without flags or fair share, each on a key of its own: what
-- apply does for such a decision (same admission, writes and results),
-- with none of its tables, and many decisions in one call, one after
-- another, each all or nothing. The caller derives every result from the
-- counts the charges found, and the arithmetic is short enough to repeat
-- there: a charge of cost > 0 fits when cost <= amount - count, a check
-- (cost 0) when 0 < amount and count <= amount, a refund always.
--
-- KEYS: for each charge of each decision, in order, the key of the
-- window now is in and the key of the next window (see loadCount).
-- ARGV: for each decision, n its number of charges, then for each charge
-- amount, cost (|cost| <= maxCount, amount <= maxCount) and the window's
-- expiry (ms) should the charge create its key.
-- Reply: for each charge, in order, the count it found (0 for no key), or
-- -2 - count when it counted in the next window, which exists; or -1 for
-- each charge of a decision one of whose keys holds no count, or one of
-- whose arguments is not a number: that decision writes nothing.
local function counts(keys, argv)
  if sformat == nil then bind() end
  if not sizesOK(keys, argv, 1, 3, 2) then return redis.error_reply('ERR tollgate counts: bad arguments') end
  local na, ai, ki = #argv, 1, 1
  local out, found, cost, at = {}, {}, {}, {}
  local o = 1
  while ai <= na do
    local n = tonumber(argv[ai])
    local fits, bad = true, false
    for j = 1, n do
      local b = ai + 3 * j - 2
      local key = keys[ki + 2 * j - 1]
      local raw = redis.pcall('GET', key)
      if raw == false then
        key = keys[ki + 2 * j - 2]
        raw = redis.pcall('GET', key)
      end
      local c, amount, x = 0, tonumber(argv[b]), tonumber(argv[b + 1])
      if raw ~= false then
        c = parseCount(raw)
        if c == nil then bad, c = true, 0 end
      end
      if amount == nil or x == nil then bad = true end
      if not bad then
        if x > 0 then
          if x > amount or c > amount - x then fits = false end
        elseif x == 0 then
          if amount == 0 or c > amount then fits = false end
        end
      end
      found[j], cost[j], at[j] = raw ~= false and c, x, key
      if key == keys[ki + 2 * j - 1] then out[o + j - 1] = -2 - c else out[o + j - 1] = c end
    end
    if bad then
      for j = 1, n do out[o + j - 1] = -1 end
    else
      for j = 1, n do
        local key, x, c, b = at[j], cost[j], found[j], ai + 3 * j - 2
        if not c then
          -- No key: the charge's window starts with it, as the
          -- window the step touched would be stored.
          if x > 0 and fits then
            redis.call('SET', key, argv[b + 1], 'PX', argv[b + 2])
          else
            redis.call('SET', key, '0', 'PX', argv[b + 2])
          end
        elseif x > 0 then
          if fits then redis.call('INCRBY', key, argv[b + 1]) end
        elseif x < 0 and c > 0 then
          redis.call('INCRBY', key, fmtint(max(x, -c)))
        end
      end
    end
    ai, ki, o = ai + 1 + 3 * n, ki + 2 * n, o + n
  end
  return out
end

-- Run -------------------------------------------------------------------

local function apply(keys, argv)
  if sformat == nil then bind() end
  mode, now = argv[1], tonumber(argv[2])
  local n = tonumber(argv[3])
  if now == nil or n == nil or (mode ~= 'apply' and mode ~= 'try' and mode ~= 'undo' and mode ~= 'void') then
    return redis.error_reply('ERR tollgate apply: bad arguments')
  end
  local fbase = 3 + 8 * n + 1
  local nf = tonumber(argv[fbase])
  if nf == nil or nf < 0 or nf > n then
    return redis.error_reply('ERR tollgate apply: bad argument count')
  end
  -- Undo's values follow the fair entries.
  local tail = fbase + 11 * nf
  local extra = 0
  if mode == 'undo' then extra = #keys end
  if #argv ~= tail + extra then
    return redis.error_reply('ERR tollgate apply: bad argument count')
  end

  local counters, order, charges = {}, {}, {}
  local marks = 0
  for j = 1, n do
    local base = 3 + 8 * (j - 1)
    local flags = argv[base + 8]
    local ch = {
      ki = tonumber(argv[base + 1]),
      kind = argv[base + 2],
      amount = tonumber(argv[base + 3]),
      p1 = tonumber(argv[base + 4]),
      p2 = tonumber(argv[base + 5]),
      p3 = argv[base + 6],
      cost = tonumber(argv[base + 7]),
      shadow = flags ~= '' and string.find(flags, 's', 1, true) ~= nil,
      force = flags ~= '' and string.find(flags, 'f', 1, true) ~= nil,
    }
    if ch.cost ~= nil then ch.cost = max(min(ch.cost, maxCount), -maxCount) end
    local t = types[ch.kind]
    if t ~= 'lease' then ch.p3 = tonumber(ch.p3) end
    if ch.ki == nil or keys[ch.ki] == nil or ch.amount == nil or ch.p1 == nil or ch.p2 == nil or
        ch.p3 == nil or ch.cost == nil or t == nil or ch.p1 <= 0 or
        (t == 'lease' and ch.cost ~= 0 and ch.p3 == '') then
      return redis.error_reply('ERR tollgate apply: bad charge arguments')
    end
    local k = counters[ch.ki]
    local count = ch.kind == 'i'
    if k == nil then
      local key = keys[ch.ki]
      k = {key = key, type = t, count = count}
      if count then
        k.stored, k.exists, k.raw, k.key = loadCount(key, ch.p1)
      else
        k.stored, k.exists, k.raw = loaders[t](key)
      end
      counters[ch.ki] = k
      order[#order + 1] = k
    elseif k.type ~= t or k.count ~= count then
      return redis.error_reply('ERR tollgate apply: a key charged as a ' .. k.type .. ' and a ' .. t)
    end
    if t == 'mark' then marks = marks + 1 end
    ch.k = k
    -- The last charge on a key says how long its state lives.
    k.last = ch
    charges[j] = ch
  end
  if mode == 'try' and marks > 0 and marks < n then
    return redis.error_reply('ERR tollgate apply: a try with Once charges and others')
  end

  -- Fair entries, 11 values each: the charge's index, its state's key
  -- index, MinShare, Backlog (ms), Quantum, Credit, MaxKeys, member,
  -- weight, cost (max(Cost, 0) as a double, as Go converts it) and the
  -- state's TTL (ms).
  local fairs, fairList = {}, {}
  for e = 1, nf do
    local b = fbase + 11 * (e - 1)
    local j, fki = tonumber(argv[b + 1]), tonumber(argv[b + 2])
    local ch = j and charges[j]
    local fc = {
      p = {minShare = tonumber(argv[b + 3]), backlog = tonumber(argv[b + 4]), quantum = tonumber(argv[b + 5]),
        credit = tonumber(argv[b + 6]), maxKeys = tonumber(argv[b + 7])},
      member = argv[b + 8], weight = tonumber(argv[b + 9]), cost = tonumber(argv[b + 10]),
    }
    if fairMember(fc.member) then fc.h, fc.l = fairHL(fc.member) end
    local p, ttl = fc.p, tonumber(argv[b + 11])
    if ch == nil or ch.fair ~= nil or (ch.kind ~= 's' and ch.kind ~= 'f' and ch.kind ~= 'i' and ch.kind ~= 't') or ch.cost < 0 or ch.force or
        fki == nil or keys[fki] == nil or counters[fki] ~= nil or p.minShare == nil or p.backlog == nil or
        p.quantum == nil or p.credit == nil or p.maxKeys == nil or fc.weight == nil or fc.cost == nil or
        ttl == nil or ttl < 1 or not fairMember(fc.member) then
      return redis.error_reply('ERR tollgate apply: bad fair arguments')
    end
    -- FairPolicy's quantum, credit and maxKeys.
    p.quantum = fmax(p.quantum, 1)
    p.credit = fmax(p.credit, p.quantum)
    if p.maxKeys <= 0 or p.maxKeys > 1024 then p.maxKeys = 1024 end
    local st = fairs[fki]
    if st == nil then
      st = loadFair(keys[fki])
      fairs[fki] = st
      fairList[#fairList + 1] = st
    end
    if ttl > st.ttl then st.ttl = ttl end
    fc.st, fc.ki = st, fki
    ch.fair = fc
  end

  local out = {1}
  local void = false
  reset(order)
  if mode == 'undo' then
    for ki, k in pairs(counters) do
      local a = argv[tail + ki]
      if a ~= '' then
        local ok, u = pcall(munpack, a)
        if not ok or type(u) ~= 'table' then return redis.error_reply('ERR tollgate apply: bad undo arguments') end
        undo(k, u)
      end
    end
    -- A fair state goes back to what the denial would have recorded, if
    -- no other decision has changed it since the try.
    for ki, st in pairs(fairs) do
      local a = argv[tail + ki]
      if a ~= '' then
        local ok, u = pcall(munpack, a)
        local alt = ok and type(u) == 'table' and type(u[1]) == 'string' and type(u[2]) == 'string' and fairDecode(u[2])
        if not alt then return redis.error_reply('ERR tollgate apply: bad undo arguments') end
        if fairEncode(st) == u[1] then
          fairSet(st, alt)
          st.ver, st.moved = st.ver + 1, true
        end
      end
    end
    for j = 1, n do
      out[4 * j - 2], out[4 * j - 1] = 1, 0
    end
  else
    local admitted = true
    void = mode == 'void'
    for j, ch in ipairs(charges) do
      local fits, retry
      if ch.fair ~= nil and not fairGate(ch.fair.st, ch.fair, fairRoom(ch)) then
        -- The gate's denial: the counter is not stepped (fairRoom has
        -- touched a window, as the step would have).
        fits, retry = false, fairRetry(ch)
      else
        fits, retry = step(ch)
      end
      ch.fits = fits
      local o = 4 * j - 2
      if fits then out[o] = 1 else out[o] = 0 end
      out[o + 1] = retry
      if ch.cost >= 0 and not fits then
        if ch.kind == 'o' then
          void = true
        elseif not ch.shadow and not ch.force then
          admitted = false
        end
      end
    end
    if void then
      out[1] = 0
      reset(order)
    elseif not admitted then
      out[1] = 0
      denial(charges, order)
    elseif mode == 'try' then
      local kept = {}
      for ki, k in pairs(counters) do kept[ki] = k.work end
      denial(charges, order)
      -- What the fair states would record if another slot denied.
      local alts = {}
      for ki, st in pairs(fairs) do alts[ki] = copyFair(st) end
      for _, ch in ipairs(charges) do
        if ch.fair ~= nil then fairRecord(alts[ch.fair.ki], ch.fair, fairOutcome(ch, false)) end
      end
      for _, ch in ipairs(charges) do
        if ch.fair ~= nil then fairRecord(ch.fair.st, ch.fair, fairOutcome(ch, true)) end
      end
      for ki = 1, #keys do
        local k, st = counters[ki], fairs[ki]
        if k then
          out[1 + 4 * n + ki] = undoData(k, kept[ki], k.work)
          k.work = kept[ki]
        elseif st then
          -- Undo's value for a fair state: the state this call keeps,
          -- and the one to put back in its place.
          local keep, alt = fairEncode(st), fairEncode(alts[ki])
          if keep == alt then
            out[1 + 4 * n + ki] = ''
          else
            out[1 + 4 * n + ki] = mpack({keep, alt})
          end
        else
          out[1 + 4 * n + ki] = ''
        end
      end
    end
    if not void and not (mode == 'try' and admitted) then
      for _, ch in ipairs(charges) do
        if ch.fair ~= nil then fairRecord(ch.fair.st, ch.fair, fairOutcome(ch, admitted)) end
      end
    end
  end
  if not void then
    for _, k in ipairs(order) do save(k) end
    for _, st in ipairs(fairList) do saveFair(st) end
  end

  -- Every result describes its counter after the whole Apply.
  for j, ch in ipairs(charges) do
    local o = 4 * j - 2
    out[o + 2], out[o + 3] = report(ch.k.type, ch.k.work, ch)
  end
  return out
end
