"""Feature definitions of the fraud example (``features.definitions`` in ``redline.yaml``).

Three event sources, because a view's entity is its source's: the card network's transactions
keyed by card and (the same transactions) by merchant, and the delayed fraud labels by merchant.
"""

from redline.features import (
    Entity,
    EventSource,
    FeatureView,
    agg_max,
    agg_sum,
    count,
    last,
    mean,
    request_transform,
)

card = Entity("card", join_key="card_id")
merchant = Entity("merchant", join_key="merchant_id")

card_txns = EventSource("card_txns", card, {"amount": float, "ts_s": float}, timestamp="ts")
merchant_txns = EventSource("merchant_txns", merchant, {"amount": float}, timestamp="ts")
merchant_labels = EventSource("merchant_labels", merchant, {"is_fraud": float}, timestamp="ts",
                              allowed_lateness="10m")

card_activity = FeatureView("card_activity", card_txns, [
    count("1m"), count("1h"), count("24h"),
    agg_sum("amount", "1m"), agg_sum("amount", "1h"), agg_sum("amount", "24h"),
    agg_max("amount", "24h"),
    mean("amount", "7d"),
    last("ts_s", "7d"),
], description="How much and how fast a card spends")

merchant_activity = FeatureView("merchant_activity", merchant_txns, [
    count("1h"), count("7d"),
], description="How busy a merchant is")

merchant_risk = FeatureView("merchant_risk", merchant_labels, [
    mean("is_fraud", "7d", name="fraud_rate_7d"), count("7d", name="labels_7d"),
], description="Share of a merchant's labelled transactions that were fraud (labels arrive late)")


@request_transform(request=["amount"], features=["card_activity:amount_mean_7d"], default=1.0)
def amount_vs_card_mean(amount, card_mean):
    """This amount against what the card usually spends (1.0 for a card with no history)."""
    return amount / card_mean


@request_transform(request=["ts_s"], features=["card_activity:ts_s_last_7d"], default=604800.0)
def seconds_since_last(ts_s, last_ts_s):
    """Seconds since the card's previous transaction (a week when there was none)."""
    return ts_s - last_ts_s


MODEL_FEATURES = [
    "card_activity:count_1m", "card_activity:count_1h", "card_activity:count_1d",
    "card_activity:amount_sum_1m", "card_activity:amount_sum_1h", "card_activity:amount_sum_1d",
    "card_activity:amount_max_1d",
    "merchant_activity:count_1h", "merchant_activity:count_7d",
    "merchant_risk:fraud_rate_7d", "merchant_risk:labels_7d",
    "amount_vs_card_mean", "seconds_since_last", "amount", "hour",
]


def events_of(txn: dict) -> list[dict]:
    """The feature events one transaction makes (by card, by merchant)."""
    return [
        {"source": "card_txns", "card_id": txn["card_id"], "amount": txn["amount"],
         "ts_s": txn["ts"] / 1000.0, "ts": txn["ts"]},
        {"source": "merchant_txns", "merchant_id": txn["merchant_id"], "amount": txn["amount"],
         "ts": txn["ts"]},
    ]


def label_event(label: dict) -> dict:
    return {"source": "merchant_labels", "merchant_id": label["merchant_id"],
            "is_fraud": label["is_fraud"], "ts": label["ts"]}


def request_of(txn: dict) -> dict:
    """The ``/v1`` predict body for a transaction, as the payment switch would send it."""
    return {"entities": {"card_id": txn["card_id"], "merchant_id": txn["merchant_id"]},
            "request": {"amount": txn["amount"], "ts_s": txn["ts"] / 1000.0,
                        "hour": hour_of(txn["ts"])},
            "request_id": txn.get("txn_id")}


def hour_of(ts_ms: int) -> int:
    return int(ts_ms // 3_600_000 % 24)
