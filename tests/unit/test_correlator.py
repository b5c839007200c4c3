"""Event correlation with client-go's semantics (issue 11 item 9).

The correlator is pure: each case feeds events and a fake ``now`` and reads
what would be written (a create, or a patch of the first Event).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nmo.controller.correlator import (
    AGGREGATE_INTERVAL,
    COMBINED_PREFIX,
    SPAM_BURST,
    EventCorrelator,
    Lru,
)
from nmo.controller.recorder import build_event

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
NM = {
    "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
    "kind": "NodeMaintenance",
    "metadata": {"name": "nm-1", "uid": "u-1", "resourceVersion": "10"},
}


def event(
    at: float = 0.0,
    *,
    reason: str = "FailedMaintenance",
    message: str = "Failed a node maintenance",
    obj: dict[str, Any] | None = None,
    warning: bool = True,
) -> dict[str, Any]:
    now = T0 + timedelta(seconds=at)
    kind = "Warning" if warning else "Normal"
    return build_event(obj or NM, kind, reason, message, now, "nmo-0")


def written(correlator: EventCorrelator, body: dict[str, Any], at: float = 0.0) -> Any:
    """Correlate at ``T0 + at`` and answer as the API server would (a resourceVersion)."""
    result = correlator.correlate(body, (T0 + timedelta(seconds=at)).timestamp())
    if result is not None:
        answer = dict(result.event)
        answer["metadata"] = {**result.event["metadata"], "resourceVersion": f"rv-{at}"}
        correlator.update_state(answer)
    return result


def test_an_identical_repeat_patches_the_first_event() -> None:
    c = EventCorrelator()
    first = written(c, event(0))
    assert first is not None and first.patch is None  # a create
    name = first.event["metadata"]["name"]
    for n, at in enumerate((5.0, 3600.0, 86400.0), start=2):  # no time window on repeats
        again = written(c, event(at), at)
        assert again is not None
        assert again.event["metadata"]["name"] == name
        stamp = (T0 + timedelta(seconds=at)).strftime("%Y-%m-%dT%H:%M:%SZ")
        assert again.patch == {
            "count": n,
            "lastTimestamp": stamp,
            "message": "Failed a node maintenance",
        }
        assert again.event["firstTimestamp"] == "2026-12-01T12:00:00Z"
        assert again.event["count"] == n


@pytest.mark.parametrize(
    "change",
    [
        {"message": "another message"},
        {"reason": "SucceedMaintenance"},
        {"warning": False},
        {"obj": {**NM, "metadata": {**NM["metadata"], "uid": "u-2"}}},  # a new CR, same name
        {"obj": {**NM, "metadata": {**NM["metadata"], "name": "nm-2"}}},
    ],
)
def test_anything_but_an_identical_event_is_a_new_event(change: dict[str, Any]) -> None:
    c = EventCorrelator()
    written(c, event(0))
    other = written(c, event(1, **change), 1)
    assert other is not None and other.patch is None
    assert other.event["count"] == 1


def test_the_involved_objects_resource_version_is_not_part_of_the_key() -> None:
    c = EventCorrelator()
    written(c, event(0))
    newer = {**NM, "metadata": {**NM["metadata"], "resourceVersion": "99"}}
    again = written(c, event(1, obj=newer), 1)
    assert again is not None and again.patch is not None and again.patch["count"] == 2


def test_the_server_answer_is_what_the_next_patch_builds_on() -> None:
    c = EventCorrelator()
    first = c.correlate(event(0), T0.timestamp())
    assert first is not None
    # The server says the Event already counts 7 (e.g. written by an earlier correlation).
    c.update_state({**first.event, "count": 7, "metadata": {**first.event["metadata"]}})
    again = c.correlate(event(1), T0.timestamp() + 1)
    assert again is not None and again.patch is not None
    assert again.patch["count"] == 8


def test_ten_messages_of_one_reason_within_ten_minutes_are_combined() -> None:
    c = EventCorrelator()
    results = [written(c, event(i, message=f"pod p{i} deleted"), i) for i in range(12)]
    assert all(r is not None for r in results)
    assert all(r.event["message"] == f"pod p{i} deleted" for i, r in enumerate(results[:9]))
    combined = results[9:]
    assert [r.event["message"] for r in combined] == [
        f"{COMBINED_PREFIX}pod p{i} deleted" for i in (9, 10, 11)
    ]
    # The combined Event is one object: created once, then patched.
    assert combined[0].patch is None
    assert [r.patch["count"] for r in combined[1:]] == [2, 3]
    assert len({r.event["metadata"]["name"] for r in combined}) == 1


def test_the_aggregation_window_restarts_after_ten_quiet_minutes() -> None:
    c = EventCorrelator()
    for i in range(9):
        written(c, event(i, message=f"m{i}"), i)
    later = 8 + AGGREGATE_INTERVAL + 1
    fresh = written(c, event(later, message="m-late"), later)
    assert fresh is not None and fresh.event["message"] == "m-late"


def test_the_spam_filter_drops_past_the_burst_and_refills_every_five_minutes() -> None:
    c = EventCorrelator()
    # Distinct reasons (no aggregation), one object and type: one bucket.
    kept = [written(c, event(0, reason=f"R{i}"), 0) for i in range(SPAM_BURST + 2)]
    assert [r is not None for r in kept] == [True] * SPAM_BURST + [False, False]
    assert written(c, event(299, reason="R-a"), 299) is None
    assert written(c, event(301, reason="R-b"), 301) is not None  # one token back
    assert written(c, event(302, reason="R-c"), 302) is None
    # Another object, or another type, has a bucket of its own.
    other = {**NM, "metadata": {**NM["metadata"], "uid": "u-9"}}
    assert written(c, event(302, obj=other), 302) is not None
    assert written(c, event(302, warning=False), 302) is not None


def test_a_dropped_repeat_is_still_counted_as_client_go_counts_it() -> None:
    c = EventCorrelator(burst=1)
    written(c, event(0))
    assert written(c, event(1), 1) is None  # dropped by the filter
    again = written(c, event(400), 400)
    assert again is not None and again.patch is not None
    assert again.patch["count"] == 3


def test_the_caches_are_bounded() -> None:
    lru: Lru[str, int] = Lru(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # now the most recent
    lru.put("c", 3)
    assert (lru.get("a"), lru.get("b"), lru.get("c"), len(lru)) == (1, None, 3, 2)
    c = EventCorrelator(cache_size=1)
    written(c, event(0))
    written(c, event(1, reason="Other"), 1)  # evicts the first
    again = written(c, event(2), 2)
    assert again is not None and again.patch is None
