"""Status transitions (A2, A5, B4, B5)."""

from datetime import UTC, datetime

import pytest

from nmo.api.models import NodeMaintenanceStatus, PendingPodDetail, Phase, PodReference
from nmo.core.maintenance import transitions as status

NOW = datetime(2026, 11, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("evict", "pending", "expected"),
    [(10, 10, 0), (10, 5, 50), (3, 1, 66), (10, 0, 100), (0, 0, 100), (2, 5, 0)],
)
def test_progress(evict: int, pending: int, expected: int) -> None:
    assert status.progress(evict, pending) == expected


def test_first_pass_only_once() -> None:
    refs = [PodReference(namespace="a", name="p1"), PodReference(namespace="b", name="p2")]
    st = status.first_pass(NodeMaintenanceStatus(), pending=refs, total_pods=5, now=NOW)
    assert st.phase is Phase.RUNNING
    assert st.pending_pods == ["p1", "p2"]
    assert st.eviction_pods == 2
    assert st.total_pods == 5
    api = st.to_api()
    assert api["totalpods"] == 5 and api["evictionPods"] == 2
    again = status.first_pass(st, pending=[], total_pods=0, now=NOW)
    assert again is st


@pytest.mark.parametrize(
    ("start", "errors", "counted", "phase", "count"),
    [
        (0, 1, False, Phase.RUNNING, 0),
        (0, 3, True, Phase.RUNNING, 3),
        (3, 1, True, Phase.FAILED, 4),
        (2, 1, False, Phase.RUNNING, 2),
    ],
)
def test_lease_counting(start: int, errors: int, counted: bool, phase: Phase, count: int) -> None:
    st = NodeMaintenanceStatus(phase=Phase.RUNNING, error_on_lease_count=start)
    for _ in range(errors):
        st = status.lease_error(st, error="boom", counted=counted, now=NOW)
    assert st.phase is phase
    assert st.error_on_lease_count == count
    if phase is Phase.FAILED:
        assert st.last_error == "maintenance failed: lease could not be extended after 4 attempts"


def test_success_clears_last_error_and_lists() -> None:
    st = NodeMaintenanceStatus(
        phase=Phase.RUNNING, last_error="x", pending_pods=["a"], eviction_pods=1
    )
    done = status.succeeded(st, NOW)
    assert done.phase is Phase.SUCCEEDED and done.drain_progress == 100
    assert done.last_error is None and done.pending_pods == []
    patch = status.status_patch(done)
    assert patch["lastError"] is None  # merge patch removes it
    assert not status.differs(done, status.succeeded(done, NOW))


def test_draining_explains_the_blocked_pod() -> None:
    st = NodeMaintenanceStatus(phase=Phase.RUNNING, eviction_pods=4)
    pending = [
        PendingPodDetail(
            namespace="a",
            name="p1",
            reason="DisruptionBudget",
            message="blocked by budget",
            disruption_budget="web-pdb",
        ),
    ]
    new = status.draining(st, pending=[("a", "p1")], details=pending, error=None, now=NOW)
    assert new.drain_progress == 75
    assert new.pending_pods_refs == [PodReference(namespace="a", name="p1")]
    assert (
        new.last_error is not None
        and "a/p1" in new.last_error
        and "blocked by budget" in new.last_error
    )


def test_zero_counts_and_empty_lists_are_omitted_as_go_omitempty_does() -> None:
    """Go NMO's json tags are all ``omitempty``: jsonpath prints nothing for them."""
    running = status.first_pass(NodeMaintenanceStatus(), pending=[], total_pods=0, now=NOW)
    api = running.to_api()
    assert api == {"phase": "Running", "lastUpdate": "2026-11-30T00:00:00Z"}
    done = status.succeeded(
        NodeMaintenanceStatus(
            phase=Phase.RUNNING,
            last_error="x",
            pending_pods=["a"],
            pending_pods_refs=[PodReference(namespace="n", name="a")],
            eviction_pods=1,
            total_pods=2,
            error_on_lease_count=0,
        ),
        NOW,
    )
    api = done.to_api()
    for absent in ("pendingPods", "pendingPodsRefs", "pendingPodsDetails", "errorOnLeaseCount"):
        assert absent not in api
    assert api["drainProgress"] == 100 and api["evictionPods"] == 1 and api["totalpods"] == 2
    # ... and the merge patch still clears what was set before
    patch = status.status_patch(done)
    for cleared in ("pendingPods", "pendingPodsRefs", "errorOnLeaseCount", "lastError"):
        assert patch[cleared] is None


def test_an_omitted_zero_equals_a_written_zero() -> None:
    """A status read back without the zeros it was written with is not rewritten."""
    written = NodeMaintenanceStatus(phase=Phase.RUNNING, error_on_lease_count=0, pending_pods=[])
    read_back = NodeMaintenanceStatus.model_validate(written.to_api())
    assert read_back.error_on_lease_count is None and read_back.pending_pods is None
    assert not status.differs(read_back, written)


def test_last_update_is_written_at_second_precision() -> None:
    st = NodeMaintenanceStatus(
        phase=Phase.RUNNING, last_update=datetime(2026, 11, 30, 1, 2, 3, 987654, tzinfo=UTC)
    )
    assert st.to_api()["lastUpdate"] == "2026-11-30T01:02:03Z"
