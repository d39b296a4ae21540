"""Lua run inside Redis: the atomic tile writer and the generated per-reader tile merger.

:data:`PARTIALS` is the Lua twin of ``aggregates.NumericTile`` (``upd`` = ``update``, ``merge`` =
``merge``, operation for operation, same evaluation order) and the only other implementation of
a merge; ``tests/features/test_merge_property.py`` holds the two together with hypothesis. A hash
field ``pack('<HH', group, slot)`` (4 bytes) holds one tile: ``pack('<dd', group, tile)`` followed
by eleven doubles (n, sum, compensation, running mean, m2, min, max, last ts, last arrival, last
stable id, last value) or 256 HyperLogLog registers.
Reads send back one packed string of doubles per entity, so the reply stays small however many
tiles were merged (measured against a pipeline of HMGETs in ``benchmarks/features``).
"""

from __future__ import annotations

from redline.features.definitions import FeatureView

NUMERIC_TILE_BYTES = 8 * 13  # group, tile, then the eleven doubles of a record

PARTIALS = r"""
local INF = math.huge
local abs = math.abs
local function neu(s, c, x)
  local t = s + x
  if t == INF or t == -INF then return t, c end
  if abs(s) >= abs(x) then c = c + ((s - t) + x) else c = c + ((x - t) + s) end
  return t, c
end
local function meanof(n, s, c, mu)
  local m = (s + c) / n
  if m == INF or m == -INF or m ~= m then return mu end
  return m
end
local function wins(ts, ar, id, lt, la, li)
  return ts > lt or (ts == lt and (ar > la or (ar == la and id > li)))
end
local function upd(n, s, c, mu, m2, mn, mx, lt, la, li, lv, x, ts, ar, id)
  local mean_old = 0.0
  if n > 0 then mean_old = meanof(n, s, c, mu) end
  s, c = neu(s, c, x)
  n = n + 1
  if n == 1 then mu = x else mu = mu + (x / n - mu / n) end
  m2 = m2 + (x - mean_old) * (x - meanof(n, s, c, mu))
  if x < mn then mn = x end
  if x > mx then mx = x end
  if wins(ts, ar, id, lt, la, li) then lt, la, li, lv = ts, ar, id, x end
  return n, s, c, mu, m2, mn, mx, lt, la, li, lv
end
local function merge(n, s, c, mu, m2, mn, mx, lt, la, li, lv,
                     n2, s2, c2, mu2, m22, mn2, mx2, lt2, la2, li2, lv2)
  if n2 == 0 then return n, s, c, mu, m2, mn, mx, lt, la, li, lv end
  if n == 0 then return n2, s2, c2, mu2, m22, mn2, mx2, lt2, la2, li2, lv2 end
  local nn = n + n2
  local delta = meanof(n2, s2, c2, mu2) - meanof(n, s, c, mu)
  m2 = m2 + m22 + delta * delta * n * n2 / nn
  mu = mu * (n / nn) + mu2 * (n2 / nn)
  s, c = neu(s, c, s2)
  s, c = neu(s, c, c2)
  if mn2 < mn then mn = mn2 end
  if mx2 > mx then mx = mx2 end
  if wins(lt2, la2, li2, lt, la, li) then lt, la, li, lv = lt2, la2, li2, lv2 end
  return nn, s, c, mu, m2, mn, mx, lt, la, li, lv
end
"""

