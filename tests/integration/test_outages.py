"""Failover on time for every outage shape the local namespace can make (SPEC B3, B8, R1), real SDK, real TCP.

Each test runs a sender loop (50-message batches, back to back) against the primary, breaks the primary in one
way, waits for the first diverted message, heals it, waits for the first message accepted by the primary
again, and compares message ids as sets. Intervals are real (failover 2 s, ping 1 s); the bounds here are
generous (interval + 3 s) - the exact lags come from ``bench/bench_failover.py``. The SDK settings are the
defaults (send_timeout 30 s, 3 SDK retries): the failover time must not depend on them.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.outages import SHAPES, Timeline, prepare, run_outage

pytestmark = pytest.mark.slow

INTERVAL = 2.0
PING = 1.0


def check(timeline: Timeline) -> None:
    assert timeline.errors == [], timeline.errors  # no send call failed: everything went somewhere
    assert timeline.failover_lag is not None, "never failed over"
    assert timeline.failover_lag <= 3.0, f"failed over {timeline.failover_lag:.2f} s after the interval"
    assert timeline.recovery_lag is not None, "never came back to the primary"
    assert timeline.recovery_lag <= PING + 3.0, f"came back {timeline.recovery_lag:.2f} s after the heal"
    assert timeline.diverted > 0
    assert timeline.produced > 0 and timeline.lost == 0
    assert timeline.primary_duplicates == 0  # duplicate detection on the primary


@pytest.mark.parametrize("shape", list(SHAPES))
def test_outage_shape_fails_over_on_time_and_loses_nothing(namespace_pair: Any, shape: str) -> None:
    prepare(namespace_pair)
    check(run_outage(namespace_pair, SHAPES[shape], interval=INTERVAL, ping=PING))


@pytest.mark.parametrize(
    "shape", ["refused", "entity-disabled", "dropped", "stall-after-sasl", "entity-stall"]
)
def test_interval_zero_fails_over_on_the_first_failure(namespace_pair: Any, shape: str) -> None:
    prepare(namespace_pair)
    timeline = run_outage(namespace_pair, SHAPES[shape], interval=0.0, ping=PING)
    check(timeline)
    assert timeline.failover_lag is not None and timeline.failover_lag <= 1.0
