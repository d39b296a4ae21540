-- The partial aggregates of a numeric tile: the Lua twin of aggregates.NumericTile
-- (upd = update, merge = merge, operation for operation, same evaluation order).
-- The helpers (Neumaier step, mean, the `last` tie rule, |x|) are written out inside upd and merge
-- rather than called: a Lua 5.1 call costs about as much as the arithmetic, and inlining halved
-- merge's time, most of a read's (benchmarks/features/read_lua_share.py). Same operations in the
-- same order, so tests/features/test_merge_property.py still holds them bit for bit.
local INF = math.huge
local function meanof(n, s, c, mu)
  local m = (s + c) / n
  if m == INF or m == -INF or m ~= m then return mu end
  return m
end
local function upd(n, s, c, mu, m2, mn, mx, lt, la, li, lv, x, ts, ar, id)
  local mean_old = 0.0
  if n > 0 then  -- meanof(n, s, c, mu)
    mean_old = (s + c) / n
    if mean_old == INF or mean_old == -INF or mean_old ~= mean_old then mean_old = mu end
  end
  local t = s + x  -- s, c = neu(s, c, x): Neumaier's compensated step
  if t ~= INF and t ~= -INF then
    local as, ax = s, x
    if as < 0 then as = -as end
    if ax < 0 then ax = -ax end
    if as >= ax then c = c + ((s - t) + x) else c = c + ((x - t) + s) end
  end
  s = t
  n = n + 1
  if n == 1 then mu = x else mu = mu + (x / n - mu / n) end
  local m = (s + c) / n  -- meanof(n, s, c, mu)
  if m == INF or m == -INF or m ~= m then m = mu end
  m2 = m2 + (x - mean_old) * (x - m)
  if x < mn then mn = x end
  if x > mx then mx = x end
  -- last: later event time, then later arrival, then greater stable id
  if ts > lt or (ts == lt and (ar > la or (ar == la and id > li))) then
    lt, la, li, lv = ts, ar, id, x
  end
  return n, s, c, mu, m2, mn, mx, lt, la, li, lv
end
local function merge(n, s, c, mu, m2, mn, mx, lt, la, li, lv,
                     n2, s2, c2, mu2, m22, mn2, mx2, lt2, la2, li2, lv2)
  if n2 == 0 then return n, s, c, mu, m2, mn, mx, lt, la, li, lv end
  if n == 0 then return n2, s2, c2, mu2, m22, mn2, mx2, lt2, la2, li2, lv2 end
  local nn = n + n2
  local ma = (s2 + c2) / n2  -- meanof(n2, s2, c2, mu2) - meanof(n, s, c, mu)
  if ma == INF or ma == -INF or ma ~= ma then ma = mu2 end
  local mb = (s + c) / n
  if mb == INF or mb == -INF or mb ~= mb then mb = mu end
  local delta = ma - mb
  m2 = m2 + m22 + delta * delta * n * n2 / nn
  mu = mu * (n / nn) + mu2 * (n2 / nn)
  local t = s + s2  -- s, c = neu(s, c, s2)
  if t ~= INF and t ~= -INF then
    local as, ax = s, s2
    if as < 0 then as = -as end
    if ax < 0 then ax = -ax end
    if as >= ax then c = c + ((s - t) + s2) else c = c + ((s2 - t) + s) end
  end
  s = t
  t = s + c2  -- s, c = neu(s, c, c2)
  if t ~= INF and t ~= -INF then
    local as, ax = s, c2
    if as < 0 then as = -as end
    if ax < 0 then ax = -ax end
    if as >= ax then c = c + ((s - t) + c2) else c = c + ((c2 - t) + s) end
  end
  s = t
  if mn2 < mn then mn = mn2 end
  if mx2 > mx then mx = mx2 end
  if lt2 > lt or (lt2 == lt and (la2 > la or (la2 == la and li2 > li))) then
    lt, la, li, lv = lt2, la2, li2, lv2
  end
  return nn, s, c, mu, m2, mn, mx, lt, la, li, lv
end
