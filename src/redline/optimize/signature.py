"""A model version's contract with its clients, and what changed between two versions.

Clients send inputs by name, dtype and shape, read outputs by name, and map class indices to
labels in a fixed order; a candidate that renames an input, drops an output or reverses the
labels breaks every client even when its accuracy is perfect. The gate compares these first.
"""

from __future__ import annotations

from typing import Any

from redline.models import ModelMetadata


def _tensors(specs: list[Any]) -> dict[str, tuple[str, list[int]]]:
    return {t.name: (t.datatype, list(t.shape)) for t in specs}


def signature_differences(baseline: ModelMetadata, candidate: ModelMetadata) -> list[str]:
    """Every difference in the client-visible contract, one readable line each."""
    diffs: list[str] = []
    b_in, c_in = _tensors(baseline.inputs), _tensors(candidate.inputs)
    if list(b_in) != list(c_in):
        diffs.append(f"input names {list(b_in)} -> {list(c_in)}")
    for name in b_in.keys() & c_in.keys():
        (b_type, b_shape), (c_type, c_shape) = b_in[name], c_in[name]
        if b_type != c_type:
            diffs.append(f"input '{name}' dtype {b_type} -> {c_type}")
        if b_shape != c_shape:
            diffs.append(f"input '{name}' shape {b_shape} -> {c_shape}")
    b_out, c_out = _tensors(baseline.outputs), _tensors(candidate.outputs)
    if list(b_out) != list(c_out):
        diffs.append(f"output names {list(b_out)} -> {list(c_out)}")
    for name in b_out.keys() & c_out.keys():
        if b_out[name][0] != c_out[name][0]:
            diffs.append(f"output '{name}' dtype {b_out[name][0]} -> {c_out[name][0]}")
    if baseline.task != candidate.task:
        diffs.append(f"task {baseline.task} -> {candidate.task}")
    if (baseline.class_labels or None) != (candidate.class_labels or None):
        diffs.append(f"class labels {baseline.class_labels} -> {candidate.class_labels}"
                     + (" (same labels, different order)" if baseline.class_labels
                        and candidate.class_labels and
                        sorted(map(str, baseline.class_labels))
                        == sorted(map(str, candidate.class_labels)) else ""))
    if baseline.feature_names and candidate.feature_names \
            and baseline.feature_names != candidate.feature_names:
        diffs.append(f"feature names/order {baseline.feature_names} -> "
                     f"{candidate.feature_names}")
    if baseline.missing_values != candidate.missing_values:
        diffs.append(f"missing values {baseline.missing_values} -> {candidate.missing_values} "
                     "(rows with NaN are answered by one and refused by the other)")
    return diffs
