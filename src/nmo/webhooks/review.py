"""AdmissionReview v1: parsed once at the edge, answered in the exact shape.

Why this module exists: the kube-apiserver only accepts an answer that is a
well-formed ``admission.k8s.io/v1`` AdmissionReview whose ``response.uid``
echoes the request, so decoding and encoding live in one place, typed with
pydantic, and the rules (:mod:`nmo.webhooks.validators`) never see JSON.

Guarantees: :func:`parse_review` either returns a validated review or raises
:class:`MalformedReview` carrying the request uid when one could be read (the
caller can then still answer with a proper review), whatever the bytes (bad
UTF-8, absurd nesting, huge numbers included); :func:`wrong_target` names what
was expected when a review is about anything but a NodeMaintenance;
:func:`review_response`
always produces ``apiVersion``, ``kind``, ``response.uid``, ``response.allowed``
and, for denials, ``status {code, reason, message}`` as controller-runtime
does (403 Forbidden for a rule, 400 BadRequest for an unusable request);
``response.warnings`` only when the decision carries some.
"""

from __future__ import annotations

import json
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nmo.api.constants import GROUP, KIND, PLURAL
from nmo.webhooks.validators import Decision

ADMISSION_V1: Final = "admission.k8s.io/v1"
ADMISSION_V1BETA1: Final = "admission.k8s.io/v1beta1"
REVIEW_KIND: Final = "AdmissionReview"
_VERSIONS: Final = (ADMISSION_V1, ADMISSION_V1BETA1)

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class GroupVersionKind(_Model):
    group: str = ""
    version: str = ""
    kind: str = ""


class GroupVersionResource(_Model):
    group: str = ""
    version: str = ""
    resource: str = ""


class UserInfo(_Model):
    username: str = ""
    uid: str = ""
    groups: list[str] = Field(default_factory=list)


class AdmissionRequest(_Model):
    """The parts of ``request`` nmo reads."""

    uid: str = Field(min_length=1)
    kind: GroupVersionKind = Field(default_factory=GroupVersionKind)
    resource: GroupVersionResource = Field(default_factory=GroupVersionResource)
    sub_resource: str = Field(default="", alias="subResource")
    name: str = ""
    namespace: str = ""
    operation: Operation
    user_info: UserInfo = Field(default_factory=UserInfo, alias="userInfo")
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = Field(default=None, alias="oldObject")
    dry_run: bool = Field(default=False, alias="dryRun")


class AdmissionReview(_Model):
    api_version: Literal["admission.k8s.io/v1", "admission.k8s.io/v1beta1"] = Field(
        alias="apiVersion"
    )
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class ResponseStatus(_Model):
    code: int
    reason: str | None = None
    message: str | None = None


class AdmissionResponse(_Model):
    uid: str
    allowed: bool
    status: ResponseStatus | None = None
    warnings: list[str] | None = None


class AdmissionReviewResponse(_Model):
    api_version: str = Field(default=ADMISSION_V1, alias="apiVersion")
    kind: str = REVIEW_KIND
    response: AdmissionResponse


class MalformedReview(ValueError):
    """The body is not a usable AdmissionReview.

    ``uid`` is the request uid when it could still be read: then the answer is
    an AdmissionReview with a 400 status; without it, plain HTTP 400.
    """

    def __init__(self, message: str, *, uid: str | None = None, api_version: str = ADMISSION_V1):
        super().__init__(message)
        self.message = message
        self.uid = uid
        self.api_version = api_version


def _summarise(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def parse_review(body: bytes) -> AdmissionReview:
    """Decode and validate a review; raises :class:`MalformedReview`."""
    if not body:
        raise MalformedReview("request body is empty")
    try:
        data = json.loads(body)
    except ValueError as exc:  # also bad UTF-8 and integers of thousands of digits
        raise MalformedReview(f"request body is not JSON: {exc}") from exc
    except RecursionError as exc:
        raise MalformedReview("request body is not JSON: nested too deeply") from exc
    if not isinstance(data, dict):
        raise MalformedReview("request body is not a JSON object")
    request = data.get("request")
    uid = request.get("uid") if isinstance(request, dict) else None
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("AdmissionReview has no request.uid")
    api_version = data.get("apiVersion")
    answer_version = api_version if api_version in _VERSIONS else ADMISSION_V1
    try:
        return AdmissionReview.model_validate(data)
    except ValidationError as exc:
        raise MalformedReview(
            f"malformed AdmissionReview: {_summarise(exc)}", uid=uid, api_version=answer_version
        ) from exc


def _group(api_version: object) -> str | None:
    if not isinstance(api_version, str):
        return None
    return api_version.rpartition("/")[0] if "/" in api_version else ""


_EXPECTED: Final = f"this webhook validates {KIND} ({GROUP}, resource {PLURAL})"


def wrong_target(request: AdmissionRequest) -> str | None:
    """Why the request is not about a NodeMaintenance, or None when it is.

    Fields left empty (hand-made reviews) are not held against the request;
    what is filled in must name NodeMaintenance.
    """
    expected = _EXPECTED
    kind = request.kind
    if kind.kind and (kind.kind, kind.group) != (KIND, GROUP):
        got = f"{kind.kind} ({kind.group or 'core'})"
        return f"AdmissionReview is for kind {_clip(got)}, {expected}"
    resource = request.resource
    if resource.resource and (resource.resource, resource.group) != (PLURAL, GROUP):
        got = f"{resource.resource} ({resource.group or 'core'})"
        return f"AdmissionReview is for resource {_clip(got)}, {expected}"
    for field, obj in (("object", request.object), ("oldObject", request.old_object)):
        if obj is None:
            continue
        obj_kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if (obj_kind is not None and obj_kind != KIND) or (
            api_version is not None and _group(api_version) != GROUP
        ):
            got = f"{obj_kind} ({api_version})"
            return f"request.{field} is a {_clip(got)}, {expected}"
    return None


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def review_response(
    uid: str, decision: Decision, *, api_version: str = ADMISSION_V1
) -> dict[str, Any]:
    """The AdmissionReview to send back for a decision.

    Built as the plain dict :class:`AdmissionReviewResponse` dumps to (by
    alias, without None), without the model: a review is answered on the
    one event loop, and the model's round trip cost as much as its rules.
    """
    if decision.allowed:
        status: dict[str, Any] = {"code": decision.code or 200}
    else:
        status = {"code": decision.code}
        if decision.reason:
            status["reason"] = decision.reason
        status["message"] = decision.message
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed, "status": status}
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    return {"apiVersion": api_version, "kind": REVIEW_KIND, "response": response}
