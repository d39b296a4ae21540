"""GET /dashboard in headless Chromium against a server under load: what the page shows.

Two models are served: ``fraud`` (3 features) and ``wide`` (47 features with long names, three
of them shifted far from training, validated at ROC AUC 1.00 but labelled at random). The page
must show the kept history at once, every series' stages, latency in milliseconds, the
drifting features by name with their thresholds, and quality coloured by each metric's
direction against its validation figure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from redline.models import ModelRepository
from tests.monitoring.served import (
    logistic_model,
    make_repository,
    monitored_settings,
    probability,
    training_data,
    v2_body,
)
from tests.serving.helpers import ServerThread

pytestmark = pytest.mark.slow  # servers, child processes or seconds of work: not in test-fast

# Set to a path to keep the screenshot (docs/dashboard.png is made this way).
SCREENSHOT_ENV = "REDLINE_DASHBOARD_SCREENSHOT"
WIDE = [f"{topic}_{i:02d}" for i, topic in enumerate(
    ["merchant_category_spend_share_last_30_days", "card_present_ratio_last_7_days",
     "customer_tenure_months_since_first_purchase", "distance_from_home_km_rolling_median"]
    * 12)][:47]
SHIFTED = [3, 18, 29]  # columns of ``wide`` far from training in every live row
HISTORY_TICKS = 300  # what the monitor keeps (monitoring/timeseries.py)


def browser():  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail("chromium / chromedriver missing: run `bash tools/services.d/41-chromium.sh`")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1500", "--hide-scrollbars"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


def wide_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.normal(0, 1, (n, len(WIDE))).astype(np.float32)


def repository(root: Path) -> ModelRepository:
    repo = make_repository(root)
    weights = np.random.default_rng(7).normal(0, 0.3, len(WIDE)).astype(np.float32)
    repo.add_onnx("wide", logistic_model(weights, 0.0), task="classification",
                  class_labels=[0, 1], feature_names=WIDE, metrics={"roc_auc": 1.0},
                  sample=wide_rows(np.random.default_rng(0), 5000))
    return repo


@pytest.fixture
def loaded(tmp_path: Path) -> Iterator[ServerThread]:
    """A server with steady traffic to both models (bounded: stops with the test, 90 s at
    most); a tick of 0.1 s, so its 300 kept points span 30 s."""
    server = ServerThread(monitored_settings(tick_s=0.1), repository(tmp_path / "repo")).start()
    stop = threading.Event()

    def load() -> None:
        rng = np.random.default_rng(0)
        deadline = time.monotonic() + 90
        with httpx.Client(base_url=server.http, headers={"x-redline-budget-ms": "5000"}) as http:
            i = 0
            while not stop.is_set() and time.monotonic() < deadline:
                x = training_data(rng, 1 + i % 4)
                http.post("/v2/models/fraud/infer", json=v2_body(x, f"d{i}"))
                w = wide_rows(rng, 2)
                w[:, SHIFTED] += 6.0
                http.post("/v2/models/wide/infer", json=v2_body(w, f"w{i}"))
                if i % 5 == 0:
                    y = (rng.random(x.shape[0]) < probability(x)).astype(int)
                    http.post("/v1/labels", json={"labels": [
                        {"request_id": f"d{i}" if x.shape[0] == 1 else f"d{i}:{j}",
                         "label": int(y[j])} for j in range(x.shape[0])] + [
                        {"request_id": f"w{i}:{j}", "label": int(rng.random() < 0.5)}
                        for j in range(2)]})
                i += 1
                time.sleep(0.01)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    yield server
    stop.set()
    thread.join(10)
    server.stop()


def _js(driver: Any, script: str) -> Any:
    return driver.execute_script(script)


def _data(driver: Any, element: str, key: str) -> Any:
    return _js(driver, f"return document.getElementById('{element}').dataset.{key}")


def test_dashboard_shows_what_the_server_measures(loaded: ServerThread, tmp_path: Path) -> None:
    with httpx.Client(base_url=loaded.http) as http:
        page = http.get("/dashboard")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert b"http://" not in page.content and b"https://" not in page.content  # no CDN
        # more points than one summary holds (60) before the page opens
        deadline = time.monotonic() + 60
        while len(http.get("/v1/monitoring/history").json()["history"]) < 90:
            assert time.monotonic() < deadline, "the monitor kept no history"
            time.sleep(0.5)
    driver = browser()
    try:
        driver.get(loaded.http + "/dashboard")
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            ready = _js(driver, """
                const d = (id, k) => +(document.getElementById(id).dataset[k] || 0);
                const verdicts = [...document.querySelectorAll('#quality [data-verdict]')];
                return d('latency', 'points') > 0 && d('drift', 'rows') >= 3 &&
                       d('stage-table', 'rows') > 0 && verdicts.length >= 6 &&
                       document.querySelectorAll('#drift .d-row.drift').length >= 3 &&
                       JSON.parse(document.getElementById('stages').dataset.series || '[]')
                           .filter(s => s.endsWith(' inference')).length >= 2;""")
            if ready:
                break
            time.sleep(0.5)
        assert ready, driver.find_element("id", "status").text

        # The whole kept history at once (not one summary's 60 points), and as much kept as
        # the server keeps.
        assert int(_js(driver, "return +document.body.dataset.history")) >= 90
        assert int(_js(driver, "return +document.body.dataset.keep")) == HISTORY_TICKS

        # p99 per stage: every series, not only the first.
        series = json.loads(_data(driver, "throughput", "series"))
        stages = json.loads(_data(driver, "stages", "series"))
        assert {"v2:fraud:1", "v2:wide:1"} <= set(series), series
        for s in series:
            assert f"{s} inference" in stages, (s, stages)
        legend = driver.find_element("id", "stages-legend").text
        assert "v2:fraud:1 inference" in legend and "v2:wide:1 inference" in legend

        # Latency in milliseconds: plain numbers on the axis, and the axis is the p99 in µs
        # divided by 1,000.
        for chart in ("latency", "stages"):
            assert _data(driver, chart, "unit") == "ms"
            ticks = json.loads(_data(driver, chart, "ticks"))
            assert all(re.fullmatch(r"[\d,]+(\.\d+)?", t) for t in ticks), ticks
        top_ms = float(_data(driver, "latency", "ymax"))
        p99_us = _js(driver, """return Math.max(...points.flatMap(p => Object.values(p.series)
            .map(s => s.stages.total ? s.stages.total.p99 : 0)));""")
        assert p99_us / 1000 <= top_ms < p99_us / 1000 * 3, (top_ms, p99_us)
        assert "ms" in driver.find_element("id", "stage-table").text

        # Drift: the few features that matter, by full name, drifting ones first, each with
        # its threshold drawn. (One read of the page: it redraws every second.)
        drift = _js(driver, """
            return [...document.querySelectorAll('#drift .d-row')].map(r => {
              const label = r.querySelector('.d-name');
              return {name: r.dataset.feature, ratio: +r.dataset.ratio,
                      drift: r.classList.contains('drift'), label: label.textContent,
                      fits: label.scrollWidth <= label.clientWidth + 1,
                      threshold: r.querySelectorAll('.threshold').length};
            });""")
        assert 3 <= len(drift) <= 12 < int(_data(driver, "drift", "total")), drift
        assert {r["name"] for r in drift[:3]} == {WIDE[i] for i in SHIFTED}, drift
        for row in drift:
            assert row["label"].endswith(row["name"]) and row["fits"], row  # whole, uncut
            assert row["threshold"] == 1, row
        assert all(r["drift"] for r in drift[:3])
        calm = [r["ratio"] for r in drift if not r["drift"]]
        assert calm == sorted(calm, reverse=True)
        assert "drifting" in driver.find_element("id", "drift-note").text

        # Quality: coloured by direction against the validation figure; a metric with no
        # validation figure is not green.
        verdict = _js(driver, """
            const out = {};
            for (const c of document.querySelectorAll('#quality [data-verdict]'))
              out[c.dataset.metric + '@' + c.closest('tr').cells[0].textContent.split(' ')[0]] =
                c.dataset.verdict;
            return out;""")
        assert verdict["roc_auc@wide:1"] == "bad", verdict  # random labels vs AUC 1.00
        assert verdict["accuracy@wide:1"] == "none" and verdict["log_loss@wide:1"] == "none"
        assert verdict["log_loss@fraud:1"] == "none", verdict

        # The canvas really has ink on it, not only data attributes.
        ink = _js(driver, """
            const c = document.getElementById('stages');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n;""")
        assert ink > 500
        shot = os.environ.get(SCREENSHOT_ENV) or str(tmp_path / "dashboard.png")
        assert driver.save_screenshot(shot)
    finally:
        driver.quit()
