-- apply.lua applies the charges of one decision atomically: limit.Store's
-- contract, run as limit.Counter (algo.go) runs it, step for step, so that
-- this store and memstore agree to the millisecond and the bit. Time comes
-- from the caller; the script never reads the server clock.
--
-- KEYS: the decision's distinct counter keys (all in one cluster slot).
-- ARGV[1]: mode: "apply", "try", "undo" or "void" (below).
-- ARGV[2]: now, integer Unix milliseconds.
-- ARGV[3]: n, the number of charges; then 8 values per charge:
--   key index into KEYS, kind, amount, p1, p2, p3, cost, flags
--   kind "s", sliding window: p1 = bucket width w, p2 = M, p3 = At (0: unset)
--   kind "f", fixed window:   p1 = window W,       p2 = 0, p3 = 0
--   kind "t", token bucket:   p1 = window W,       p2 = burst B, p3 = 0
--   kind "c", concurrency:    p1 = lease W,        p2 = 0, p3 = member
--   kind "o", once:           p1 = mark W,         p2 = 0, p3 = 0
--   flags: "" or any of "s" (Shadow) and "f" (Force)
--
-- State. A window is a hash: "w", the width its buckets are counted in;
-- "h", its high-water bucket index; and bucket index -> count. A token
-- bucket is the string "At:Debt": tat = At + Debt, At the integer ms of
-- the last write, Debt the float ms the bucket was then short of full.
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
-- A Redis Cluster decision whose keys span slots runs "try" on each slot:
-- "apply", plus, when the slot admits, 2 values per key that "undo" needs
-- to take back what the slot kept if another slot denies. "undo" takes
-- the same charges at the same now, then those 2 values per key, and
-- leaves each key as a denied "apply" would have, except Once marks: a
-- try holds either Once charges only or none, and one with Once charges
-- is undone only when the decision is void, so undo puts a mark back as
-- it was before the try, if it is still the one the try left.

local ttlMargin = 1000
-- eps = B*T / 2^32: the token bucket's tolerance, as in algo.go.
local tbEps = 1 / 4294967296

local mode = ARGV[1]
local now = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
if now == nil or n == nil or (mode ~= 'apply' and mode ~= 'try' and mode ~= 'undo' and mode ~= 'void') then
  return redis.error_reply('ERR tollgate apply: bad arguments')
end
local extra = 0
if mode == 'undo' then extra = 2 * #KEYS end
if #ARGV ~= 3 + 8 * n + extra then
  return redis.error_reply('ERR tollgate apply: bad argument count')
end

local function fmtint(x) return string.format('%d', x) end
local function fmtfloat(x) return string.format('%.17g', x) end

local function fail(key, what)
  error({err = 'ERR tollgate apply: ' .. key .. ' ' .. what})
end

-- Counters, one per key index: {key, type, stored, work}, type "window",
-- "token", "lease" or "mark". A window counter is {width, high, b}, b its
-- buckets {idx, count} in ascending idx; a token bucket counter is {at,
-- debt}; a lease counter is {l}, l its live leases {member, deadline}; a
-- mark counter is {untl}, the mark's deadline or nil.
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

