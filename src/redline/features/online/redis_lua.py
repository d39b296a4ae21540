"""Lua run inside Redis: the atomic tile writer and the generated per-reader tile merger.

:data:`PARTIALS` is the Lua twin of ``aggregates.NumericTile`` (``upd`` = ``update``, ``merge`` =
``merge``, operation for operation, same evaluation order) and the only other implementation of
a merge; ``tests/features/test_merge_property.py`` holds the two together with hypothesis. The
Lua itself is in ``lua/`` (the partials, the writer, the HyperLogLog estimate); the read script is
generated here per reader.

Key schema 2: one hash per (entity, source) holds the tiles of every view of the source, so a
batch's write touches it once per entity for all views and a read gets them with one HVALS. A
field ``pack('<dI', group tag, slot)`` (12 bytes; group tag = ``events.view_tag`` + tile group)
holds one tile: ``pack('<dd', group tag, tile)`` followed by eleven doubles (n, sum,
compensation, running mean, m2, min, max, last ts, last arrival, last stable id, last value) or
256 HyperLogLog registers; fields ``@o:<topic>:<partition>`` hold Kafka positions (8 bytes),
fields ``@k:<stream>:<shard>`` Kinesis sequence numbers (129 decimal digits).
Reads send back one packed string of doubles per entity, so the reply stays small however many
tiles were merged (measured against a pipeline of HMGETs in ``benchmarks/features``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib import resources

from redline.features.definitions import FeatureView

NUMERIC_TILE_BYTES = 8 * 13  # group, tile, then the eleven doubles of a record


@cache
def lua_text(name: str) -> str:
    """The text of ``lua/<name>``: Lua lives in ``.lua`` files so an editor and a reviewer read it
    as Lua; the read script is generated per reader, so it stays Python around these pieces."""
    return (resources.files("redline.features.online") / "lua" / name).read_text(encoding="utf-8")


PARTIALS = lua_text("partials.lua")

WRITE_SCRIPT = PARTIALS + lua_text("write.lua")


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
    from redline.features.updates import view_tag

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
    hll = lua_text("hll.lua")
    return hll + "\n".join(lines)
