-- The atomic tile writer (prefixed with partials.lua when loaded): one batch of tile
-- updates, event-id dedup and source positions in one step.
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
if mode == 2 or mode == 5 then
  topic, positions = ARGV[2], ARGV[3]
  p = 4
end
-- mode 5: mode 2, and KEYS[1] is the source's position hash (partition -> highest offset
-- applied), ARGV[4] each partition's highest offset in this batch (packed doubles), raised here
-- in the same step as the tiles: a replica that holds these tiles holds this position, and no
-- later one (redis_failover.py).
if mode == 5 then
  nfixed = 1
  local tops = ARGV[4]
  p = 5
  for i = 1, #tops, 16 do
    local part, off = struct.unpack('<dd', tops, i)
    local f = string.format('%d', part)
    local cur = redis.call('HGET', KEYS[1], f)
    if not cur or tonumber(cur) < off then
      redis.call('HSET', KEYS[1], f, string.format('%d', off))
    end
  end
end
-- mode 4 (a sharded log such as Kinesis, whose positions are decimal numbers of up to 129 digits,
-- far beyond a double's 2^53): ARGV[2] the stream, ARGV[3] each event's shard (an index into
-- ARGV[5], the comma-separated shard ids), comma-separated by tag, and ARGV[4] each event's
-- sequence number as 129 decimal digits (zero-padded), by tag. As in mode 2 each key keeps, per
-- shard, the highest sequence number applied to it (field '@k:<stream>:<shard>': those 129
-- digits, exact; a length no tile has) and skips an update whose number is not above it.
local SEQ = 129
local sharded, sshard, seqs = false, {}, nil
if mode == 4 then
  topic, sharded, seqs = ARGV[2], true, ARGV[4]
  local ids = {}
  for s in string.gmatch(ARGV[5], '[^,]+') do ids[#ids + 1] = s end
  for i in string.gmatch(ARGV[3], '%d+') do sshard[#sshard + 1] = ids[tonumber(i) + 1] end
  p = 6
end
-- a <= b for two sequence numbers of SEQ digits, compared 15 digits at a time (exact in a
-- double, and free of the string collation Redis sets from its locale)
local function seq_le(a, b)
  if a == b then return true end
  for i = 1, SEQ, 15 do
    local x, y = tonumber(string.sub(a, i, i + 14)), tonumber(string.sub(b, i, i + 14))
    if x ~= y then return x < y end
  end
  return true
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
    elseif sharded then
      local part = sshard[unpack_('<I', ops, q + 31) + 1]
      if pmark[part] == nil then
        names[#names + 1] = '@k:' .. topic .. ':' .. part
        pmark[part] = #names
      end
    end
  end
  local st = chunked('HMGET', key, names)
  local dirty = {}
  local w, mark = {}, {}  -- mode 2: per partition, the stored and the new highest offset
  for part, mi in pairs(pmark) do
    if sharded then
      w[part] = st[mi]  -- false: nothing of this shard applied to the key yet
    else
      w[part] = -1
      if st[mi] then w[part] = unpack_('<d', st[mi]) end
    end
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
    elseif sharded then
      local part, off = sshard[tag + 1], ssub(seqs, tag * SEQ + 1, tag * SEQ + SEQ)
      if w[part] and seq_le(off, w[part]) then
        apply = false
      elseif mark[part] == nil or not seq_le(off, mark[part]) then
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
    if sharded then
      set[#set + 1] = '@k:' .. topic .. ':' .. part
      set[#set + 1] = off
    else
      set[#set + 1] = '@o:' .. topic .. ':' .. part
      set[#set + 1] = pack('<d', off)
    end
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
