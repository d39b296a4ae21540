"""Lua run inside Redis: the atomic tile writer and the generated per-reader tile merger.

:data:`PARTIALS` is the Lua twin of ``aggregates.NumericTile`` (``upd`` = ``update``, ``merge`` =
``merge``, operation for operation, same evaluation order) and the only other implementation of
a merge; ``tests/features/test_merge_property.py`` holds the two together with hypothesis.

Key schema 2: one hash per (entity, source) holds the tiles of every view of the source, so a
batch's write touches it once per entity for all views and a read gets them with one HVALS. A
field ``pack('<dI', group tag, slot)`` (12 bytes; group tag = ``events.view_tag`` + tile group)
holds one tile: ``pack('<dd', group tag, tile)`` followed by eleven doubles (n, sum,
compensation, running mean, m2, min, max, last ts, last arrival, last stable id, last value) or
256 HyperLogLog registers; fields ``@o:<topic>:<partition>`` hold Kafka positions (8 bytes).
Reads send back one packed string of doubles per entity, so the reply stays small however many
tiles were merged (measured against a pipeline of HMGETs in ``benchmarks/features``).
"""

from __future__ import annotations

from collections.abc import Sequence

from redline.features.definitions import FeatureView

NUMERIC_TILE_BYTES = 8 * 13  # group, tile, then the eleven doubles of a record

# The helpers (Neumaier step, mean, the ``last`` tie rule, |x|) are written out inside ``upd``
# and ``merge`` rather than called: a Lua 5.1 call costs about as much as the arithmetic, and
# inlining made ``merge`` about 2x faster (measured: 350 -> ~150 ns), which is most of a read's
# time. Same operations in the same order, so the property test still holds them bit for bit.
PARTIALS = r"""
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
local pack, unpack_, ssub = struct.pack, struct.unpack, string.sub
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
-- Tile updates ('<dIddhBI', 35 bytes: group tag, slot, tile, value, register, rank, tag) come
-- sorted by key (one hash per entity and source: key schema 2), stably (each key's updates keep
-- the events' order, so every tile sees the same sequence of updates as before the sort);
-- ``runs`` says how many belong to each key; ``evs`` holds each event's (time, arrival, stable
-- id) by tag. Per key — all views of the source at once: one HMGET of the tiles (and, mode 2,
-- the offset marks) it touches, the updates applied to those values in Lua, one HSET of what
-- changed, one DEL of its cached reads, and a PEXPIRE only when a tile was started: a tile's
-- life ends at most ring * tile_ms + lateness (the TTL) after its first event arrived, so
-- refreshing the TTL when each tile starts keeps every tile as long as a read can need it.
local ops, runs, evs = ARGV[p], ARGV[p + 1], ARGV[p + 2]
local OP = 35
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
    -- field name: group tag and ring slot, pack('<dI', gid, slot) — the record's first 12 bytes
    local f = ssub(ops, q, q + 11)
    local fi = at[f]
    if fi == nil then
      fi = #names + 1
      names[fi], at[f] = f, fi
    end
    opf[#opf + 1] = fi
    if positions then
      local tag = unpack_('<I', ops, q + 31)
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
    local gid, _slot, idx, x, reg, rank, tag = unpack_('<dIddhBI', ops, q)
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
    -- the hash holds every view of its source, and processes running other view versions may
    -- write it too: a TTL is only ever extended, never shortened
    if started and redis.call('PTTL', key) < ttl[k] then redis.call('PEXPIRE', key, ttl[k]) end
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
# Lua 5.1 allows 200 locals in a function: a pass over an entity's records keeps at most this
# many windows' accumulators in locals (13 each); a source with more views takes more passes
_WINDOWS_PER_PASS = 10


def _acc(w: int | str) -> str:
    return ", ".join(f"{v}{w}" for v in _FIELDS)


def source_groups(views: Sequence[FeatureView]) -> list[list[int]]:
    """Indices of ``views`` per Redis hash (key schema 2: one per entity and source), in order of
    first appearance: a read sends one key per group and entity."""
    at: dict[tuple[str, str], int] = {}
    groups: list[list[int]] = []
    for j, v in enumerate(views):
        key = (v.entity.name, v.source.name)
        if key not in at:
            at[key] = len(groups)
            groups.append([])
        groups[at[key]].append(j)
    return groups


def _passes(views: Sequence[FeatureView], group: list[int]) -> list[list[int]]:
    out: list[list[int]] = [[]]
    used = 0
    for j in group:
        nw = len(views[j].layout().windows)
        if out[-1] and used + nw > _WINDOWS_PER_PASS:
            out.append([])
            used = 0
        out[-1].append(j)
        used += nw
    return out


def _num(x: float) -> str:
    d = repr(x) if x == x else "0/0"
    return {"inf": "INF", "-inf": "-INF"}.get(d, d)


def _neumaier_add(total: str, comp: str, x: str) -> str:
    """Lua adding ``x`` to the compensated sum ``total`` + ``comp`` (Neumaier), in place: the
    same steps as ``neu`` in :data:`PARTIALS`; an infinite partial sum keeps no compensation."""
    return f"""    local q = {total} + {x}
    if q ~= INF and q ~= -INF then
      local as, ax = {total}, {x}
      if as < 0 then as = -as end
      if ax < 0 then ax = -ax end
      if as >= ax then {comp} = {comp} + (({total} - q) + {x})
      else {comp} = {comp} + (({x} - q) + {total}) end
    end
    {total} = q"""


def _merge_into(w: str, pad: str) -> list[str]:
    """Lua that merges the record in locals ``n, s, c, mu, m2, mn, mx, lt, la, li, lv`` into the
    accumulators of window ``w``: :data:`PARTIALS`' ``merge`` written out in place — the same
    operations in the same order (so bit for bit the same, and ``aggregates.NumericTile.merge``'s
    twin), without the call: a Lua 5.1 call with 22 arguments and 11 results cost about as much
    as the arithmetic (a read merges ~65 records an entity)."""
    N, S, C, MU, M2, MN, MX, LT, LA, LI, LV = (f"{v}{w}" for v in _FIELDS)
    body = f"""
