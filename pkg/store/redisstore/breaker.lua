-- breaker.lua runs one circuit breaker operation atomically: breaker.Cell's
-- Allow, Record or Status (pkg/breaker/cell.go), step for step. Time comes
-- from the caller; the script never reads the server clock.
--
-- KEYS[1]: the breaker's key (breaker.StoreKey). KEYS[2], for a failure
-- reported with a once ID only: its marker (breaker.OnceKey, same hash tag).
-- ARGV: mode ("allow", "record", "release" or "state"), now (Unix ms), failure
-- threshold, window (ms), open for (ms), half-open probes, close after,
-- probe lease (ms), retain (ms), success ("1" or "0", record), probe ID
-- (allow: the ID a new probe's slot gets, from Go's crypto/rand, as Lua
-- has no good randomness; record, release: the probe reporting), the
-- marker's TTL (ms, breaker.OnceTTL), failure rate (0: off), min requests
-- (0: off), and a batch of successes (record: Report.Successes, 0 for
-- none). Rated (failure rate or min requests set): a closed breaker
-- counts failures and successes in 10 buckets across the window
-- (breaker.RateBuckets, breaker.BucketWidth) instead of failure times.
--
-- State: a hash. "s": "o" open or "h" half-open (absent: closed); "u":
-- when an open breaker goes half-open; "k": probe successes; "f": the
-- failure times, "t1,t2,..."; "p": the probe slots, "id=deadline,...";
-- "c": a rated closed breaker's buckets, "at:failures:successes,...",
-- oldest first.
-- Keys written by an older version may also hold "g" and "q" (the probe
-- IDs' old parts), which are ignored and dropped on the next write.
-- A fresh (closed, no failures) breaker has no key. Every write sets the
-- key to expire ttlMargin after Cell.Expiry: Redis expires keys by its own
-- clock, and the replicas that pass now may be a little behind it.
--
-- Reply: {state (0 closed, 1 half-open, 2 open), transition from (-1:
-- none; else to is the state), allowed (1 or 0), probe ID, retry after
-- (ms), failures, open until (ms), probes, successes, volume}. The last
-- five are Status's, set by "state" only.

local ttlMargin = 1000
local maxProbeID = 64 -- breaker.MaxProbeIDBytes

local mode = ARGV[1]
local now = tonumber(ARGV[2])
local threshold = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local openFor = tonumber(ARGV[5])
local maxProbes = tonumber(ARGV[6])
local closeAfter = tonumber(ARGV[7])
local lease = tonumber(ARGV[8])
local retain = tonumber(ARGV[9])
local success = ARGV[10] == '1'
local probeID = ARGV[11] or ''
local onceTTL = tonumber(ARGV[12])
local rate = tonumber(ARGV[13])
local minRequests = tonumber(ARGV[14])
local batch = tonumber(ARGV[15])
if now == nil or threshold == nil or window == nil or openFor == nil or maxProbes == nil or
    closeAfter == nil or lease == nil or retain == nil or onceTTL == nil or rate == nil or
    minRequests == nil or batch == nil then
  return redis.error_reply('ERR tollgate breaker: bad arguments')
end
local rated = rate > 0 or minRequests > 0
local nBuckets = 10 -- breaker.RateBuckets
-- breaker.BucketWidth: window / 10 rounded up, at least 1.
local width = math.max(math.floor((window + nBuckets - 1) / nBuckets), 1)

local function fmtint(x) return string.format('%d', x) end

local CLOSED, HALF, OPEN = 0, 1, 2
local key = KEYS[1]

-- Load.
local c = {state = CLOSED, untl = 0, succ = 0, fails = {}, probes = {}, counts = {}}
local flat = redis.call('HGETALL', key)
local h = {}
for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
if h.s == 'o' then c.state = OPEN elseif h.s == 'h' then c.state = HALF end
c.untl = tonumber(h.u or '0')
c.succ = tonumber(h.k or '0')
for t in string.gmatch(h.f or '', '(-?%d+)') do c.fails[#c.fails + 1] = tonumber(t) end
for id, d in string.gmatch(h.p or '', '([^=,]+)=(-?%d+)') do
  c.probes[#c.probes + 1] = {id, tonumber(d)}
end
for at, f, sc in string.gmatch(h.c or '', '(-?%d+):(%d+):(%d+)') do
  c.counts[#c.counts + 1] = {tonumber(at), tonumber(f), tonumber(sc)}
end

local dirty = false

local function fresh()
  c = {state = CLOSED, untl = 0, succ = 0, fails = {}, probes = {}, counts = {}}
end

local function open()
  fresh()
  c.state, c.untl = OPEN, now + openFor
end

-- slot is the index of probeID's slot, nil for none; an empty ID holds
-- none.
local function slot()
  if probeID == '' then return nil end
  for i, x in ipairs(c.probes) do
    if x[1] == probeID then return i end
  end
  return nil
end

local function save()
  local exp = 0
  if c.state == CLOSED then
    for _, t in ipairs(c.fails) do
      if t + window > exp then exp = t + window end
    end
    for _, b in ipairs(c.counts) do
      if (b[1] + nBuckets) * width > exp then exp = (b[1] + nBuckets) * width end
    end
  else
    exp = c.untl
    for _, x in ipairs(c.probes) do
      if x[2] > exp then exp = x[2] end
    end
    exp = exp + retain
  end
  redis.call('DEL', key)
  if exp <= now then return end
  local set = {}
  if c.state == OPEN then
    set[#set + 1] = 's'; set[#set + 1] = 'o'
  elseif c.state == HALF then
    set[#set + 1] = 's'; set[#set + 1] = 'h'
  end
  if c.untl ~= 0 then set[#set + 1] = 'u'; set[#set + 1] = fmtint(c.untl) end
  if c.succ ~= 0 then set[#set + 1] = 'k'; set[#set + 1] = fmtint(c.succ) end
  if #c.fails > 0 then
    local parts = {}
    for i, t in ipairs(c.fails) do parts[i] = fmtint(t) end
    set[#set + 1] = 'f'; set[#set + 1] = table.concat(parts, ',')
  end
  if #c.probes > 0 then
    local parts = {}
    for i, x in ipairs(c.probes) do parts[i] = x[1] .. '=' .. fmtint(x[2]) end
    set[#set + 1] = 'p'; set[#set + 1] = table.concat(parts, ',')
  end
  if #c.counts > 0 then
    local parts = {}
    for i, b in ipairs(c.counts) do parts[i] = fmtint(b[1]) .. ':' .. fmtint(b[2]) .. ':' .. fmtint(b[3]) end
    set[#set + 1] = 'c'; set[#set + 1] = table.concat(parts, ',')
  end
  if #set == 0 then set = {'s', 'c'} end
  redis.call('HSET', key, unpack(set))
  redis.call('PEXPIRE', key, fmtint(exp - now + ttlMargin))
end

-- count is Cell.count: add to the current bucket of a closed rated
-- breaker, and open it when, within the window, failures >= threshold,
-- failures >= rate x (failures + successes) and failures + successes >=
-- min requests. Only a failure can open it.
local function count(failed, successes)
  local at = math.floor(now / width)
  local kept = {}
  for _, b in ipairs(c.counts) do
    if b[1] > at - nBuckets and b[1] <= at then kept[#kept + 1] = b end
  end
  if #kept == 0 or kept[#kept][1] ~= at then kept[#kept + 1] = {at, 0, 0} end
  c.counts = kept
  local cur = kept[#kept]
  cur[3] = cur[3] + successes
  dirty = true
  if not failed then return end
  cur[2] = cur[2] + 1
  local f, sc = 0, 0
  for _, b in ipairs(kept) do f = f + b[2]; sc = sc + b[3] end
  if f >= threshold and f >= rate * (f + sc) and f + sc >= minRequests then open() end
end

local out = {0, -1, 0, '', 0, 0, 0, 0, 0, 0}

if mode == 'allow' then
  -- The ID is written into "p": it must never hold its separators.
  if probeID == '' or #probeID > maxProbeID or string.find(probeID, '[^%x]') then
    return redis.error_reply('ERR tollgate breaker: bad probe ID')
  end
  if c.state == OPEN and now >= c.untl then
    c.state, c.succ, c.probes = HALF, 0, {}
    out[2] = OPEN
    dirty = true
  end
  out[1] = c.state
  if c.state == OPEN then
    out[5] = c.untl - now
  elseif c.state == HALF then
    local live = {}
    for _, x in ipairs(c.probes) do
      if x[2] > now then live[#live + 1] = x else dirty = true end
    end
    c.probes = live
    if #live < maxProbes then
      c.probes[#c.probes + 1] = {probeID, now + lease}
      out[3], out[4] = 1, probeID
      dirty = true
    else
      local first = live[1][2]
      for _, x in ipairs(live) do
        if x[2] < first then first = x[2] end
      end
      out[5] = first - now
    end
  else
    out[3] = 1
  end
elseif mode == 'record' then
  local from = c.state
  -- A failure named by a once ID is looked at once: a marker holding an
  -- expiry after now means it was delivered before. The expiry follows
  -- the caller's clock, as every time here does; the key's own TTL only
  -- collects it.
  if KEYS[2] ~= nil then
    local seen = tonumber(redis.call('GET', KEYS[2]) or '')
    if seen ~= nil and seen > now then
      out[1] = c.state
      return out
    end
    redis.call('SET', KEYS[2], fmtint(now + onceTTL), 'PX', fmtint(onceTTL + ttlMargin))
  end
  if c.state == CLOSED and batch > 0 then
    -- Cell.Count: a batch of successes, rated only; it never opens.
    if rated then count(false, batch) end
  elseif c.state == CLOSED and rated then
    if success then count(false, 1) else count(true, 0) end
  elseif c.state == CLOSED then
    if not success then
      local kept = {}
      for _, t in ipairs(c.fails) do
        if t > now - window then kept[#kept + 1] = t end
      end
      kept[#kept + 1] = now
      c.fails = kept
      dirty = true
      if #kept >= threshold then open() end
    end
  elseif c.state == HALF and batch == 0 then
    -- Only the probe of a slot held now moves a half-open breaker.
    local i = slot()
    if i ~= nil and c.probes[i][2] > now then
      if not success then
        open()
      else
        table.remove(c.probes, i)
        c.succ = c.succ + 1
        if c.succ >= closeAfter then fresh() end
      end
      dirty = true
    end
  end
  out[1] = c.state
  if c.state ~= from then out[2] = from end
elseif mode == 'release' then
  -- Cell.Release: free the probe's slot, count nothing.
  if c.state == HALF then
    local i = slot()
    if i ~= nil then
      table.remove(c.probes, i)
      dirty = true
    end
  end
  out[1] = c.state
elseif mode == 'state' then
  if c.state == OPEN and now < c.untl then
    out[1], out[7] = OPEN, c.untl
  elseif c.state == OPEN then
    out[1] = HALF
  elseif c.state == HALF then
    local live = 0
    for _, x in ipairs(c.probes) do
      if x[2] > now then live = live + 1 end
    end
    out[1], out[8], out[9] = HALF, live, c.succ
  elseif rated then
    local at = math.floor(now / width)
    local f, v = 0, 0
    for _, b in ipairs(c.counts) do
      if b[1] > at - nBuckets and b[1] <= at then f = f + b[2]; v = v + b[2] + b[3] end
    end
    out[6], out[10] = f, v
  else
    local n = 0
    for _, t in ipairs(c.fails) do
      if t > now - window then n = n + 1 end
    end
    out[6] = n
  end
else
  return redis.error_reply('ERR tollgate breaker: unknown mode')
end

if dirty then save() end
return out
