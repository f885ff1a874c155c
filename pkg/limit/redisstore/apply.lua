-- apply.lua applies the charges of one decision atomically: limit.Store's
-- contract, run as limit.Counter (algo.go) runs it, step for step, so that
-- this store and memstore agree to the millisecond and the bit. Time comes
-- from the caller; the script never reads the server clock.
--
-- KEYS: the decision's distinct counter keys (all in one cluster slot).
-- ARGV[1]: mode: "apply", "try" or "undo" (below).
-- ARGV[2]: now, integer Unix milliseconds.
-- ARGV[3]: n, the number of charges; then 7 values per charge:
--   key index into KEYS, kind, amount, p1, p2, cost, flags
--   kind "s", sliding window: p1 = bucket width w, p2 = M
--   kind "f", fixed window:   p1 = window W,       p2 = 0
--   kind "t", token bucket:   p1 = window W,       p2 = burst B
--   flags: "" or any of "s" (Shadow) and "f" (Force)
--
-- State. A window is a hash: "w", the width its buckets are counted in;
-- "h", its high-water bucket index; and bucket index -> count. A token
-- bucket is the string "At:Debt": tat = At + Debt, At the integer ms of
-- the last write, Debt the float ms the bucket was then short of full.
-- Every key written expires once its counter is equivalent to a fresh
-- one, plus ttlMargin: Redis expires keys by its own clock, and the
-- replicas that pass now may be a little behind it.
--
-- Reply: {admitted (1 or 0), then 4 values per charge}: fits (1 or 0),
-- retry after (ms), then, after the whole Apply, for a window its usage
-- and reset after (ms), for a token bucket its Debt at now (a string: a
-- Lua number becomes an integer in a reply) and 0.
--
-- A Redis Cluster decision whose keys span slots runs "try" on each slot:
-- "apply", plus, when the slot admits, 2 values per key that "undo" needs
-- to take back what the slot kept if another slot denies. "undo" takes
-- the same charges at the same now, then those 2 values per key, and
-- leaves each key as a denied "apply" would have.

local ttlMargin = 1000
-- eps = B*T / 2^32: the token bucket's tolerance, as in algo.go.
local tbEps = 1 / 4294967296

local mode = ARGV[1]
local now = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
if now == nil or n == nil or (mode ~= 'apply' and mode ~= 'try' and mode ~= 'undo') then
  return redis.error_reply('ERR tollgate apply: bad arguments')
end
local extra = 0
if mode == 'undo' then extra = 2 * #KEYS end
if #ARGV ~= 3 + 7 * n + extra then
  return redis.error_reply('ERR tollgate apply: bad argument count')
end

local function fmtint(x) return string.format('%d', x) end
local function fmtfloat(x) return string.format('%.17g', x) end

local function fail(key, what)
  error({err = 'ERR tollgate apply: ' .. key .. ' ' .. what})
end

-- Counters, one per key index: {key, token, stored, work}. A window
-- counter is {width, high, b}, b its buckets {idx, count} in ascending
-- idx; a token bucket counter is {at, debt}.
local counters, order = {}, {}

