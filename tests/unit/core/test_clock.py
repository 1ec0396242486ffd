from __future__ import annotations

import pickle
from datetime import timedelta, timezone

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.core.clock import Clock, SystemClock


def test_fake_clock_moves_only_when_told() -> None:
    clock = FakeClock()
    m0, w0 = clock.monotonic(), clock.now()
    assert clock.monotonic() == m0 and clock.now() == w0
    clock.advance(2.5)
    assert clock.monotonic() == m0 + 2.5
    assert clock.now() - w0 == timedelta(seconds=2.5)
    assert clock.now().tzinfo is timezone.utc


def test_fake_sleep_records_and_advances() -> None:
    clock = FakeClock()
    m0 = clock.monotonic()
    clock.sleep(1.0)
    clock.sleep(0)
    assert clock.sleeps == [1.0, 0]
    assert clock.monotonic() == m0 + 1.0


def test_fake_clock_refuses_to_go_backwards() -> None:
    with pytest.raises(ValueError):
        FakeClock().advance(-1)


def test_clocks_are_picklable_and_satisfy_protocol() -> None:
    fake = FakeClock()
    fake.advance(3)
    copy = pickle.loads(pickle.dumps(fake))
    assert copy.monotonic() == fake.monotonic()
    copy.advance(1)  # the restored lock works
    assert isinstance(pickle.loads(pickle.dumps(SystemClock())), Clock)
    assert isinstance(fake, Clock)


def test_system_clock_is_utc_and_monotonic() -> None:
    clock = SystemClock()
    a = clock.monotonic()
    assert clock.monotonic() >= a
    assert clock.now().tzinfo is timezone.utc
