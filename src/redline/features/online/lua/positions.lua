-- Raise per partition the recorded highest offset (KEYS[1]: the position hash; ARGV[1]: packed
-- doubles (partition, offset)); the same steps as write.lua's mode 5.
for i = 1, #ARGV[1], 16 do
  local part, off = struct.unpack('<dd', ARGV[1], i)
  local f = string.format('%d', part)
  local cur = redis.call('HGET', KEYS[1], f)
  if not cur or tonumber(cur) < off then
    redis.call('HSET', KEYS[1], f, string.format('%d', off))
  end
end
return 1
