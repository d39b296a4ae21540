"""GET /dashboard in headless Chromium against a server under load: the charts show data."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.monitoring.served import probability, start, training_data, v2_body
from tests.serving.helpers import ServerThread

# Set to a path to keep the screenshot (docs/dashboard.png is made this way).
SCREENSHOT_ENV = "REDLINE_DASHBOARD_SCREENSHOT"


def browser():  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail("chromium / chromedriver missing: run `bash tools/services.d/41-chromium.sh`")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1300", "--hide-scrollbars"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


@pytest.fixture
def loaded(tmp_path: Path) -> Iterator[ServerThread]:
    """A server with steady traffic (bounded: stops with the test, 60 s at most)."""
    server = start(tmp_path / "repo")
    stop = threading.Event()

    def load() -> None:
        rng = np.random.default_rng(0)
        deadline = time.monotonic() + 60
        with httpx.Client(base_url=server.http) as http:
            i = 0
            while not stop.is_set() and time.monotonic() < deadline:
                x = training_data(rng, 1 + i % 4)
                if i % 50 > 40:
                    x[:, 1] += 30  # a burst of older customers: out of range, drifting
                http.post("/v2/models/fraud/infer", json=v2_body(x, f"d{i}"))
                if i % 5 == 0:
                    y = (rng.random(x.shape[0]) < probability(x)).astype(int)
                    http.post("/v1/labels", json={"labels": [
                        {"request_id": f"d{i}" if x.shape[0] == 1 else f"d{i}:{j}",
                         "label": int(y[j])} for j in range(x.shape[0])]})
                i += 1
                time.sleep(0.002)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    yield server
    stop.set()
    thread.join(10)
    server.stop()


def test_dashboard_charts_show_live_data(loaded: ServerThread, tmp_path: Path) -> None:
    with httpx.Client(base_url=loaded.http) as http:
        page = http.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert b"http://" not in page.content and b"https://" not in page.content  # no CDN
    driver = browser()
    try:
        driver.get(loaded.http + "/dashboard")
        want = {"throughput": 5, "latency": 5, "stages": 5, "batches": 1, "drift": 3}
        deadline = time.monotonic() + 30
        points: dict[str, int] = {}
        while time.monotonic() < deadline:
            points = {k: int(driver.execute_script(
                f"return +(document.getElementById('{k}').dataset.points || 0)")) for k in want}
            rows = {k: int(driver.execute_script(
                f"return +(document.getElementById('{k}').dataset.rows || 0)"))
                for k in ("stage-table", "versions", "quality")}
            if all(points[k] >= n for k, n in want.items()) and all(rows.values()):
                break
            time.sleep(0.5)
        assert all(points[k] >= n for k, n in want.items()), points
        assert all(rows.values()), rows
        # the canvas really has ink on it, not only a data attribute
        ink = driver.execute_script("""
            const c = document.getElementById('latency');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n;""")
        assert ink > 500
        stages_text = driver.find_element("id", "stage-table").text
        assert "inference" in stages_text and "total" in stages_text
        assert "fraud:1" in driver.find_element("id", "quality").text
        shot = os.environ.get(SCREENSHOT_ENV) or str(tmp_path / "dashboard.png")
        assert driver.save_screenshot(shot)
    finally:
        driver.quit()
