-- HyperLogLog estimate of 256 registers, prefixed to every generated read script.
local function hll(h)
  local z, zeros = 0.0, 0
  for i = 1, 256 do
    local r = h[i]
    z = z + 2 ^ (-r)
    if r == 0 then zeros = zeros + 1 end
  end
  local e = (0.7213 / (1.0 + 1.079 / 256)) * 256 * 256 / z
  if e <= 2.5 * 256 and zeros > 0 then return 256 * math.log(256 / zeros) end
  return e
end
