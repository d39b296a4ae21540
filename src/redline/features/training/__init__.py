"""Point-in-time training sets: the online replay computed over whole columns instead of event by
event, and the one per-partition kernel every engine (in memory, out of core, Spark) runs.

A memory store fed the events in arrival order and read at ``t`` answers, for an entity and a
window, the aggregate of the events that (a) the decoder admits, (b) are not a redelivery its
event-id window drops, (c) had arrived by ``t`` and (d) fall in the tiles covering ``t``. These
modules compute exactly that set with numpy — columns coerced by the decoder's own per-value
functions, the events of a view sorted by (entity, event time, arrival), one ``searchsorted`` per
label row for the window's tile range, the arrival condition as a filter — and aggregate each
row's events with the same rules as ``aggregates.NumericTile``. Sums, means and standard
deviations may differ from the store's in the last bits (they add the same numbers in another
order); every other output is bit-identical. ``tests/features/test_asof.py`` holds it to the
event-by-event replay.

Why the skipped tiles, ring slots and key expiry of the stores change nothing here: an update is
skipped or overwritten only when no read at or after its arrival covers its tile (``tiles.place``,
``tiles.ring_size``), and a key expires only after its TTL of silence, by which time a redelivery
of one of its events is dead-lettered as late anyway.

Modules, each importing only those above it::

    columns     events as columns, coerced by the decoder's rules; schema fields
    ids         entity and event ids as codes; the label rows' ids; integer sorts and lookups
    decoded     the admitted events of one source; which of them a view's key applies
    keyed       a view's events sorted by (entity, time) or found per entity; gathered per row
    last        ``last`` outputs: the last arrived event's value per row
    aggregates  count, sum, mean, stddev, min, max and distinct of each row's events
    replay      the reference: events one by one through the decoder and a memory store
    values      views' values at the label rows' times: by columns, else by the replay
    kernel      one partition of entities (events, label rows) to its training rows

This package imports no engine (``offline``, ``outofcore``, ``spark``): the engines import it
(``.importlinter`` holds that).
"""