WRITE_SCRIPT = PARTIALS + r"""
local mode = tonumber(ARGV[1])
local p = 2
local nfixed = 0
local ok = nil
local acked = 0
-- mode 2 (a partitioned log such as Kafka): ARGV[2] the topic, ARGV[3] each event's (partition,
-- offset) as packed doubles, indexed by tag. Each key keeps, per partition, the highest offset
-- applied to it (a hash field beside its tiles, so on a cluster it lives on the same shard and
-- changes in the same script): an op whose offset is not above it was applied before (a replay
-- after a crash or a rebalance) and is skipped.
local topic, positions = nil, nil
if mode == 2 then
  topic, positions = ARGV[2], ARGV[3]
  p = 4
end
-- mode 3 (Redis Streams on a cluster, where the stream and the tiles live on different shards):
-- ARGV[2] a window in ms, ARGV[3] each event's stream entry id (ms, seq) as packed doubles by tag.
-- Each key remembers the entry ids applied to it (the sorted set of event ids, scored by entry
-- ms) for the window: an entry delivered again (its consumer died before XACK, or a claimed entry
-- from a consumer that woke up) is skipped.
local swin, entries = nil, nil
if mode == 3 then
  swin, entries = tonumber(ARGV[2]), ARGV[3]
  p = 4
end
local sdecided, snewest = {}, {}
if mode == 1 then
  nfixed = 3
  local group, consumer = ARGV[2], ARGV[3]
  local ntags = tonumber(ARGV[4])
  p = 5
  ok = {}
  local ids = {}
  -- ARGV[5], ARGV[6]: the batch's first and last id (entries come in id order); one XPENDING
  -- lists what is still pending for this consumer in that range.
  local pend = redis.call('XPENDING', KEYS[1], group, ARGV[5], ARGV[6], ntags + 1000, consumer)
  p = 7
  local mine = {}
  for _, e in ipairs(pend) do mine[e[1]] = true end
  for i = 0, ntags - 1 do
    local id = ARGV[p]
    p = p + 1
    if mine[id] then
      ok[i] = id
      ids[#ids + 1] = id
    end
  end
  for i = 1, #ids, 500 do
    redis.call('XACK', KEYS[1], group, unpack(ids, i, math.min(i + 499, #ids)))
  end
  acked = #ids
end
-- ARGV tail: accepted tags (packed doubles), dead letters (count, then tag, class, reason, raw
-- each), TTL per key (packed doubles), dedup window per key (packed doubles), tile updates (sorted
-- by key), runs ((key, count) packed doubles per key), events (see below). Packed numbers
-- cost one C call to read instead of a tonumber per argument (measured: 2x the write rate).
local pack, unpack_ = struct.pack, struct.unpack
local accblob = ARGV[p]; p = p + 1
local accepted = 0
for i = 1, #accblob, 8 do
  local tag = unpack_('<d', accblob, i)
  if ok == nil or ok[tag] then accepted = accepted + 1 end
end
local ndead = tonumber(ARGV[p]); p = p + 1
local dead = 0
for i = 1, ndead do
  local tag, class, reason, raw = tonumber(ARGV[p]), ARGV[p + 1], ARGV[p + 2], ARGV[p + 3]
  p = p + 4
  if ok == nil or ok[tag] then
    dead = dead + 1
    if mode == 1 then
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', 100000, '*', 'reason', reason, 'event', raw,
                 'id', ok[tag])
      redis.call('HINCRBY', KEYS[3], 'dead:' .. class, 1)
    end
  end
end
if mode == 1 then
  if accepted > 0 then redis.call('HINCRBY', KEYS[3], 'accepted', accepted) end
  if dead > 0 then redis.call('HINCRBY', KEYS[3], 'dead', dead) end
end
local ttlblob = ARGV[p]; p = p + 1
local nkeys = #ttlblob / 8
local ttl = {}
for i = 1, nkeys do ttl[i] = unpack_('<d', ttlblob, (i - 1) * 8 + 1) end
-- per key: the event-id window in ms (0: no deduplication); the key's ids are a sorted set
-- KEYS[nfixed + 2 * nkeys + k] (member: the packed id, score: its arrival)
local ddblob = ARGV[p]; p = p + 1
local dd = {}
for i = 1, nkeys do dd[i] = unpack_('<d', ddblob, (i - 1) * 8 + 1) end
local decided, newest = {}, {}
-- Tile updates ('<HIddhBI', 29 bytes: group, slot, tile, value, register, rank, tag) come sorted
-- by key, stably (each key's updates keep the events' order, so every tile sees the same sequence
-- of updates as before the sort); ``runs`` says how many belong to each key; ``evs`` holds each
-- event's (time, arrival, stable id) by tag. Per key: one HMGET of the tiles (and, mode 2, the
-- offset marks) it touches, the updates applied to those values in Lua, one HSET of what changed,
-- one DEL of its cached read, and a PEXPIRE only when a tile was started: a tile's life ends
-- at most ring * tile_ms + lateness (the TTL) after its first event arrived, so refreshing the
-- TTL when each tile starts keeps every tile as long as a read can need it.
local ops, runs, evs = ARGV[p], ARGV[p + 1], ARGV[p + 2]
local OP = 29
local function chunked(cmd, key, list)
  local out = {}
  for i = 1, #list, 4000 do
    local part = redis.call(cmd, key, unpack(list, i, math.min(i + 3999, #list)))
    if cmd == 'HMGET' then for _, v in ipairs(part) do out[#out + 1] = v end end
  end
  return out
end
local pos = 1
for r = 1, #runs, 16 do
  local k, cnt = unpack_('<dd', runs, r)
  k = k + 1
  local key = KEYS[nfixed + k]
  local stop = pos + cnt * OP - 1
  -- pass 1: the fields these updates read: their tiles and (mode 2) their partitions' marks
  local names, at, opf, pmark = {}, {}, {}, {}
  for q = pos, stop, OP do
    local gid, slot, _i, _x, _r, _rk, tag = unpack_('<HIddhBI', ops, q)
    local f = pack('<HH', gid, slot)  -- field name: group and ring slot, 4 bytes
    local fi = at[f]
    if fi == nil then
      fi = #names + 1
      names[fi], at[f] = f, fi
    end
    opf[#opf + 1] = fi
    if positions then
      local part = unpack_('<d', positions, tag * 16 + 1)
      if pmark[part] == nil then
        names[#names + 1] = '@o:' .. topic .. ':' .. part
        pmark[part] = #names
      end
    end
  end
  local st = chunked('HMGET', key, names)
  local dirty = {}
  local w, mark = {}, {}  -- mode 2: per partition, the stored and the new highest offset
  for part, mi in pairs(pmark) do
    w[part] = -1
    if st[mi] then w[part] = unpack_('<d', st[mi]) end
  end
  local started = false
  local o = 0
  for q = pos, stop, OP do
    o = o + 1
    local gid, _slot, idx, x, reg, rank, tag = unpack_('<HIddhBI', ops, q)
    local ts, ar, id = unpack_('<ddd', evs, tag * 24 + 1)
    local apply = ok == nil or ok[tag]
    if positions then
      local part, off = unpack_('<dd', positions, tag * 16 + 1)
      if off <= w[part] then
        apply = false
      elseif mark[part] == nil or mark[part] < off then
        mark[part] = off
      end
    end
    if apply and entries then
      local dk = k .. ':' .. tag
      local fresh = sdecided[dk]
      if fresh == nil then
        local ms, seq = unpack_('<dd', entries, tag * 16 + 1)
        local member = pack('<dd', ms, seq)
        local idkey = KEYS[nfixed + 2 * nkeys + k]
        fresh = not redis.call('ZSCORE', idkey, member)
        if fresh then
          redis.call('ZADD', idkey, ms, member)
          if snewest[k] == nil or snewest[k] < ms then snewest[k] = ms end
        end
        sdecided[dk] = fresh
      end
      apply = fresh
    end
    if apply and dd[k] > 0 then  -- the first op of an event at a key decides for all its ops
      local dk = k .. ':' .. tag
      local fresh = decided[dk]
      if fresh == nil then
        local member = pack('<d', id)
        local idkey = KEYS[nfixed + 2 * nkeys + k]
        local seen = redis.call('ZSCORE', idkey, member)
        -- a duplicate: the same id arrived at most the window earlier
        fresh = (not seen) or (ar - tonumber(seen) > dd[k])
        if fresh then
          redis.call('ZADD', idkey, ar, member)
          if newest[k] == nil or newest[k] < ar then newest[k] = ar end
        end
        decided[dk] = fresh
      end
      apply = fresh
    end
    if apply then
      local fi = opf[o]
      local cur = st[fi]
      local cidx = nil
      local n, s, c, mu, m2, mn, mx, lt, la, li, lv =
        0, 0.0, 0.0, 0.0, 0.0, INF, -INF, -INF, -INF, -INF, 0/0
      if cur then
        if reg >= 0 then
          local _g
          _g, cidx = unpack_('<dd', cur)
        else
          local _g, i, n2, s2, c2, mu2, m22, mn2, mx2, lt2, la2, li2, lv2 =
            unpack_('<ddddddddddddd', cur)
          cidx = i
          if cidx == idx then
            n, s, c, mu, m2, mn, mx, lt, la, li, lv =
              n2, s2, c2, mu2, m22, mn2, mx2, lt2, la2, li2, lv2
          end
        end
      end
      if cidx == nil or cidx <= idx then
        if cidx ~= idx then started = true end
        if reg >= 0 then
          local regs
          if cidx == idx then regs = string.sub(cur, 17) else regs = string.rep('\0', 256) end
          if rank > string.byte(regs, reg + 1) then
            regs = string.sub(regs, 1, reg) .. string.char(rank) .. string.sub(regs, reg + 2)
            st[fi], dirty[fi] = pack('<dd', gid, idx) .. regs, true
          elseif cidx ~= idx then
            st[fi], dirty[fi] = pack('<dd', gid, idx) .. regs, true
          end
        else
          n, s, c, mu, m2, mn, mx, lt, la, li, lv =
            upd(n, s, c, mu, m2, mn, mx, lt, la, li, lv, x, ts, ar, id)
          st[fi] = pack('<ddddddddddddd', gid, idx, n, s, c, mu, m2, mn, mx, lt, la, li, lv)
          dirty[fi] = true
        end
      end
      -- else: the slot holds a newer tile; this one has left every window
    end
  end
  local set = {}
  for fi, _ in pairs(dirty) do
    set[#set + 1] = names[fi]
    set[#set + 1] = st[fi]
  end
  for part, off in pairs(mark) do
    set[#set + 1] = '@o:' .. topic .. ':' .. part
    set[#set + 1] = pack('<d', off)
  end
  if #set > 0 then chunked('HSET', key, set) end
  if next(dirty) ~= nil then
    if started then redis.call('PEXPIRE', key, ttl[k]) end
    redis.call('DEL', KEYS[nfixed + nkeys + k])  -- the key's cached read result is stale now
  end
  pos = stop + 1
end
for k, top in pairs(snewest) do
  local idkey = KEYS[nfixed + 2 * nkeys + k]
  redis.call('ZREMRANGEBYSCORE', idkey, '-inf', '(' .. string.format('%.17g', top - swin))
  if redis.call('PTTL', idkey) < swin then redis.call('PEXPIRE', idkey, math.max(ttl[k], swin)) end
end
for k, top in pairs(newest) do  -- forget ids older than the window
  local idkey = KEYS[nfixed + 2 * nkeys + k]
  redis.call('ZREMRANGEBYSCORE', idkey, '-inf', '(' .. string.format('%.17g', top - dd[k]))
  redis.call('PEXPIRE', idkey, ttl[k])
end
return {acked, accepted, dead}
"""