local function loadWindow(key)
  local flat = redis.call('HGETALL', key)
  local c = {width = 0, high = 0, b = {}, exists = #flat > 0}
  for i = 1, #flat, 2 do
    local f, v = flat[i], tonumber(flat[i + 1])
    if v == nil then fail(key, 'does not hold a window') end
    if f == 'w' then
      c.width = v
    elseif f == 'h' then
      c.high = v
    else
      local idx = tonumber(f)
      if idx == nil or v <= 0 then fail(key, 'does not hold a window') end
      c.b[#c.b + 1] = {idx, v}
    end
  end
  if c.exists and c.width <= 0 then fail(key, 'does not hold a window') end
  table.sort(c.b, function(x, y) return x[1] < y[1] end)
  return c
end

-- parseToken reads "At:Debt"; nil when s is not one.
local function parseToken(s)
  local at, debt = string.match(s, '^(-?%d+):(.+)$')
  at, debt = tonumber(at), tonumber(debt)
  if at == nil or debt == nil then return nil end
  return {at = at, debt = debt}
end

local function loadToken(key)
  local v = redis.call('GET', key)
  if not v then return {at = 0, debt = 0} end
  local c = parseToken(v)
  if c == nil then fail(key, 'does not hold a token bucket') end
  c.exists = true
  return c
end

local function copy(k)
  local s = k.stored
  if k.token then return {at = s.at, debt = s.debt} end
  local b = {}
  for i, x in ipairs(s.b) do b[i] = {x[1], x[2]} end
  return {width = s.width, high = s.high, b = b}
end

local function reset()
  for _, k in ipairs(order) do k.work = copy(k) end
end

-- Windows ---------------------------------------------------------------

-- touch makes c a window of width w whose high-water mark is at least
-- now's bucket, and drops the buckets older than high-M.
local function touch(c, w, m)
  local cur = math.floor(now / w)
  if c.width ~= w then
    -- Fresh, or counted in another width: start over.
    c.width, c.high, c.b = w, cur, {}
  end
  if cur > c.high then c.high = cur end
  local i = 1
  while i <= #c.b and c.b[i][1] < c.high - m do i = i + 1 end
  if i > 1 then
    local b = {}
    for j = i, #c.b do b[#b + 1] = c.b[j] end
    c.b = b
  end
end

-- view is c as one charge sees it: b[lo..hi] are the counted buckets,
-- [cur-M, cur] with cur = max(floor(now/w), high); none when c has
-- another width.
local function view(c, w, m)
  local v = {w = w, m = m, cur = math.floor(now / w), lo = 1, hi = 0}
  if c.width ~= w then return v end
  if c.high > v.cur then v.cur = c.high end
  v.b = c.b
  local lo = 1
  while lo <= #c.b and c.b[lo][1] < v.cur - m do lo = lo + 1 end
  local hi = lo - 1
  while hi < #c.b and c.b[hi + 1][1] <= v.cur do hi = hi + 1 end
  v.lo, v.hi = lo, hi
  return v
end

local function usage(v)
  local u = 0
  for i = v.lo, v.hi do u = u + v.b[i][2] end
  return u
end

local function resetAfter(v, fixed)
  if fixed then return (v.cur + 1) * v.w - now end
  if v.hi < v.lo then return 0 end
  return (v.b[v.hi][1] + v.m + 1) * v.w - now
end

-- retryAfter is the earliest time at which a charge of need (> 0) fits as
-- the oldest counted buckets leave one by one.
local function retryAfter(v, fixed, need, amount)
  if need > amount then return resetAfter(v, fixed) end
  local u = usage(v)
  for i = v.lo, v.hi do
    u = u - v.b[i][2]
    if u <= amount - need then return (v.b[i][1] + v.m + 1) * v.w - now end
  end
  return resetAfter(v, fixed)
end

local function windowStep(c, ch)
  touch(c, ch.p1, ch.p2)
  local v = view(c, ch.p1, ch.p2)
  local fixed = ch.kind == 'f'
  local cost, amount = ch.cost, ch.amount
  if cost < 0 then
    local r = -cost
    for i = v.hi, v.lo, -1 do
      if r <= 0 then break end
      local take = math.min(r, c.b[i][2])
      c.b[i][2] = c.b[i][2] - take
      r = r - take
    end
    local b = {}
    for _, x in ipairs(c.b) do
      if x[2] > 0 then b[#b + 1] = x end
    end
    c.b = b
    return true, 0
  elseif cost == 0 then
    if usage(v) < amount then return true, 0 end
    return false, retryAfter(v, fixed, 1, amount)
  end
  local fits, retry = true, 0
  if cost > amount or usage(v) > amount - cost then
    fits, retry = false, retryAfter(v, fixed, cost, amount)
    if not ch.force then return false, retry end
  end
  -- touch left every bucket at or below cur = high.
  local last = c.b[#c.b]
  if last and last[1] == v.cur then
    last[2] = last[2] + cost
  else
    c.b[#c.b + 1] = {v.cur, cost}
  end
  return fits, retry
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
    c.at, c.debt = now, d
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
    return false, math.max(1, math.ceil(x - lim))
  end
  local nd = d + cost * T
  if cost > ch.p2 then
    if ch.force then setDebt(c, nd) end
    return false, math.max(0, math.ceil(d - BT * tbEps))
  end
  if nd <= lim then
    setDebt(c, nd)
    return true, 0
  end
  if ch.force then setDebt(c, nd) end
  return false, math.max(1, math.ceil(nd - lim))
end

local function tokenString(c)
  if c.debt <= 0 then return '' end
  return fmtint(c.at) .. ':' .. fmtfloat(c.debt)
end

-- Charges ---------------------------------------------------------------

local charges = {}
for j = 1, n do
  local base = 3 + 7 * (j - 1)
  local flags = ARGV[base + 7]
  local ch = {
    ki = tonumber(ARGV[base + 1]),
    kind = ARGV[base + 2],
    amount = tonumber(ARGV[base + 3]),
    p1 = tonumber(ARGV[base + 4]),
    p2 = tonumber(ARGV[base + 5]),
    cost = tonumber(ARGV[base + 6]),
    shadow = string.find(flags, 's', 1, true) ~= nil,
    force = string.find(flags, 'f', 1, true) ~= nil,
  }
  if ch.ki == nil or KEYS[ch.ki] == nil or ch.amount == nil or ch.p1 == nil or ch.p2 == nil or
      ch.cost == nil or (ch.kind ~= 's' and ch.kind ~= 'f' and ch.kind ~= 't') or ch.p1 <= 0 then
    return redis.error_reply('ERR tollgate apply: bad charge arguments')
  end
  local k = counters[ch.ki]
  if k == nil then
    local key = KEYS[ch.ki]
    k = {key = key, token = ch.kind == 't'}
    if k.token then k.stored = loadToken(key) else k.stored = loadWindow(key) end
    counters[ch.ki] = k
    order[#order + 1] = k
  elseif k.token ~= (ch.kind == 't') then
    return redis.error_reply('ERR tollgate apply: a key charged as a window and a token bucket')
  end
  ch.k = k
  -- The last charge on a key says how long its state lives.
  k.last = ch
  charges[j] = ch
end

local function step(ch)
  if ch.k.token then return tokenStep(ch.k.work, ch) end
  return windowStep(ch.k.work, ch)
end

-- Writes ----------------------------------------------------------------

-- expiry is the Unix ms from which k's counter is equivalent to a fresh
-- one, as its last charge counts; nil when it is fresh already.
local function expiry(k)
  local c, ch = k.work, k.last
  if k.token then
    if c.debt <= 0 then return nil end
    return c.at + math.ceil(c.debt)
  end
  if c.width ~= ch.p1 then return nil end
  -- Until then the newest bucket may count, or high still moves cur.
  return (c.high + ch.p2 + 1) * c.width
end

local function save(k)
  local c, s = k.work, k.stored
  local exp = expiry(k)
  if exp == nil or exp <= now then
    if s.exists then redis.call('DEL', k.key) end
    return
  end
  local ttl = fmtint(exp - now + ttlMargin)
  if k.token then
    if c.at ~= s.at or c.debt ~= s.debt then
      redis.call('SET', k.key, tokenString(c), 'PX', ttl)
    end
    return
  end
  local had, kept = {}, {}
  for _, x in ipairs(s.b) do had[x[1]] = x[2] end
  for _, x in ipairs(c.b) do kept[x[1]] = x[2] end
  local del, set = {}, {}
  for _, x in ipairs(s.b) do
    if kept[x[1]] == nil then del[#del + 1] = fmtint(x[1]) end
  end
  for _, x in ipairs(c.b) do
    if had[x[1]] ~= x[2] then
      set[#set + 1] = fmtint(x[1])
      set[#set + 1] = fmtint(x[2])
    end
  end
  if c.width ~= s.width then
    set[#set + 1] = 'w'
    set[#set + 1] = fmtint(c.width)
  end
  if c.high ~= s.high or not s.exists then
    set[#set + 1] = 'h'
    set[#set + 1] = fmtint(c.high)
  end
  if #del == 0 and #set == 0 then return end
  if #del > 0 then redis.call('HDEL', k.key, unpack(del)) end
  if #set > 0 then redis.call('HSET', k.key, unpack(set)) end
  redis.call('PEXPIRE', k.key, ttl)
end

-- Undo ------------------------------------------------------------------

-- undoData describes how k's kept state (work) differs from the state a
-- denial would have kept (alt): for a window, the width and the counts to
-- take off, "w;idx:count,..."; for a token bucket, both states.
local function undoData(token, work, alt)
  if token then
    local a, b = tokenString(work), tokenString(alt)
    if a == b then return '', '' end
    return a, b
  end
  local had = {}
  if alt.width == work.width then
    for _, x in ipairs(alt.b) do had[x[1]] = x[2] end
  end
  local parts = {}
  for _, x in ipairs(work.b) do
    local d = x[2] - (had[x[1]] or 0)
    if d > 0 then parts[#parts + 1] = fmtint(x[1]) .. ':' .. fmtint(d) end
  end
  if #parts == 0 then return '', '' end
  return fmtint(work.width) .. ';' .. table.concat(parts, ','), ''
end

-- undo takes back what a try kept on k. A window loses the counts the try
-- added, floored at zero. A token bucket nothing has moved since goes to
-- the state a denial would have kept; one another decision moved loses the
-- debt the try added but never goes below that state, so a compensation
-- can under-admit and never over-admit.
local function undo(k, a, b)
  if a == '' and b == '' then return end
  local c = k.work
  if not k.token then
    local width, rest = string.match(a, '^(%d+);(.*)$')
    if tonumber(width) ~= c.width then return end
    local take = {}
    for idx, d in string.gmatch(rest, '(-?%d+):(%d+)') do take[tonumber(idx)] = tonumber(d) end
    local out = {}
    for _, x in ipairs(c.b) do
      local left = x[2] - (take[x[1]] or 0)
      if left > 0 then out[#out + 1] = {x[1], left} end
    end
    c.b = out
    return
  end
  local kept, alt = {at = 0, debt = 0}, {at = 0, debt = 0}
  if a ~= '' then kept = parseToken(a) end
  if b ~= '' then alt = parseToken(b) end
  if kept == nil or alt == nil then
    error({err = 'ERR tollgate apply: bad undo arguments'})
  end
  if tokenString(c) == a then
    c.at, c.debt = alt.at, alt.debt
    return
  end
  local floor = debt(alt)
  setDebt(c, math.max(debt(c) - (debt(kept) - floor), floor))
end

-- Run -------------------------------------------------------------------

local out = {1}
reset()
if mode == 'undo' then
  for ki = 1, #KEYS do
    local k = counters[ki]
    local e = 3 + 7 * n + 2 * (ki - 1)
    if k then undo(k, ARGV[e + 1], ARGV[e + 2]) end
  end
  for j = 1, n do
    out[4 * j - 2], out[4 * j - 1] = 1, 0
  end
else
  local admitted = true
  for j, ch in ipairs(charges) do
    local fits, retry = step(ch)
    local o = 4 * j - 2
    if fits then out[o] = 1 else out[o] = 0 end
    out[o + 1] = retry
    if ch.cost >= 0 and not fits and not ch.shadow and not ch.force then
      admitted = false
    end
  end
  -- denial starts over from the stored state and keeps the refunds and
  -- the Force charges, and the time the other charges saw.
  local function denial()
    reset()
    for _, ch in ipairs(charges) do
      if ch.cost < 0 or (ch.cost > 0 and ch.force) then
        step(ch)
      elseif not ch.k.token then
        touch(ch.k.work, ch.p1, ch.p2)
      end
    end
  end
  if not admitted then
    out[1] = 0
    denial()
  elseif mode == 'try' then
    local kept = {}
    for ki, k in pairs(counters) do kept[ki] = k.work end
    denial()
    local base = 1 + 4 * n
    for ki = 1, #KEYS do
      local k = counters[ki]
      local a, b = '', ''
      if k then
        a, b = undoData(k.token, kept[ki], k.work)
        k.work = kept[ki]
      end
      out[base + 2 * ki - 1], out[base + 2 * ki] = a, b
    end
  end
end
for _, k in ipairs(order) do save(k) end

-- Every result describes its counter after the whole Apply.
for j, ch in ipairs(charges) do
  local o = 4 * j - 2
  if ch.k.token then
    out[o + 2], out[o + 3] = fmtfloat(debt(ch.k.work)), 0
  else
    local v = view(ch.k.work, ch.p1, ch.p2)
    out[o + 2], out[o + 3] = usage(v), resetAfter(v, ch.kind == 'f')
  end
end
return out
