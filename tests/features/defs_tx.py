"""A definitions file as a user writes it; loaded by path in the CLI and subprocess tests."""

from redline.features import Entity, EventSource, FeatureView, agg_sum, count, distinct, mean

card = Entity("card", join_key="card_id")
transactions = EventSource(
    "transactions", card, {"card_id": str, "amount": float, "merchant": str},
    timestamp="ts", allowed_lateness="10m",
)
card_stats = FeatureView("card_stats", transactions, [
    count("1h"), agg_sum("amount", "1h"), mean("amount", "1h"), distinct("merchant", "1h"),
])
