"""The picture of the Grafana dashboard (docs/dashboard.json) in docs/operations.md, drawn from
a real gateway's metrics.

    .venv/bin/python -m bench.dashboard [--seconds 90] [--svg docs/dashboard.svg]

It starts a gateway (SQLite, offline demo model, GATEWAY_METRICS on), drives a review desk
against it (users start refund runs that pause for an approval and story runs that stream, a
reviewer decides each approval after a varied wait, now and then a rejection), scrapes
`GET /metrics` every `--every` seconds, and evaluates each panel's query over the scrapes the
way Prometheus would (`rate` over a window, `histogram_quantile` by linear interpolation in the
buckets). The SVG shows those series; one JSON line (the `bench` report shape) gives the
figures of the last window. Nothing is made up: every point is computed from a scrape.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.common import (
    BenchClient,
    emit,
    fresh_database,
    gateway_process,
    issue_token,
    report_line,
)

ROOT = Path(__file__).resolve().parents[1]
REFUND = "refund order 42 for 30 dollars"
STORY = "tell me a story"
# A Prometheus-like window for rates and quantiles, in scrapes.
WINDOW_SCRAPES = 5

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Scrape:
    at: float
    samples: Samples

    def value(self, name: str, **labels: str) -> float:
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """Summed over every series of `name` whose labels include `labels`."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= set(ls))

    def buckets(self, name: str) -> list[tuple[float, float]]:
        """(upper bound, cumulative count) of histogram `name`, summed over its series."""
        bounds: dict[float, float] = {}
        for (n, ls), v in self.samples.items():
            if n == f"{name}_bucket":
                le = float(dict(ls)["le"])
                bounds[le] = bounds.get(le, 0.0) + v
        return sorted(bounds.items())


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """`histogram_quantile(q, ...)` over cumulative (le, count) buckets, as Prometheus does."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def window_buckets(now: Scrape, then: Scrape, name: str) -> list[tuple[float, float]]:
    before = dict(then.buckets(name))
    return [(le, count - before.get(le, 0.0)) for le, count in now.buckets(name)]


@dataclass
class Panel:
    title: str
    unit: str
    series: dict[str, Callable[[Scrape, Scrape], float | None]]


def rate(name: str, **labels: str) -> Callable[[Scrape, Scrape], float | None]:
    def of(now: Scrape, then: Scrape) -> float | None:
        return (now.total(name, **labels) - then.total(name, **labels)) / (now.at - then.at)

    return of


def quantile_of(
    q: float, name: str, scale: float = 1.0
) -> Callable[[Scrape, Scrape], float | None]:
    def of(now: Scrape, then: Scrape) -> float | None:
        value = quantile(q, window_buckets(now, then, name))
        return None if value is None else value * scale

    return of


def gauge(name: str) -> Callable[[Scrape, Scrape], float | None]:
    return lambda now, then: now.total(name)


# The panels of docs/dashboard.json, with the same queries evaluated here.
PANELS = [
    Panel("Approvals waiting", "", {"pending": gauge("gateway_approvals_pending")}),
    Panel(
        "Review wait",
        "s",
        {
            "p50": quantile_of(0.5, "gateway_approval_wait_seconds"),
            "p99": quantile_of(0.99, "gateway_approval_wait_seconds"),
        },
    ),
    Panel(
        "Delivery lag p99 (commit to socket)",
        "ms",
        {"p99": quantile_of(0.99, "gateway_delivery_lag_seconds", 1000.0)},
    ),
    Panel(
        "Runs by state (per second)",
        "/s",
        {
            state: rate("gateway_runs_total", state=state)
            for state in ("started", "paused", "resumed", "completed")
        },
    ),
    Panel(
        "Storage commit latency",
        "ms",
        {
            "p50": quantile_of(0.5, "gateway_storage_commit_seconds", 1000.0),
            "p99": quantile_of(0.99, "gateway_storage_commit_seconds", 1000.0),
        },
    ),
    Panel(
        "Storage errors and bus outages",
        "/s",
        {
            "storage errors": rate("gateway_storage_errors_total"),
            "bus outages": rate("gateway_bus_outages_total"),
        },
    ),
]


async def review_desk(url: str, stop: float, seed: int) -> None:
    """Users ask for refunds and stories; a reviewer decides each approval after a while."""
    rng = random.Random(seed)
    users = [await BenchClient.connect(url, issue_token(f"user{i}", ["user"])) for i in range(3)]
    reviewer = await BenchClient.connect(url, issue_token("rita", ["reviewer"]))
    await reviewer.request("inbox.subscribe")
    decided: set[str] = set()
    reviews: set[asyncio.Task[None]] = set()

    async def decide_loop() -> None:
        seen = 0
        while time.monotonic() < stop:
            await reviewer.wait_for(lambda f: f.get("type") in ("inbox", "inbox.update"), seen)
            frames = reviewer.frames[seen:]
            seen += len(frames)
            for _, frame in frames:
                for approval in frame.get("approvals") or frame.get("added") or []:
                    if approval["approval_id"] not in decided:
                        decided.add(approval["approval_id"])
                        review = asyncio.create_task(decide_later(approval["approval_id"]))
                        reviews.add(review)
                        review.add_done_callback(reviews.discard)

    async def decide_later(approval_id: str) -> None:
        # Reviews take from a moment to several seconds, like people at a desk.
        await asyncio.sleep(rng.choice((0.3, 0.8, 1.5, 3.0, 6.0)) * rng.uniform(0.7, 1.3))
        decision = "reject" if rng.random() < 0.2 else "approve"
        with contextlib.suppress(Exception):
            await reviewer.request(
                "approval.decide", approval_id=approval_id, decision=decision, reason="checked"
            )

    async def user_loop(client: BenchClient) -> None:
        while time.monotonic() < stop:
            await client.request("run.start", input=REFUND if rng.random() < 0.6 else STORY)
            # Busier in the middle of the window: the waiting approvals rise and fall.
            phase = (time.monotonic() % 40) / 40
            await asyncio.sleep(rng.uniform(0.5, 1.5) * (2.0 - phase * 1.5))

    deciding = asyncio.create_task(decide_loop())
    try:
        await asyncio.gather(*(user_loop(u) for u in users))
    finally:
        deciding.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await deciding
        for client in (*users, reviewer):
            await client.close()


async def scrape_loop(base: str, every: float, stop: float) -> list[Scrape]:
    scrapes: list[Scrape] = []
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        while time.monotonic() < stop:
            response = await http.get("/metrics")
            response.raise_for_status()
            scrapes.append(Scrape(time.monotonic(), parse(response.text)))
            await asyncio.sleep(every)
    return scrapes


def series(panel: Panel, scrapes: list[Scrape]) -> dict[str, list[tuple[float, float]]]:
    start = scrapes[0].at
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in panel.series}
    for i in range(WINDOW_SCRAPES, len(scrapes)):
        now, then = scrapes[i], scrapes[i - WINDOW_SCRAPES]
        for name, query in panel.series.items():
            value = query(now, then)
            if value is not None:
                out[name].append((now.at - start, value))
    return out


COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd")
PANEL_W, PANEL_H, PAD = 460, 220, 44


def svg(panels: list[tuple[Panel, dict[str, list[tuple[float, float]]]]], caption: str) -> str:
    columns = 2
    rows = (len(panels) + columns - 1) // columns
    width, height = columns * (PANEL_W + 20) + 20, rows * (PANEL_H + 20) + 50
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="#111217"/>',
        f'<text x="20" y="{height - 18}" fill="#9fa7b3">{escape(caption)}</text>',
    ]
    for index, (panel, data) in enumerate(panels):
        x0 = 20 + (index % columns) * (PANEL_W + 20)
        y0 = 20 + (index // columns) * (PANEL_H + 20)
        parts.append(
            f'<rect x="{x0}" y="{y0}" width="{PANEL_W}" height="{PANEL_H}" fill="#181b1f" '
            'stroke="#2c3235"/>'
        )
        parts.append(
            f'<text x="{x0 + 10}" y="{y0 + 18}" fill="#d8d9da" font-size="13">'
            f"{escape(panel.title)}</text>"
        )
        points = [p for line in data.values() for p in line]
        if not points:
            continue
        t_max = max(t for t, _ in points) or 1.0
        v_max = max(v for _, v in points) or 1.0
        left, top = x0 + PAD, y0 + 30
        plot_w, plot_h = PANEL_W - PAD - 14, PANEL_H - 60
        for tick in range(5):
            value = v_max * tick / 4
            y = top + plot_h - plot_h * tick / 4
            parts.append(
                f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
                'stroke="#2c3235"/>'
            )
            parts.append(
                f'<text x="{left - 6}" y="{y + 4:.1f}" fill="#9fa7b3" text-anchor="end">'
                f"{value:.3g}{escape(panel.unit)}</text>"
            )
        parts.append(
            f'<text x="{left + plot_w}" y="{top + plot_h + 16}" fill="#9fa7b3" '
            f'text-anchor="end">{t_max:.0f} s</text>'
        )
        for n, (name, line) in enumerate(data.items()):
            colour = COLOURS[n % len(COLOURS)]
            path = " ".join(
                f"{left + plot_w * t / t_max:.1f},{top + plot_h - plot_h * v / v_max:.1f}"
                for t, v in line
            )
            parts.append(
                f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.6"/>'
            )
            parts.append(
                f'<text x="{left + 8 + n * 80}" y="{top + plot_h + 16}" fill="{colour}">'
                f"{escape(name)}</text>"
            )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


async def measure(seconds: float, every: float, seed: int) -> list[Scrape]:
    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        async with fresh_database("sqlite", workdir) as database:
            env = {"GATEWAY_METRICS": "true"}
            with gateway_process(workdir, database=database, demo_delay_ms=8, env=env) as gw:
                base = f"http://127.0.0.1:{gw.port}"
                stop = time.monotonic() + seconds
                scrapes, _ = await asyncio.gather(
                    scrape_loop(base, every, stop + 2 * every),
                    review_desk(gw.ws_url, stop, seed),
                )
    return scrapes


def main(seconds: float, every: float, out_svg: Path, seed: int) -> None:
    scrapes = asyncio.run(measure(seconds, every, seed))
    drawn = [(panel, series(panel, scrapes)) for panel in PANELS]
    caption = (
        f"{len(scrapes)} scrapes of a real gateway every {every:g} s, {seconds:g} s of a review "
        f"desk (python -m bench.dashboard); windows of {WINDOW_SCRAPES} scrapes"
    )
    out_svg.write_text(svg(drawn, caption))
    last = {
        f"{panel.title}: {name}": round(line[-1][1], 4) if line else None
        for panel, data in drawn
        for name, line in data.items()
    }
    emit(report_line("dashboard", "sqlite", {"scrapes": len(scrapes), "last_window": last}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--svg", type=Path, default=ROOT / "docs" / "dashboard.svg")
    args = parser.parse_args()
    main(args.seconds, args.every, args.svg, args.seed)
