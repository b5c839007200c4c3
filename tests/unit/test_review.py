"""The AdmissionReview answer: the plain dict the webhook sends is exactly what
the typed model (:class:`nmo.webhooks.review.AdmissionReviewResponse`) dumps
to, for every kind of decision."""

from __future__ import annotations

import json

import pytest

from nmo.webhooks.review import (
    ADMISSION_V1,
    ADMISSION_V1BETA1,
    AdmissionResponse,
    AdmissionReviewResponse,
    ResponseStatus,
    review_response,
)
from nmo.webhooks.validators import Decision

DECISIONS = {
    "allowed": Decision.allow(),
    "allowed with warnings": Decision.allow(["a PDB allows no disruption", "second"]),
    "denied": Decision.deny("a NodeMaintenance for node n1 already exists"),
    "lookup failed": Decision.failed("could not get node", "timeout"),
    "bad request": Decision.bad_request("spec.nodeName is required"),
    "internal error": Decision(False, "internal error (ref 0a1b)", 500, "InternalError", "error"),
    "denied without reason or message": Decision(False, "", 403, "", "denied"),
    "allowed with code 0": Decision(True, code=0),
}


def modelled(uid: str, decision: Decision, api_version: str) -> dict[str, object]:
    if decision.allowed:
        status = ResponseStatus(code=decision.code or 200)
    else:
        status = ResponseStatus(
            code=decision.code, reason=decision.reason or None, message=decision.message
        )
    answer = AdmissionReviewResponse(
        api_version=api_version,
        response=AdmissionResponse(
            uid=uid,
            allowed=decision.allowed,
            status=status,
            warnings=list(decision.warnings) or None,
        ),
    )
    return answer.model_dump(mode="json", by_alias=True, exclude_none=True)


@pytest.mark.parametrize("api_version", [ADMISSION_V1, ADMISSION_V1BETA1])
@pytest.mark.parametrize("decision", DECISIONS.values(), ids=DECISIONS.keys())
@pytest.mark.parametrize("uid", ["req-1", "lone \udc80 surrogate"])
def test_the_answer_is_the_models_dump(uid: str, decision: Decision, api_version: str) -> None:
    answer = review_response(uid, decision, api_version=api_version)
    expected = modelled(uid, decision, api_version)
    assert answer == expected
    # Same keys in the same order: the bytes on the wire are the same too.
    assert json.dumps(answer) == json.dumps(expected)
