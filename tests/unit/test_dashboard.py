"""The Grafana dashboard (docs/dashboard.json) and its picture's script (bench/dashboard.py) ask
only for metrics the gateway serves, and the script computes quantiles as Prometheus does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.dashboard import PANELS, quantile
from gateway.observability.metrics import GatewayMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "dashboard.json"
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def served() -> set[str]:
    """Every sample name a scrape of the gateway can hold."""
    names: set[str] = set()
    for family in GatewayMetrics().registry.collect():
        names.add(family.name)
        names.update(family.name + suffix for suffix in SUFFIXES)
    return names


def test_every_query_of_the_dashboard_names_a_served_metric() -> None:
    queries = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
    asked = {name for query in queries for name in re.findall(r"\bgateway_[a-z_]+", query)}
    assert asked, "the dashboard asks for no gateway metric"
    assert asked <= served()


def test_the_picture_draws_the_dashboard_s_panels_from_served_metrics() -> None:
    titles = {p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]}
    assert {panel.title for panel in PANELS} >= {t for t in titles if "Runs" not in t}
    source = Path(__file__).resolve().parents[2] / "bench" / "dashboard.py"
    drawn = set(re.findall(r'"(gateway_[a-z_]+)"', source.read_text()))
    assert drawn <= served()


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.5, 1.75),  # rank 5 of 10: 3 of the 4 counts of the (1, 2] bucket (counts 2..6)
        (0.2, 1.0),  # rank 2: the top of the first bucket
        (0.99, 3.95),  # rank 9.9: 3.9 of the 4 counts of (2, 4]
        (1.0, 4.0),  # everything in a finite bucket: its bound
    ],
)
def test_quantiles_interpolate_in_the_buckets(q: float, expected: float) -> None:
    buckets = [(1.0, 2.0), (2.0, 6.0), (4.0, 10.0), (float("inf"), 10.0)]
    assert quantile(q, buckets) == pytest.approx(expected)
    assert quantile(q, []) is None
