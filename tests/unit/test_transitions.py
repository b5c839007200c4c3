"""Status transitions (A2, A5, B4, B5)."""

from datetime import UTC, datetime, timedelta

import pytest

from nmo.api.models import NodeMaintenanceStatus, PendingPodDetail, Phase, PodReference
from nmo.core.maintenance import transitions

NOW = datetime(2026, 11, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("evict", "pending", "expected"),
    [(10, 10, 0), (10, 5, 50), (3, 1, 66), (10, 0, 100), (0, 0, 100), (2, 5, 0)],
)
def test_progress(evict: int, pending: int, expected: int) -> None:
    assert transitions.progress(evict, pending) == expected


def test_first_pass_only_once() -> None:
    refs = [PodReference(namespace="a", name="p1"), PodReference(namespace="b", name="p2")]
    st = transitions.first_pass(NodeMaintenanceStatus(), pending=refs, total_pods=5, now=NOW)
    assert st.phase is Phase.RUNNING
    assert st.pending_pods == ["p1", "p2"]
    assert st.eviction_pods == 2
    assert st.total_pods == 5
    api = st.to_api()
    assert api["totalpods"] == 5 and api["evictionPods"] == 2
    again = transitions.first_pass(st, pending=[], total_pods=0, now=NOW)
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
        st = transitions.lease_error(st, error="boom", counted=counted, now=NOW)
    assert st.phase is phase
    assert st.error_on_lease_count == count
    if phase is Phase.FAILED:
        assert st.last_error == "maintenance failed: lease could not be extended after 4 attempts"


def test_success_clears_last_error_and_lists() -> None:
    st = NodeMaintenanceStatus(
        phase=Phase.RUNNING, last_error="x", pending_pods=["a"], eviction_pods=1
    )
    done = transitions.succeeded(st, NOW)
    assert done.phase is Phase.SUCCEEDED and done.drain_progress == 100
    assert done.last_error is None and done.pending_pods == []
    patch = transitions.status_patch(done)
    assert patch["lastError"] is None  # merge patch removes it
    assert not transitions.differs(done, transitions.succeeded(done, NOW))


def detail(name: str, reason: str, namespace: str = "a") -> PendingPodDetail:
    return PendingPodDetail(namespace=namespace, name=name, reason=reason, message="why")


def test_draining_counts_progress_and_lists_what_remains() -> None:
    st = NodeMaintenanceStatus(phase=Phase.RUNNING, eviction_pods=4)
    pending = [detail("p1", "DisruptionBudget")]
    new = transitions.draining(
        st, pending=[("a", "p1")], details=pending, error=None, now=NOW, started=NOW
    )
    assert new.drain_progress == 75
    assert new.pending_pods_refs == [PodReference(namespace="a", name="p1")]
    assert new.pending_pods_details == pending


@pytest.mark.parametrize(
    ("ran", "before", "details", "expected"),
    [
        # A normal drain within its first pass: no lastError, as the Go NMO.
        pytest.param(29.9, None, [detail("p1", "DisruptionBudget")], None, id="first-pass"),
        # ... and an older one stays until a pass ends (Go overwrites, never clears).
        pytest.param(5, 'nodes "n1" not found', [detail("p1", "Evicting")],
                     'nodes "n1" not found', id="kept-until-a-pass-ends"),
        pytest.param(30, None, [detail("p1", "DisruptionBudget")],
                     'error when evicting pods/"p1" -n "a": global timeout reached: 30s',
                     id="not-evicted"),
        pytest.param(31, None, [detail("p1", "Terminating")],
                     'error when waiting for pod "p1" in namespace "a" to terminate: '
                     "context deadline exceeded", id="evicted-still-terminating"),
        pytest.param(60, None, [detail("p1", "Terminating"), detail("p2", "Waiting", "b")],
                     '[error when waiting for pod "p1" in namespace "a" to terminate: '
                     'context deadline exceeded, error when evicting pods/"p2" -n "b": '
                     "global timeout reached: 30s]", id="aggregated"),
    ],
)  # fmt: skip
def test_last_error_while_draining_is_the_go_nmos(
    ran: float, before: str | None, details: list[PendingPodDetail], expected: str | None
) -> None:
    st = NodeMaintenanceStatus(phase=Phase.RUNNING, eviction_pods=4, last_error=before)
    refs = [(d.namespace, d.name) for d in details]
    new = transitions.draining(
        st,
        pending=refs,
        details=details,
        error=None,
        now=NOW,
        started=NOW - timedelta(seconds=ran),
    )
    assert new.last_error == expected
    assert transitions.is_drain_pass_error(new.last_error) is (ran >= 30)


def test_an_eviction_error_is_shown_at_once() -> None:
    st = NodeMaintenanceStatus(phase=Phase.RUNNING, eviction_pods=1)
    err = "error when evicting pods/p1 -n a: Internal error: more than one PodDisruptionBudget"
    new = transitions.draining(
        st, pending=[("a", "p1")], details=[], error=err, now=NOW, started=NOW
    )
    assert new.last_error == err


def test_the_drain_pass_error_names_at_most_ten_pods() -> None:
    details = [detail(f"p{i}", "Waiting") for i in range(25)]
    text = transitions.drain_pass_error(details)
    assert text is not None and text.startswith("[") and text.endswith(", ... 15 more]")
    assert text.count("global timeout reached") == 10


def test_zero_counts_and_empty_lists_are_omitted_as_go_omitempty_does() -> None:
    """Go NMO's json tags are all ``omitempty``: jsonpath prints nothing for them."""
    running = transitions.first_pass(NodeMaintenanceStatus(), pending=[], total_pods=0, now=NOW)
    api = running.to_api()
    assert api == {"phase": "Running", "lastUpdate": "2026-11-30T00:00:00Z"}
    done = transitions.succeeded(
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
    patch = transitions.status_patch(done)
    for cleared in ("pendingPods", "pendingPodsRefs", "errorOnLeaseCount", "lastError"):
        assert patch[cleared] is None


def test_an_omitted_zero_equals_a_written_zero() -> None:
    """A status read back without the zeros it was written with is not rewritten."""
    written = NodeMaintenanceStatus(phase=Phase.RUNNING, error_on_lease_count=0, pending_pods=[])
    read_back = NodeMaintenanceStatus.model_validate(written.to_api())
    assert read_back.error_on_lease_count is None and read_back.pending_pods is None
    assert not transitions.differs(read_back, written)


def test_last_update_is_written_at_second_precision() -> None:
    st = NodeMaintenanceStatus(
        phase=Phase.RUNNING, last_update=datetime(2026, 11, 30, 1, 2, 3, 987654, tzinfo=UTC)
    )
    assert st.to_api()["lastUpdate"] == "2026-11-30T01:02:03Z"
