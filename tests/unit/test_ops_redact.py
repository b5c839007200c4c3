"""Redaction by shape (issue 20): every form a secret's name takes, and what must stay.

The first table failed before: ``MYSQL_ROOT_PW``, ``--db-pw=``, ``-p x`` and
``?sig=`` went into bundles as they were.
"""

from __future__ import annotations

import pytest

from nmo.ops import bundle
from nmo.ops.redact import REDACTED, redact, redact_text, secret_flag, secret_name

R = REDACTED

# text -> what it must become
REDACTED_TEXT = {
    # env names (issue 20's four, then their kin)
    "MYSQL_ROOT_PW=hunter22": f"MYSQL_ROOT_PW={R}",
    "export DB_PWD=hunter22": f"export DB_PWD={R}",
    "GIT_SIG=abc": f"GIT_SIG={R}",
    "BASIC_AUTH=user:pw": f"BASIC_AUTH={R}",
    "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI": f"AWS_SECRET_ACCESS_KEY={R}",
    "DBPASSWORD=hunter22": f"DBPASSWORD={R}",
    "MYSQLPASS=hunter22": f"MYSQLPASS={R}",
    # flags
    "app --db-pw=s3cr3t --verbose": f"app --db-pw={R} --verbose",
    "app --db-pw s3cr3t": f"app --db-pw {R}",
    "mysql -u root -p x": f"mysql -u root -p {R}",
    "mysql -u root -p=x": f"mysql -u root -p={R}",
    "app -token abc123": f"app -token {R}",  # Go's single dash
    "app --api-key 'two words'": f"app --api-key '{R}'",
    'app --signing-key "a \\" b"': f'app --signing-key "{R}"',
    # URL query parameters and user info
    "GET https://acct.blob.core.windows.net/c/b?sv=2021-08-06&sig=abcDEF%3D&se=2030": (
        f"GET https://acct.blob.core.windows.net/c/b?sv=2021-08-06&sig={R}&se=2030"
    ),
    "https://s3.example.com/o?X-Amz-Signature=d3adb33f&X-Amz-Expires=60": (
        f"https://s3.example.com/o?X-Amz-Signature={R}&X-Amz-Expires=60"
    ),
    "https://api.example.com/v1?page=2&access_token=abc": (
        f"https://api.example.com/v1?page=2&access_token={R}"
    ),
    "https://example.com/cb?apiKey=x1#top": f"https://example.com/cb?apiKey={R}#top",
    "postgres://app:hunter2pass@db.internal:5432/app": f"postgres://{R}@db.internal:5432/app",
    "git clone https://ghp_abc123@github.com/org/repo.git": (
        f"git clone https://{R}@github.com/org/repo.git"
    ),
    # pairs in YAML, JSON and logfmt
    "db_password: hunter2": f"db_password: {R}",
    '{"apiKey": "x1", "user": "bob"}': f'{{"apiKey": "{R}", "user": "bob"}}',
    '{"clientSecret":"x2"}': f'{{"clientSecret":"{R}"}}',
    "level=info creds=abc msg=ok": f"level=info creds={R} msg=ok",
}

# text that must come out as it went in
KEPT_TEXT = [
    "app --signal=SIGTERM",
    "kill -s SIGKILL 42",
    "STOPSIGNAL=SIGQUIT",
    "design=final assign=yes",
    "PWD=/app OLDPWD=/",
    "passed: 3 failed: 0",
    "app --bypass-checks=true",
    "key=node.kubernetes.io/unschedulable",
    "key: node-role.kubernetes.io/control-plane",
    "--tls-private-key-file /etc/tls/key.pem --secret-name db",
    "secretName: tls tokenSecretRef: db-token",
    "DB_PASSWORD_FILE=/run/secrets/db",
    "https://db.internal:5432/app",
    "https://hooks.example.com/x?page=2&sort=asc",
    "kubectl get pods -n default -o yaml --port 8080",
    "maintenance nm-1: lease node-n1 renewed; drain 3 pending",
    "time: 12:30:00 node: worker-1",
    f"already {R}",
]


@pytest.mark.parametrize("text", sorted(REDACTED_TEXT))
def test_secret_names_in_text(text: str) -> None:
    assert redact_text(text) == REDACTED_TEXT[text]


@pytest.mark.parametrize("text", KEPT_TEXT)
def test_what_is_not_a_secret_stays(text: str) -> None:
    assert redact_text(text) == text


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("MYSQL_ROOT_PW", True),
        ("--db-pw", True),
        ("sig", True),
        ("X-Amz-Signature", True),
        ("apiKey", True),
        ("dbPassword", True),
        ("Authorization", True),
        ("access_token", True),
        ("AWS_CREDENTIALS", True),
        ("signal", False),
        ("design", False),
        ("PWD", False),
        ("key", False),
        ("secretName", False),
        ("tokenSecretRef", False),
        ("TLS_KEY_FILE", False),
        ("passed", False),
        ("bypass", False),
        ("authorization-mode", False),
    ],
)
def test_secret_name(name: str, secret: bool) -> None:
    assert secret_name(name) is secret


@pytest.mark.parametrize(
    ("flag", "secret"),
    [("-p", True), ("--db-pw", True), ("-token", True), ("-P", False), ("-n", False), ("p", False)],
)
def test_secret_flag(flag: str, secret: bool) -> None:
    assert secret_flag(flag) is secret


def test_objects_by_every_name_form() -> None:
    pod = {
        "spec": {
            "containers": [
                {
                    "command": ["mysql", "-u", "root", "-p", "x"],
                    "args": ["--db-pw", "s1", "--db-pw=s2", "-n", "default", "--signal", "TERM"],
                    "env": [
                        {"name": "MYSQL_ROOT_PW", "value": "s3"},
                        {"name": "PWD", "value": "/app"},
                        {"name": "URL", "value": "https://h/x?sig=s4&page=2"},
                    ],
                }
            ]
        },
        "data": {"signature": "s5", "signal": "TERM", "key": "app"},
    }
    out = redact(pod)
    container = out["spec"]["containers"][0]
    assert container["command"] == ["mysql", "-u", "root", "-p", R]
    assert container["args"] == ["--db-pw", R, f"--db-pw={R}", "-n", "default", "--signal", "TERM"]
    assert [e["value"] for e in container["env"]] == [R, "/app", f"https://h/x?sig={R}&page=2"]
    assert out["data"] == {"signature": R, "signal": "TERM", "key": "app"}
    assert bundle.redact is redact and bundle.REDACTED == R  # what gather writes with
