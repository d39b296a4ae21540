"""Feature definitions the pipeline tests serve: one card entity, one view, one transform."""

from redline.features.definitions import (
    Entity,
    EventSource,
    FeatureView,
    agg_sum,
    count,
    mean,
    request_transform,
)

card = Entity("card", join_key="card_id")
transactions = EventSource("transactions", card, {"amount": float}, timestamp="ts")
card_txn = FeatureView(
    "card_txn",
    transactions,
    [count("1h"), agg_sum("amount", "1h"), mean("amount", "1h", default=0.0)],
)


@request_transform(request=["amount"], features=["card_txn:amount_mean_1h"], default=1.0)
def amount_ratio(amount, card_mean):
    """The request's amount against the card's recent mean."""
    return amount / (card_mean + 1.0)
