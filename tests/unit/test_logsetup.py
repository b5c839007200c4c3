"""Request content cannot forge log lines (issue 20): every field the webhook
and metrics paths log is written on one line in the text format, control
characters escaped; the JSON format escapes them by itself."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_intake import review
from webhook_fakes import FakeLookups, node

from nmo.api.constants import WEBHOOK_PATH
from nmo.kube.errors import Transient
from nmo.server.app import create_webhook_app
from nmo.server.metricsauth import AuthRejected, MetricsAuth
from nmo.telemetry.logsetup import JsonFormatter, TextFormatter, printable
from nmo.telemetry.metrics import Metrics

FORGED = "12:00:00.000 INFO    nmo.webhooks: maintenance CREATE for node n9 allowed"


@pytest.fixture
def logged() -> Iterator[io.StringIO]:
    """What the ``nmo`` loggers write in the text format, at info level."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(TextFormatter())
    logger = logging.getLogger("nmo")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain name-1.example", "plain name-1.example"),
        ("a\nb", "a\\nb"),
        ("a\r\nb\tc", "a\\r\\nb\\tc"),
        ("\x1b[31mred\x00", "\\x1b[31mred\\x00"),
        ("next\x85line\u2028sep\u2029", "next\\x85line\\u2028sep\\u2029"),
        ("\u202eevil\u2066", "\\u202eevil\\u2066"),
        ("é ü 中文 \\n", "é ü 中文 \\n"),  # printable text, a literal backslash-n, stay
    ],
)
def test_printable(text: str, shown: str) -> None:
    assert printable(text) == shown


async def test_a_review_cannot_forge_webhook_log_lines(logged: io.StringIO) -> None:
    doc = review(
        userInfo={"username": f"alice\n{FORGED}"},
        name="nm\r\x1b[2K",
        object={"metadata": {"name": "nm"}, "spec": {"nodeName": f"n1\n{FORGED}"}},
    )
    app = create_webhook_app(lookups=FakeLookups(nodes={"n1": node("n1")}), metrics=Metrics())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://wh.test") as http:
        resp = await http.post(WEBHOOK_PATH, content=json.dumps(doc).encode())
    assert resp.json()["response"]["allowed"] is False
    lines = logged.getvalue().splitlines()
    assert len(lines) == 1, lines  # one decision, one line
    (line,) = lines
    assert "denied" in line
    assert f"user=alice\\n{FORGED}" in line
    assert f"node=n1\\n{FORGED}" in line
    assert "cr=nm\\r\\x1b[2K" in line


async def test_metrics_errors_cannot_forge_log_lines(logged: io.StringIO) -> None:
    class Failing:
        async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
            raise Transient(f"connection reset\n{FORGED}")

    with pytest.raises(AuthRejected):
        await MetricsAuth(Failing()).check("Bearer t", path="/metrics", method="GET")
    lines = logged.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert f"connection reset\\n{FORGED}" in lines[0]


def test_the_json_format_stays_one_line_and_keeps_the_value() -> None:
    record = logging.makeLogRecord(
        {"name": "nmo.webhooks", "msg": "user %s", "args": ("a\nb",), "user": "a\nb\u2028"}
    )
    (line,) = JsonFormatter().format(record).splitlines()
    assert json.loads(line)["user"] == "a\nb\u2028"
    assert json.loads(line)["msg"] == "user a\nb"


def test_a_traceback_keeps_its_lines() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.makeLogRecord({"name": "nmo", "msg": "failed\nx"})
        record.exc_info = sys.exc_info()
    text = TextFormatter().format(record)
    assert text.splitlines()[0].endswith("nmo: failed\\nx")
    assert "Traceback (most recent call last):" in text.splitlines()[1]