local function loadLeases(key)
  local flat = redis.call('ZRANGEBYSCORE', key, '(' .. fmtint(now), '+inf', 'WITHSCORES')
  local c = {l = {}}
  for i = 1, #flat, 2 do
    c.l[#c.l + 1] = {flat[i], tonumber(flat[i + 1])}
  end
  return c
end

local function loadMark(key)
  local v = redis.call('GET', key)
  if not v then return {} end
  local u = tonumber(v)
  if u == nil or u ~= math.floor(u) then fail(key, 'does not hold a mark') end
  return {untl = u, exists = true}
end

local function copy(k)
  local s = k.stored
  if k.type == 'token' then return {at = s.at, debt = s.debt} end
  if k.type == 'mark' then return {untl = s.untl} end
  if k.type == 'lease' then
    local l = {}
    for i, x in ipairs(s.l) do l[i] = {x[1], x[2]} end
    return {l = l}
  end
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
    if ch.p3 ~= 0 and not fixed then
      -- The bucket the refunded cost was charged in, while it counts.
      local at = math.floor(ch.p3 / ch.p1)
      for i = v.lo, v.hi do
        if c.b[i][1] == at then
          local take = math.min(r, c.b[i][2])
          c.b[i][2] = c.b[i][2] - take
          r = r - take
          break
        end
      end
    end
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

-- Leases and marks --------------------------------------------------------

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

-- Charges ---------------------------------------------------------------

local types = {s = 'window', f = 'window', t = 'token', c = 'lease', o = 'mark'}
local loaders = {window = loadWindow, token = loadToken, lease = loadLeases, mark = loadMark}

local charges = {}
local marks = 0
for j = 1, n do
  local base = 3 + 8 * (j - 1)
  local flags = ARGV[base + 8]
  local ch = {
    ki = tonumber(ARGV[base + 1]),
    kind = ARGV[base + 2],
    amount = tonumber(ARGV[base + 3]),
    p1 = tonumber(ARGV[base + 4]),
    p2 = tonumber(ARGV[base + 5]),
    p3 = ARGV[base + 6],
    cost = tonumber(ARGV[base + 7]),
    shadow = string.find(flags, 's', 1, true) ~= nil,
    force = string.find(flags, 'f', 1, true) ~= nil,
  }
  local t = types[ch.kind]
  if t ~= 'lease' then ch.p3 = tonumber(ch.p3) end
  if ch.ki == nil or KEYS[ch.ki] == nil or ch.amount == nil or ch.p1 == nil or ch.p2 == nil or
      ch.p3 == nil or ch.cost == nil or t == nil or ch.p1 <= 0 or
      (t == 'lease' and ch.cost ~= 0 and ch.p3 == '') then
    return redis.error_reply('ERR tollgate apply: bad charge arguments')
  end
  local k = counters[ch.ki]
  if k == nil then
    local key = KEYS[ch.ki]
    k = {key = key, type = t}
    k.stored = loaders[t](key)
    counters[ch.ki] = k
    order[#order + 1] = k
  elseif k.type ~= t then
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

local steps = {window = windowStep, token = tokenStep, lease = leaseStep, mark = markStep}

local function step(ch)
  return steps[ch.k.type](ch.k.work, ch)
end

-- Writes ----------------------------------------------------------------

-- expiry is the Unix ms from which k's counter is equivalent to a fresh
-- one, as its last charge counts; nil when it is fresh already.
local function expiry(k)
  local c, ch = k.work, k.last
  if k.type == 'token' then
    if c.debt <= 0 then return nil end
    return c.at + math.ceil(c.debt)
  end
  if k.type == 'mark' then return c.untl end
  if k.type == 'lease' then
    local d
    for _, x in ipairs(c.l) do
      if d == nil or x[2] > d then d = x[2] end
    end
    return d
  end
  if c.width ~= ch.p1 then return nil end
  -- Until then the newest bucket may count, or high still moves cur.
  return (c.high + ch.p2 + 1) * c.width
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
  if s.exists then redis.call('DEL', k.key) end
end

local function save(k)
  local c, s = k.work, k.stored
  local exp = expiry(k)
  if k.type == 'lease' then return saveLeases(k, exp) end
  if k.type == 'mark' then return saveMark(k) end
  if exp == nil or exp <= now then
    if s.exists then redis.call('DEL', k.key) end
    return
  end
  local ttl = fmtint(exp - now + ttlMargin)
  if k.type == 'token' then
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

-- encodeLeases writes {member, kept, alt} entries as "len:member" then
-- "kept,alt;" (either may be empty: no lease): a member may hold any byte.
local function encodeLeases(entries)
  local parts = {}
  for _, e in ipairs(entries) do
    parts[#parts + 1] = fmtint(#e[1]) .. ':' .. e[1] .. (e[2] and fmtint(e[2]) or '') .. ',' ..
      (e[3] and fmtint(e[3]) or '') .. ';'
  end
  return table.concat(parts)
end

local function decodeLeases(s)
  local entries, pos = {}, 1
  while pos <= #s do
    local len, p = string.match(s, '^(%d+):()', pos)
    if len == nil then return nil end
    local member = string.sub(s, p, p + tonumber(len) - 1)
    local kept, alt, q = string.match(s, '^(-?%d*),(-?%d*);()', p + tonumber(len))
    if q == nil then return nil end
    entries[#entries + 1] = {member, tonumber(kept), tonumber(alt)}
    pos = q
  end
  return entries
end

-- undoData describes how k's kept state (work) differs from the state a
-- denial would have kept (alt): for a window, the width and the counts to
-- take off, "w;idx:count,..."; for a token bucket, both states; for
-- leases, each member whose deadline differs, with both deadlines; for a
-- mark, the kept and the stored deadlines (see the head of the script).
local function undoData(k, work, alt)
  if k.type == 'mark' then
    local a, b = work.untl, k.stored.untl
    if a == b then return '', '' end
    return a and fmtint(a) or '', b and fmtint(b) or ''
  end
  if k.type == 'lease' then
    local was, entries = {}, {}
    for _, x in ipairs(alt.l) do was[x[1]] = x[2] end
    for _, x in ipairs(work.l) do
      if was[x[1]] ~= x[2] then entries[#entries + 1] = {x[1], x[2], was[x[1]]} end
      was[x[1]] = nil
    end
    for _, x in ipairs(alt.l) do
      if was[x[1]] ~= nil then entries[#entries + 1] = {x[1], nil, x[2]} end
    end
    return encodeLeases(entries), ''
  end
  local token = k.type == 'token'
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
  if k.type == 'mark' then
    -- Only the mark the try left, if nothing has changed it since.
    if (c.untl and fmtint(c.untl) or '') == a then c.untl = tonumber(b) end
    return
  end
  if k.type == 'lease' then
    -- Each lease the try changed goes back, if nothing has changed it since.
    local entries = decodeLeases(a)
    if entries == nil then error({err = 'ERR tollgate apply: bad undo arguments'}) end
    for _, e in ipairs(entries) do
      local i = findLease(c, e[1])
      local cur = i and c.l[i][2]
      if cur == e[2] then
        if e[3] == nil then
          table.remove(c.l, i)
        elseif i then
          c.l[i][2] = e[3]
        else
          c.l[#c.l + 1] = {e[1], e[3]}
        end
      end
    end
    return
  end
  if k.type == 'window' then
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
local void = false
reset()
if mode == 'undo' then
  for ki = 1, #KEYS do
    local k = counters[ki]
    local e = 3 + 8 * n + 2 * (ki - 1)
    if k then undo(k, ARGV[e + 1], ARGV[e + 2]) end
  end
  for j = 1, n do
    out[4 * j - 2], out[4 * j - 1] = 1, 0
  end
else
  local admitted = true
  void = mode == 'void'
  for j, ch in ipairs(charges) do
    local fits, retry = step(ch)
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
  -- denial starts over from the stored state and keeps the refunds, the
  -- Force charges and the Once marks, and the time the other charges saw
  -- (a lease counter holds live leases only, and save drops the others).
  local function denial()
    reset()
    for _, ch in ipairs(charges) do
      if ch.cost < 0 or (ch.cost > 0 and (ch.force or ch.kind == 'o')) then
        step(ch)
      elseif ch.k.type == 'window' then
        touch(ch.k.work, ch.p1, ch.p2)
      end
    end
  end
  if void then
    out[1] = 0
    reset()
  elseif not admitted then
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
        a, b = undoData(k, kept[ki], k.work)
        k.work = kept[ki]
      end
      out[base + 2 * ki - 1], out[base + 2 * ki] = a, b
    end
  end
end
if not void then
  for _, k in ipairs(order) do save(k) end
end

-- Every result describes its counter after the whole Apply.
for j, ch in ipairs(charges) do
  local o = 4 * j - 2
  local c = ch.k.work
  if ch.k.type == 'token' then
    out[o + 2], out[o + 3] = fmtfloat(debt(c)), 0
  elseif ch.k.type == 'lease' then
    out[o + 2], out[o + 3] = #c.l, firstDeadline(c)
  elseif ch.k.type == 'mark' then
    out[o + 2], out[o + 3] = 0, 0
  else
    local v = view(c, ch.p1, ch.p2)
    out[o + 2], out[o + 3] = usage(v), resetAfter(v, ch.kind == 'f')
  end
end
return out
