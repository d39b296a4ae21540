"""The measuring instrument: interleaved latency with equal sample counts, early stop, and the
layering rule that optimize never pulls in the serving stack."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from redline.optimize import ModelRunner, measure_latency


def test_one_session_alive_at_a_time_in_interleaved_passes(digits, digits_mlp, digits_forest,
                                                            onnx_of):
    import gc
    import weakref

    models = {"mlp": onnx_of(digits_mlp, digits.x_train),
              "forest": onnx_of(digits_forest, digits.x_train)}
    alive: set[int] = set()
    most_alive = 0
    built: list[str] = []
    calls = {name: 0 for name in models}

    def factory(name):
        def build():
            nonlocal most_alive
            gc.collect()  # a released session must really be gone before the next one exists
            runner = ModelRunner(models[name], task="classification",
                                 class_labels=list(range(10)))
            alive.add(id(runner))
            most_alive = max(most_alive, len(alive))
            weakref.finalize(runner, alive.discard, id(runner))
            built.append(name)
            inner = runner.run_feed

            def counted(feed):
                calls[name] += 1
                return inner(feed)

            runner.run_feed = counted  # type: ignore[method-assign]
            return runner
        return build

    result = measure_latency({n: factory(n) for n in models}, digits.x_val, [1, 8], rounds=60,
                             passes=3, warmup=5)
    assert most_alive == 1
    # a drawn order, mirrored in the next pass: every model runs first and last alike
    assert sorted(built[:2]) == ["forest", "mlp"] and built[2:4] == built[1::-1]
    assert len(built) == 6
    for name in models:
        assert set(result[name]) == {1, 8}
        warmed = 0
        for size, lat in result[name].items():
            assert lat.samples_us.size == 60 and lat.batch_size == size
            assert 0 < lat.p50_us <= lat.p99_us
            assert lat.warmup_calls is not None and len(lat.warmup_calls) == 3
            assert (lat.warmup_calls >= 5).all()  # at least the asked-for warm-up, every pass
            warmed += int(lat.warmup_calls.sum())
        assert calls[name] == 3 * 2 * 20 + warmed  # 3 passes x 2 batch sizes, and warm-ups
    # a forest of 60 trees costs more per row than a 64-unit MLP, in the same run
    assert result["forest"][8].per_row_us > result["mlp"][8].per_row_us

    stopped = measure_latency({n: factory(n) for n in models}, digits.x_val, [1],
                              rounds=100_000, passes=1000, warmup=1, max_seconds=0.05)
    counts = {stopped[name][1].samples_us.size for name in models}
    assert len(counts) == 1 and 2 * 100 <= counts.pop() < 100_000


def test_batches_use_real_rows(digits, digits_mlp, onnx_of):
    runner = ModelRunner(onnx_of(digits_mlp, digits.x_train), task="classification",
                         class_labels=list(range(10)))
    seen = []
    original = runner.run_feed

    def spy(feed):
        seen.append(next(iter(feed.values())))
        return original(feed)

    runner.run_feed = spy  # type: ignore[method-assign]
    measure_latency({"m": runner}, digits.x_val[:10], [4], rounds=3, passes=1, warmup=0)
    assert all(batch.shape == (4, 64) for batch in seen)
    rows = {tuple(r) for batch in seen for r in batch}
    assert rows <= {tuple(r) for r in digits.x_val[:10].astype(np.float32)}


@pytest.mark.slow
def test_optimize_package_does_not_import_serving():
    code = ("import sys, redline.optimize, redline.optimize.gate, redline.optimize.report; "
            "print(sorted(m for m in sys.modules if m.startswith('redline.serving')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert out == "[]"
