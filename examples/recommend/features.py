"""Feature definitions of the recommender example (``features.definitions`` in ``redline.yaml``).

Two event sources, because a view's entity is its source's: the shop's session events keyed by
item (how much attention an item gets right now) and the same events keyed by user (how active a
user is). What the session itself clicked comes from the session state, not from a view.
"""

from redline.features import Entity, EventSource, FeatureView, agg_sum, count

item = Entity("item", join_key="item_id")
user = Entity("user", join_key="user_id")

item_events = EventSource("item_events", item, {"cart": float}, timestamp="ts")
user_events = EventSource("user_events", user, {"cart": float}, timestamp="ts")

item_activity = FeatureView("item_activity", item_events, [
    count("1h"), count("24h"), count("7d"), agg_sum("cart", "24h"),
], description="How much attention an item gets: clicks and carts, recent and weekly")

user_activity = FeatureView("user_activity", user_events, [
    count("24h"), count("7d"), agg_sum("cart", "7d"),
], description="How active a user is")


def events_of(event: dict) -> list[dict]:
    """The feature events one session event makes (by item, by user)."""
    cart = 1.0 if event["type"] == "add_to_cart" else 0.0
    return [
        {"source": "item_events", "item_id": event["item_id"], "cart": cart, "ts": event["ts"]},
        {"source": "user_events", "user_id": event["user_id"], "cart": cart, "ts": event["ts"]},
    ]
