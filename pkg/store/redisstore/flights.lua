-- flights.lua: begin or end flights in one scope (see shared.go).
--
-- KEYS[1]  the scope's sorted set: member = request ID, score = the
--          flight's expiry, Unix ms
-- ARGV[1]  'begin' or 'end'
-- ARGV[2]  now, Unix ms (the caller's clock, never Redis TIME)
-- ARGV[3]  begin: the expiry of the IDs begun, Unix ms (> now)
-- ARGV[4]  margin, ms: the set outlives its latest flight by this much,
--          as Redis expires keys by its own clock
-- ARGV[5..] the request IDs (at least one)
--
-- Begin sets each ID's expiry (a new flight, or a renewed lease); end
-- removes the IDs. Both then drop the flights expired at now and return
-- how many are left. Begin makes the set expire margin ms after its
-- latest flight, which may be another replica's with a longer lease.
local now = tonumber(ARGV[2])
local margin = tonumber(ARGV[4])
if now == nil or margin == nil or #ARGV < 5 then
  return redis.error_reply('flights.lua: bad arguments')
end
local begin = ARGV[1] == 'begin'
if begin then
  local exp = tonumber(ARGV[3])
  if exp == nil or exp <= now then
    return redis.error_reply('flights.lua: bad expiry')
  end
  local args = {}
  for i = 5, #ARGV do
    args[#args + 1] = ARGV[3]
    args[#args + 1] = ARGV[i]
  end
  redis.call('ZADD', KEYS[1], unpack(args))
elseif ARGV[1] == 'end' then
  redis.call('ZREM', KEYS[1], unpack(ARGV, 5))
else
  return redis.error_reply('flights.lua: bad mode')
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCOUNT', KEYS[1], '-inf', '+inf')
if begin and n > 0 then
  local latest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', KEYS[1], tonumber(latest[2]) - now + margin)
end
return n