if n > 0 then
  if {N} == 0 then
    {_acc(w)} = n, s, c, mu, m2, mn, mx, lt, la, li, lv
  else
    local nn = {N} + n
    local ma = (s + c) / n
    if ma == INF or ma == -INF or ma ~= ma then ma = mu end
    local mb = ({S} + {C}) / {N}
    if mb == INF or mb == -INF or mb ~= mb then mb = {MU} end
    local delta = ma - mb
    {M2} = {M2} + m2 + delta * delta * {N} * n / nn
    {MU} = {MU} * ({N} / nn) + mu * (n / nn)
{_neumaier_add(S, C, "s")}
{_neumaier_add(S, C, "c")}
    if mn < {MN} then {MN} = mn end
    if mx > {MX} then {MX} = mx end
    if lt > {LT} or (lt == {LT} and (la > {LA} or (la == {LA} and li > {LI}))) then
      {LT}, {LA}, {LI}, {LV} = lt, la, li, lv
    end
    {N} = nn
  end
end"""
    return [pad + line for line in body.strip("\n").splitlines()]


def read_script(views: list[FeatureView], cache: bool = True) -> str:
    """Lua that merges, for each entity, every view's covering tiles and returns packed doubles.

    KEYS per entity: one hash per (entity, source) of the views (:func:`source_groups`), then —
    with ``cache`` — each hash's result cache. ARGV: with ``cache``, one signature per view (its
    windows' current tiles); then every window's covering tile range (lo, hi) as packed doubles
    in one argument — all computed in Python by ``tiles.py``. The reply is one string: per entity
    ``pack(any_data, outputs..., newest...)``: after every view's outputs, one newest event time
    per view (epoch ms, NaN when none): the greatest ``last`` event time of the numeric tiles the
    read merged, for the feature age at read (distinct-only views have none).

    One HVALS per hash returns every view's tiles; each record names its view version and tile
    group in its first double (``events.view_tag`` + group), so a table lookup sends it to its
    view's accumulators, and records of other view versions are skipped. The merge is written
    out in place (:func:`_merge_into`) and per-view state lives in locals, not tables: per record
    the script pays one unpack, one table lookup, the range test and the merge. The result
    cache (a hash beside the tiles: field = view version) holds a view's outputs and newest time
    for one signature; writes delete it, and a new tile changes the signature, so a hit returns
    exactly what merging the tiles would.
    """
    from redline.features.events import view_tag

    nv = len(views)
    groups = source_groups(views)
    per_row = len(groups) * (2 if cache else 1)
    width = sum(len(v.layout().outputs) for v in views)
    offsets = [0]
    for v in views:
        offsets.append(offsets[-1] + len(v.layout().outputs))
    # one code per (view, tile group) read: the record's first double -> code
    codes: dict[tuple[int, int], int] = {}
    tg = []
    for j, v in enumerate(views):
        for g in v.layout().groups:
            if any(w.gid == g.gid for w in v.layout().windows):
                codes[(j, g.gid)] = len(codes) + 1
                tg.append(f"[{view_tag(v) + g.gid}] = {codes[(j, g.gid)]}")
    # window (view j, wid) -> ARGV position of its lo
    argpos: dict[tuple[int, int], int] = {}
    argi = 1
    for j, v in enumerate(views):
        for w in v.layout().windows:
            argpos[(j, w.wid)] = argi
            argi += 2
    row = 1 + width + nv  # any data, outputs, newest event time per view
    lines = [PARTIALS, "local unpack_, pack = struct.unpack, struct.pack",
             # every window's (lo, hi) as packed doubles: one argument, one C call to read
             f"local A = {{unpack_('<{'d' * (argi - 1)}', ARGV[{nv + 1 if cache else 1}])}}",
             "local TG = {" + ", ".join(tg) + "}",
             "local replies = {}",
             f"for base = 0, #KEYS - 1, {per_row} do",
             "  local any = 0",
             # sized by its constructor: filling an empty table grows it seven times
             "  local O = {" + ", ".join(["0"] * row) + "}"]
    if cache:
        lines.append("  local H = {}")
    for j in range(nv):
        lines.append(f"  O[{width + j + 2}] = 0/0")
    for s, group in enumerate(groups):
        lines.append("  do")
        lines.append(f"    local need = {'false' if cache else 'true'}")
        if cache:
            names = ", ".join(f"'{views[j].version}'" for j in group)
            lines.append(f"    local m = redis.call('HMGET', KEYS[base + {len(groups) + s + 1}], "
                         f"{names})")
            for q, j in enumerate(group):
                nout = len(views[j].layout().outputs)
                fmt = "<" + "d" * (nout + 1)
                lines.append(f"    do local sig, c = ARGV[{j + 1}], m[{q + 1}]")
                lines.append("    if c and string.sub(c, 1, #sig) == sig then")
                lines.append(f"      local t = {{unpack_('{fmt}', c, #sig + 1)}}")
                for i in range(nout):
                    lines.append(f"      O[{offsets[j] + i + 2}] = t[{i + 1}]")
                lines.append(f"      O[{width + j + 2}] = t[{nout + 1}]")
                lines.append(f"      H[{j + 1}] = true")
                lines.append("      any = 1")
                lines.append("    else")
                lines.append("      need = true")
                lines.append("    end end")
        lines.append("    if need then")
        lines.append(f"    local vals = redis.call('HVALS', KEYS[base + {s + 1}])")
        if cache:
            lines.append("    local C = {}")
        for chunk in _passes(views, group):
            lines.append("    do")
            for j in chunk:
                lay = views[j].layout()
                lines.append(f"    local d{j} = false")
                for w in lay.windows:
                    wn = f"{j}_{w.wid}"
                    a = argpos[(j, w.wid)]
                    lines.append(f"    local lo{wn}, hi{wn} = A[{a}], A[{a + 1}]")
                    if lay.groups[w.gid].hll:
                        lines.append(f"    local h{wn} = {{}}")
                        lines.append(f"    for i = 1, 256 do h{wn}[i] = 0 end")
                    else:
                        lines.append(f"    local {_acc(wn)} = "
                                     "0, 0.0, 0.0, 0.0, 0.0, INF, -INF, -INF, -INF, -INF, 0/0")
            lines.append("    for r = 1, #vals do")
            lines.append("      local v = vals[r]")
            # numeric tiles are 104 bytes: group tag, tile and the record, one unpack (measured:
            # reading group and tile first to skip uncovered records cost more than it saved)
            lines.append("      local len = #v")
            lines.append(f"      if len == {NUMERIC_TILE_BYTES} then")
            lines.append("        local gid, idx, n, s, c, mu, m2, mn, mx, lt, la, li, lv = "
                         "unpack_('<ddddddddddddd', v)")
            lines.append("        local t = TG[gid]")
            first = True
            for j in chunk:
                lay = views[j].layout()
                for g in lay.groups:
                    wins = [w for w in lay.windows if w.gid == g.gid]
                    if not wins or g.hll:
                        continue
                    skip = f" and not H[{j + 1}]" if cache else ""
                    lines.append(f"        {'if' if first else 'elseif'} t == {codes[(j, g.gid)]}"
                                 f"{skip} then")
                    first = False
                    lines.append(f"          d{j} = true")
                    for w in wins:
                        wn = f"{j}_{w.wid}"
                        lines.append(f"          if idx >= lo{wn} and idx <= hi{wn} then")
                        lines += _merge_into(wn, "            ")
                        lines.append("          end")
            if not first:
                lines.append("        end")
            lines.append("      elseif len == 272 then  -- HyperLogLog tiles (8 bytes: offsets)")
            lines.append("        local gid, idx = unpack_('<dd', v)")
            lines.append("        local t = TG[gid]")
            first = True
            for j in chunk:
                lay = views[j].layout()
                for g in lay.groups:
                    wins = [w for w in lay.windows if w.gid == g.gid]
                    if not wins or not g.hll:
                        continue
                    skip = f" and not H[{j + 1}]" if cache else ""
                    lines.append(f"        {'if' if first else 'elseif'} t == {codes[(j, g.gid)]}"
                                 f"{skip} then")
                    first = False
                    lines.append(f"          d{j} = true")
                    lines.append("          local b = {string.byte(v, 17, 272)}")
                    for w in wins:
                        wn = f"{j}_{w.wid}"
                        lines.append(f"          if idx >= lo{wn} and idx <= hi{wn} then")
                        lines.append(f"            local h = h{wn}")
                        lines.append("            for i = 1, 256 do")
                        lines.append("              if b[i] > h[i] then h[i] = b[i] end")
                        lines.append("            end")
                        lines.append("          end")
            if not first:
                lines.append("        end")
            lines.append("      end")
            lines.append("    end")
            for j in chunk:
                lay = views[j].layout()
                if cache:
                    lines.append(f"    if not H[{j + 1}] then")
                else:
                    lines.append("    do")
                for i, o in enumerate(lay.outputs):
                    wi = f"{j}_{o.wid}"
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
                        # n == 0: the default (a number, so never taken for false)
                        expr = f"(n{wi} == 0 and {_num(o.default)} or {val})"
                    lines.append(f"      O[{offsets[j] + i + 2}] = {expr}")
                # the newest event time of the tiles merged: every merged window's ``last``
                # time is the greatest of its tiles', and the windows together cover them all
                numeric = [w for w in lay.windows if not lay.groups[w.gid].hll]
                lines.append("      local nw = -INF")
                for w in numeric:
                    wn = f"{j}_{w.wid}"
                    lines.append(f"      if n{wn} > 0 and lt{wn} > nw then nw = lt{wn} end")
                lines.append(f"      if nw ~= -INF then O[{width + j + 2}] = nw end")
                lines.append(f"      if d{j} then")
                lines.append("        any = 1")
                if cache:
                    nout = len(lay.outputs)
                    vals = ", ".join([*(f"O[{offsets[j] + i + 2}]" for i in range(nout)),
                                      f"O[{width + j + 2}]"])
                    lines.append(f"        C[#C + 1] = '{views[j].version}'")
                    fmt = "d" * (nout + 1)
                    lines.append(f"        C[#C + 1] = ARGV[{j + 1}] .. pack('<{fmt}', {vals})")
                lines.append("      end")
                lines.append("    end")
            lines.append("    end")
        if cache:
            ttl = max(views[j].layout().ttl_ms for j in group)
            lines.append("    if #C > 0 then")
            lines.append(f"      local ck = KEYS[base + {len(groups) + s + 1}]")
            lines.append("      redis.call('HSET', ck, unpack(C))")
            lines.append(f"      redis.call('PEXPIRE', ck, {ttl})")
            lines.append("    end")
        lines.append("    end")
        lines.append("  end")
    lines.append("  O[1] = any")
    lines.append(f"  replies[#replies + 1] = pack('<{'d' * row}', unpack(O, 1, {row}))")
    lines.append("end")
    lines.append("return table.concat(replies)")
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
    return hll + "\n".join(lines)
