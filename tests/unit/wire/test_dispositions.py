"""How a receive link finds the awaited outcomes of an incoming disposition (:func:`spark_sb.wire.receivers.
_index_dispositions`): by delivery id, with the SDK's rule, and the SDK's own walk for a range wider than what is
awaited. Without the index pyamqp walks every awaited delivery per frame: O(n^2) for a range defer of n."""

from __future__ import annotations

from typing import Any

from azure.servicebus._pyamqp.constants import Role

from spark_sb.wire.receivers import _index_dispositions


class Link:
    """The pyamqp receive link's part the index uses: pending dispositions and the SDK's own method (counted)."""

    def __init__(self, awaited: list[int]) -> None:
        self._pending_dispositions: dict[int, dict[str, Any]] = {
            d: {"settled": False, "outcome": None} for d in awaited
        }
        self.walks = 0

    def _incoming_disposition(self, frame: Any) -> None:
        self.walks += 1
        for d, p in self._pending_dispositions.items():
            if frame[1] <= d <= (frame[2] if frame[2] is not None else frame[1]):
                p["outcome"], p["settled"] = frame[4], True


def _frame(first: int, last: int | None, settled: bool = True, role: Any = Role.Sender) -> tuple[Any, ...]:
    return (role, first, last, settled, {"modified": []}, False)


def test_single_and_range_answers_are_found_by_id_without_the_sdks_walk() -> None:
    link = Link(list(range(100, 1100)))
    _index_dispositions(link)
    _index_dispositions(link)  # once per link
    for d in range(100, 600):
        link._incoming_disposition(_frame(d, None))
    link._incoming_disposition(_frame(600, 1099))
    assert link.walks == 0
    assert all(p["settled"] and p["outcome"] == {"modified": []} for p in link._pending_dispositions.values())


def test_what_the_sdk_ignores_is_ignored_and_a_wider_range_is_walked_the_sdks_way() -> None:
    link = Link([5, 6, 7])
    _index_dispositions(link)
    link._incoming_disposition(_frame(5, None, settled=False))  # not settled: no confirmation
    link._incoming_disposition(_frame(6, None, role=Role.Receiver))  # not the sender's
    assert not any(p["settled"] for p in link._pending_dispositions.values())
    link._incoming_disposition(_frame(0, 2**31))  # wider than what is awaited
    assert link.walks == 1 and all(p["settled"] for p in link._pending_dispositions.values())