_FIELDS = ("n", "s", "c", "mu", "m2", "mn", "mx", "lt", "la", "li", "lv")


def _acc(w: int) -> str:
    return ", ".join(f"{v}{w}" for v in _FIELDS)


def read_script(views: list[FeatureView], cache: bool = True) -> str:
    """Lua that merges, for each entity, every view's covering tiles and returns packed doubles.

    KEYS per entity: the views' tile hashes, then their result-cache keys. ARGV: one signature per
    view (its windows' current tiles), then each window's covering tile range (lo, hi) — all
    computed in Python by ``tiles.py``. Each entity's reply is ``pack(any_data, outputs...,
    newest...)``: after every view's outputs, one newest event time per view (epoch ms, NaN when
    none): the greatest ``last`` event time of the numeric tiles the read merged, for the feature
    age at read (distinct-only views have none).

    The result cache holds a view's outputs and newest time for one signature; writes delete it,
    and a new tile changes the signature, so a hit returns exactly what merging the tiles would.
    """
    nv = len(views)
    lines = [PARTIALS, "local unpack_, pack = struct.unpack, struct.pack",
             f"local nv = {nv}", "local A = {}",
             "for i = 1, #ARGV do A[i] = tonumber(ARGV[i]) end",
             "local replies = {}",
             f"for base = 0, #KEYS - 1, {2 * nv} do",
             "  local out = {0}",
             "  local NW = {}"]
    argi = nv + 1
    for j, view in enumerate(views):
        lay = view.layout()
        nout = len(lay.outputs)
        fmt = "<" + "d" * (nout + 1)
        lines.append("  do")
        lines.append("    local hit = false")
        lines.append("    local newest = -INF")
        if cache:
            lines.append(f"    local sig = ARGV[{j + 1}]")
            lines.append(f"    local m = redis.call('GET', KEYS[base + {nv + j + 1}])")
            lines.append("    if m and string.sub(m, 1, #sig) == sig then")
            lines.append(f"      local t = {{unpack_('{fmt}', m, #sig + 1)}}")
            lines.append(f"      for i = 1, {nout} do out[#out + 1] = t[i] end")
            lines.append(f"      newest = t[{nout + 1}]")
            lines.append("      out[1] = 1")
            lines.append("      hit = true")
            lines.append("    end")
        lines.append("    if not hit then")
        lines.append("    local start = #out + 1")
        lines.append(f"    local vals = redis.call('HVALS', KEYS[base + {j + 1}])")
        lines.append("    if #vals > 0 then out[1] = 1 end")
        for w in lay.windows:
            g = lay.groups[w.gid]
            lines.append(f"    local lo{w.wid}, hi{w.wid} = A[{argi}], A[{argi + 1}]")
            argi += 2
            if g.hll:
                lines.append(f"    local h{w.wid} = {{}}")
                lines.append(f"    for i = 1, 256 do h{w.wid}[i] = 0 end")
            else:
                lines.append(f"    local {_acc(w.wid)} = "
                             "0, 0.0, 0.0, 0.0, 0.0, INF, -INF, -INF, -INF, -INF, 0/0")
        lines.append("    for _, v in ipairs(vals) do")
        # numeric tiles are 104 bytes: group, tile and the record, one unpack (measured: reading
        # group and tile first to skip uncovered records cost more than it saved)
        lines.append("      local len = #v")
        lines.append(f"      if len == {NUMERIC_TILE_BYTES} then")
        lines.append("        local gid, idx, n, s, c, mu, m2, mn, mx, lt, la, li, lv = "
                     "unpack_('<ddddddddddddd', v)")
        first = True
        for g in lay.groups:
            wins = [w for w in lay.windows if w.gid == g.gid]
            if not wins or g.hll:
                continue
            lines.append(f"        {'if' if first else 'elseif'} gid == {g.gid} then")
            first = False
            cover = " or ".join(f"(idx >= lo{w.wid} and idx <= hi{w.wid})" for w in wins)
            lines.append(f"          if {cover} then")
            lines.append("            if n > 0 and lt > newest then newest = lt end")
            for w in wins:
                lines.append(f"            if idx >= lo{w.wid} and idx <= hi{w.wid} then")
                lines.append(f"              {_acc(w.wid)} = merge({_acc(w.wid)}, "
                             "n, s, c, mu, m2, mn, mx, lt, la, li, lv)")
                lines.append("            end")
            lines.append("          end")
        if not first:
            lines.append("        end")
        lines.append("      elseif len == 272 then  -- HyperLogLog tiles (other fields: offsets)")
        lines.append("        local gid, idx = unpack_('<dd', v)")
        for g in lay.groups:
            wins = [w for w in lay.windows if w.gid == g.gid]
            if not wins or not g.hll:
                continue
            lines.append(f"        if gid == {g.gid} then")
            lines.append("          local b = {string.byte(v, 17, 272)}")
            for w in wins:
                lines.append(f"          if idx >= lo{w.wid} and idx <= hi{w.wid} then")
                lines.append(f"            local h = h{w.wid}")
                lines.append("            for i = 1, 256 do")
                lines.append("              if b[i] > h[i] then h[i] = b[i] end")
                lines.append("            end")
                lines.append("          end")
            lines.append("        end")
        lines.append("      end")
        lines.append("    end")
        for o in lay.outputs:
            d = repr(o.default) if o.default == o.default else "0/0"
            d = {"inf": "INF", "-inf": "-INF"}.get(d, d)
            wi = o.wid
            if o.kind == "count":
                expr = f"n{wi}"
            elif o.kind == "sum":
                expr = f"((n{wi} > 0) and (s{wi} + c{wi}) or 0.0)"
            elif o.kind == "distinct":
                expr = f"hll(h{wi})"
            else:
                val = {
                    "mean": f"meanof(n{wi}, s{wi}, c{wi}, mu{wi})",
                    "min": f"mn{wi}", "max": f"mx{wi}", "last": f"lv{wi}",
                    "stddev": f"math.sqrt(math.max(m2{wi}, 0.0) / n{wi})",
                }[o.kind]
                expr = f"pick(n{wi}, {d}, {val})"
            lines.append(f"    out[#out + 1] = {expr}")
        lines.append("    if newest == -INF then newest = 0/0 end")
        if cache:
            lines.append("    if #vals > 0 then")
            lines.append("      out[#out + 1] = newest  -- cached after the outputs, then dropped")
            lines.append(f"      redis.call('SET', KEYS[base + {nv + j + 1}], sig .. "
                         f"pack('{fmt}', unpack(out, start, #out)), 'PX', {lay.ttl_ms})")
            lines.append("      out[#out] = nil")
            lines.append("    end")
        lines.append("    end")
        lines.append(f"    NW[{j + 1}] = newest")
        lines.append("  end")
    lines.append(f"  for j = 1, {nv} do out[#out + 1] = NW[j] end")
    lines.append("  replies[#replies + 1] = pack('<' .. string.rep('d', #out), unpack(out))")
    lines.append("end")
    lines.append("return replies")
    hll = r"""
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
"""
    pick = "local function pick(n, d, v) if n == 0 then return d end return v end\n"
    return hll + pick + "\n".join(lines)
