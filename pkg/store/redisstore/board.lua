-- board.lua: publish one replica's pressure score (see board.go).
--
-- KEYS[1]  the scope's hash: field = replica, value = "score:expiresAtMs"
-- ARGV[1]  now, Unix ms (the caller's clock, never Redis TIME)
-- ARGV[2]  replica
-- ARGV[3]  score, as Go formats it
-- ARGV[4]  expiresAt, Unix ms (> now)
-- ARGV[5]  margin, ms: the hash outlives its latest entry by this much,
--          as Redis expires keys by its own clock
--
-- Sets the replica's entry, drops the entries expired at now, and makes
-- the hash expire margin ms after the latest entry left. Returns the
-- number of live entries.
local now = tonumber(ARGV[1])
local exp = tonumber(ARGV[4])
local margin = tonumber(ARGV[5])
if now == nil or exp == nil or margin == nil or exp <= now then
  return redis.error_reply('board.lua: bad arguments')
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3] .. ':' .. ARGV[4])
local all = redis.call('HGETALL', KEYS[1])
local latest = exp
local live = 0
for i = 1, #all, 2 do
  local e = tonumber(string.match(all[i + 1], ':(%-?%d+)$'))
  if e == nil or e <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    live = live + 1
    if e > latest then latest = e end
  end
end
redis.call('PEXPIRE', KEYS[1], latest - now + margin)
return live
