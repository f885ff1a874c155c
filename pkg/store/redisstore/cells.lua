-- cells.lua: compare and swap one cell (see shared.go).
--
-- KEYS[1]  the cell's hash: v = value, n = version, e = expiry (Unix ms)
-- ARGV[1]  now, Unix ms (the caller's clock, never Redis TIME)
-- ARGV[2]  the version the caller read, decimal ('0': absent or expired)
-- ARGV[3]  the new value
-- ARGV[4]  the new expiry, Unix ms (> now)
-- ARGV[5]  margin, ms: the hash outlives its expiry by this much, as
--          Redis expires keys by its own clock
--
-- Returns {1, new version} when the cell's current version is ARGV[2],
-- else {0, current version}. Versions are decimal strings. A cell past
-- its expiry is version 0, but a swap onto it numbers after its last
-- version, so a writer holding that version cannot find it current.
local now = tonumber(ARGV[1])
local exp = tonumber(ARGV[4])
local margin = tonumber(ARGV[5])
if now == nil or exp == nil or margin == nil or exp <= now then
  return redis.error_reply('cells.lua: bad arguments')
end
local h = redis.call('HGETALL', KEYS[1])
local f = {}
for i = 1, #h, 2 do
  f[h[i]] = h[i + 1]
end
local last = f['n'] or '0'
local cur = '0'
local e = tonumber(f['e'])
if e ~= nil and e > now then
  cur = last
end
if cur ~= ARGV[2] then
  return {0, cur}
end
local n = string.format('%d', (tonumber(last) or 0) + 1)
redis.call('HSET', KEYS[1], 'v', ARGV[3], 'n', n, 'e', ARGV[4])
redis.call('PEXPIRE', KEYS[1], exp - now + margin)
return {1, n}
