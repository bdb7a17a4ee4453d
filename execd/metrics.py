"""A tiny Prometheus text exporter (counters, gauges, one histogram family).

prometheus_client would cost ~0.1 s of imports on the cold-start path for the handful of series execd keeps.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable

LabelKey = tuple[tuple[str, str], ...]
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _labels(key: LabelKey, extra: tuple[tuple[str, str], ...] = ()) -> str:
    items = key + extra
    if not items:
        return ""
    esc = lambda v: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")  # noqa: E731
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in items) + "}"


class Metrics:
    def __init__(self) -> None:
        self._help: dict[str, tuple[str, str]] = {}
        self._values: dict[str, dict[LabelKey, float]] = defaultdict(lambda: defaultdict(float))
        self._hist: dict[str, dict[LabelKey, list[float]]] = defaultdict(dict)
        self._gauges: dict[str, Callable[[], float]] = {}

    def describe(self, name: str, kind: str, help_text: str) -> None:
        self._help[name] = (kind, help_text)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        self._values[name][tuple(sorted(labels.items()))] += amount

    def gauge_fn(self, name: str, help_text: str, fn: Callable[[], float]) -> None:
        self.describe(name, "gauge", help_text)
        self._gauges[name] = fn

    def observe(self, name: str, value: float, **labels: str) -> None:
        series = self._hist[name].setdefault(tuple(sorted(labels.items())), [0.0] * (len(BUCKETS) + 2))
        series[bisect.bisect_left(BUCKETS, value)] += 1  # index len(BUCKETS) is +Inf only
        series[-1] += value

    def render(self) -> str:
        lines: list[str] = []
        for name, (kind, help_text) in sorted(self._help.items()):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            if name in self._gauges:
                lines.append(f"{name} {float(self._gauges[name]())}")
            elif kind == "histogram":
                for key, series in sorted(self._hist.get(name, {}).items()):
                    running = 0.0
                    for bound, count in zip((*BUCKETS, float("inf")), series[:-1], strict=True):
                        running += count
                        le = "+Inf" if bound == float("inf") else repr(bound)
                        lines.append(f"{name}_bucket{_labels(key, (('le', le),))} {running}")
                    lines.append(f"{name}_count{_labels(key)} {running}")
                    lines.append(f"{name}_sum{_labels(key)} {series[-1]}")
            else:
                for key, value in sorted(self._values.get(name, {}).items()):
                    lines.append(f"{name}{_labels(key)} {value}")
        return "\n".join(lines) + "\n"


def new_metrics() -> Metrics:
    m = Metrics()
    m.describe("execd_http_requests_total", "counter", "HTTP requests by route template, method and status.")
    m.describe("execd_http_request_duration_seconds", "histogram", "HTTP request duration by route template.")
    m.describe("execd_commands_total", "counter", "Commands started, by mode (run, stream, background).")
    m.describe("execd_command_kills_total", "counter", "Process groups killed, by reason.")
    m.describe("execd_bytes_total", "counter", "File bytes transferred, by direction (upload, download).")
    m.describe("execd_pty_sessions_total", "counter", "PTY sessions started.")
    m.describe("execd_proxy_requests_total", "counter", "Proxied requests, by kind (http, websocket).")
    return m
