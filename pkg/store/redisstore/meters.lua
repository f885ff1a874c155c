-- meters.lua: add counts to one bucket of a scope (see shared.go).
--
-- KEYS[1]  the bucket's hash: field = name, value = count; the field ''
--          holds the Unix ms until which the bucket is kept
-- ARGV[1]  now, Unix ms (the caller's clock, never Redis TIME)
-- ARGV[2]  kept until, Unix ms (> now): the bucket's end plus keep
-- ARGV[3]  margin, ms: the hash outlives its keep by this much, as Redis
--          expires keys by its own clock
-- ARGV[4..] name, count pairs (counts > 0)
--
-- Keeps the bucket until the latest kept-until any Add gave it.
local now = tonumber(ARGV[1])
local keep = tonumber(ARGV[2])
local margin = tonumber(ARGV[3])
if now == nil or keep == nil or margin == nil or keep <= now or #ARGV % 2 ~= 1 then
  return redis.error_reply('meters.lua: bad arguments')
end
local cur = tonumber(redis.call('HGET', KEYS[1], ''))
if cur == nil or cur < keep then
  redis.call('HSET', KEYS[1], '', ARGV[2])
  cur = keep
end
for i = 4, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], cur - now + margin)
return 1
