"""The chart's admission, network and RBAC shapes, rendered offline (``helm template``).

* The webhook per Kubernetes version: matchConditions from 1.28 (beta, on by
  default; GA 1.30), two webhooks (CREATE, UPDATE with its own failure
  policy) before, and ``webhook.matchConditions`` overriding the version.
* ``openshift.etcdQuorumGuard``: auto follows the served APIs, true/false
  hold offline.
* The NetworkPolicy, off by default (the Go NMO ships none): which port
  admits whom, which egress.
  No CNI here enforces it; tests/integration/test_chart.py installs it.
* The ValidatingAdmissionPolicies (Nodes, the shared node leases), on where
  the cluster serves them, and least-privilege RBAC.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

import pytest
import yaml
from test_chart_alerts import CHART, ROOT, helm_env, of_kind, render, template

from nmo.api import constants as c
from nmo.controller.ledger import LEDGER_NAME

__all__ = ["helm_env"]  # the fixture, shared

Doc = dict[str, Any]
SA_USER = f"system:serviceaccount:{c.OPERATOR_NAMESPACE}:{c.OPERATOR_SERVICE_ACCOUNT}"
OPENSHIFT = ["--api-versions", "config.openshift.io/v1"]
AGENT = "konnectivity-agent"


def webhooks(docs: list[Doc]) -> list[Doc]:
    (vwc,) = of_kind(docs, "ValidatingWebhookConfiguration")
    return list(vwc["webhooks"])


def one(docs: list[Doc], kind: str, name_suffix: str = "") -> Doc:
    (doc,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    return doc


# -- the webhook per Kubernetes version ----------------------------------------


@pytest.mark.parametrize("version", ["1.28.0", "1.29.4", "1.30.0", "1.35.4", "v1.31.2-gke.100"])
def test_matchconditions_from_1_28(helm_env: dict[str, str], version: str) -> None:
    (hook,) = webhooks(render(helm_env, "--kube-version", version))
    assert hook["name"] == c.WEBHOOK_NAME
    assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    (condition,) = hook["matchConditions"]
    assert "request.operation == 'CREATE'" in condition["expression"]
    assert "object.spec.nodeName != oldObject.spec.nodeName" in condition["expression"]
    assert hook["failurePolicy"] == "Fail"


@pytest.mark.parametrize("version", ["1.23.0", "1.25.16", "1.27.9", "v1.27.3-eks-2f008fe"])
def test_before_1_28_update_is_a_webhook_of_its_own(helm_env: dict[str, str], version: str) -> None:
    create, update = webhooks(render(helm_env, "--kube-version", version))
    assert (create["name"], update["name"]) == (c.WEBHOOK_NAME, "vnodemaintenance-update.kb.io")
    assert create["rules"][0]["operations"] == ["CREATE"]
    assert update["rules"][0]["operations"] == ["UPDATE"]
    assert "matchConditions" not in create
    assert "matchConditions" not in update
    # CREATE fails closed; UPDATE (finalizer removal while nmo is down) does not.
    assert (create["failurePolicy"], update["failurePolicy"]) == ("Fail", "Ignore")
    for hook in (create, update):
        assert hook["clientConfig"]["service"]["path"] == c.WEBHOOK_PATH
        assert hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["timeoutSeconds"] == 10
        assert hook["rules"][0]["resources"] == ["nodemaintenances"]


def test_the_values_override_the_version(helm_env: dict[str, str]) -> None:
    forced = webhooks(
        render(helm_env, "--kube-version", "1.27.0", "--set", "webhook.matchConditions=true")
    )
    assert [h["name"] for h in forced] == [c.WEBHOOK_NAME]
    assert "matchConditions" in forced[0]
    as_string = webhooks(
        render(
            helm_env, "--kube-version", "1.30.0", "--set-string", "webhook.matchConditions=false"
        )
    )
    assert len(as_string) == 2  # a string "false" (GitOps parameters) means false too
    off = webhooks(
        render(helm_env, "--kube-version", "1.30.0", "--set", "webhook.matchConditions=false")
    )
    assert [h["name"] for h in off] == [c.WEBHOOK_NAME, "vnodemaintenance-update.kb.io"]
    strict = webhooks(
        render(
            helm_env, "--kube-version", "1.26.0",
            "--set", "webhook.updateFailurePolicy=Fail", "--set", "webhook.failurePolicy=Ignore",
        )
    )  # fmt: skip
    assert [h["failurePolicy"] for h in strict] == ["Ignore", "Fail"]


@pytest.mark.parametrize(
    "mode",
    [
        [],
        ["--set", "webhook.certManager.enabled=false"],
        ["--set", "webhook.url=https://10.0.0.5:9443/x", "--set", "webhook.caBundle=QQ=="],
    ],
    ids=["cert-manager", "helm-generated", "webhook-url"],
)
def test_both_webhooks_trust_the_same_server(helm_env: dict[str, str], mode: list[str]) -> None:
    docs = render(helm_env, "--kube-version", "1.24.0", *mode)
    create, update = webhooks(docs)
    assert create["clientConfig"] == update["clientConfig"]
    (vwc,) = of_kind(docs, "ValidatingWebhookConfiguration")
    injected = (vwc["metadata"].get("annotations") or {}).get("cert-manager.io/inject-ca-from")
    # cert-manager's cainjector fills caBundle into every webhook of the object.
    assert (injected is not None) == (mode == [])


def test_the_chart_refuses_kubernetes_before_1_23(helm_env: dict[str, str]) -> None:
    result = template(helm_env, "--kube-version", "1.22.17")
    assert result.returncode != 0
    assert ">=1.23.0-0" in result.stderr


# -- openshift.etcdQuorumGuard --------------------------------------------------


@pytest.mark.parametrize(
    ("value", "apis", "granted"),
    [
        ("auto", [], False),  # helm template offline: no OpenShift API known
        ("auto", OPENSHIFT, True),  # helm install on OpenShift, or --api-versions
        ("true", [], True),  # GitOps rendering for an OpenShift cluster
        ("false", OPENSHIFT, False),
        ("'true'", [], True),  # a YAML string, as some GitOps tools pass values
    ],
)
def test_openshift_etcd_guard_value(
    helm_env: dict[str, str], value: str, apis: list[str], granted: bool
) -> None:
    flag = "--set-json" if value.startswith("'") else "--set"
    value = value.replace("'", '"')
    docs = render(helm_env, flag, f"openshift.etcdQuorumGuard={value}", *apis)
    in_etcd = [d for d in docs if d["metadata"].get("namespace") == "openshift-etcd"]
    if not granted:
        assert in_etcd == []
        return
    assert sorted(d["kind"] for d in in_etcd) == ["Role", "RoleBinding"]
    role = one(in_etcd, "Role")
    assert role["rules"] == [
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["list"]}
    ]
    binding = one(in_etcd, "RoleBinding")
    assert binding["subjects"][0]["name"] == c.OPERATOR_SERVICE_ACCOUNT


# -- NetworkPolicy -----------------------------------------------------------------


NP_ON = ["--set", "networkPolicy.enabled=true"]


def policy(docs: list[Doc]) -> Doc:
    (np,) = of_kind(docs, "NetworkPolicy")
    return np


def ingress_by_port(np: Doc) -> dict[int, list[Doc] | None]:
    """Port -> its ``from`` peers (None: any source)."""
    out: dict[int, list[Doc] | None] = {}
    for rule in np["spec"]["ingress"]:
        for port in rule["ports"]:
            assert port["port"] not in out, f"port {port['port']} in two rules"
            out[port["port"]] = rule.get("from")
    return out


def blocks(peers: list[Doc] | None) -> list[str]:
    return [p["ipBlock"]["cidr"] for p in peers or [] if "ipBlock" in p]


def test_no_network_policy_by_default(helm_env: dict[str, str]) -> None:
    assert of_kind(render(helm_env), "NetworkPolicy") == []
    assert of_kind(render(helm_env, *OPENSHIFT), "NetworkPolicy") == []


def test_network_policy_when_on_has_both_directions(helm_env: dict[str, str]) -> None:
    docs = render(helm_env, *NP_ON)
    np = policy(docs)
    assert np["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert np["spec"]["podSelector"]["matchLabels"]["control-plane"] == "controller-manager"
    (dep,) = of_kind(docs, "Deployment")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert np["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    ports = ingress_by_port(np)
    # 8081 has no rule: only the pod's own node (its kubelet) reaches it, which
    # a NetworkPolicy cannot block.
    assert set(ports) == {9443, 8443}
    # Offline, the apiserver's addresses are unknown: said so, not hidden.
    assert ports[9443] is None
    assert "unknown" in np["metadata"]["annotations"]["nmo.medik8s.io/api-server"]
    apiserver, dns = np["spec"]["egress"]
    assert [p["port"] for p in apiserver["ports"]] == [443, 6443]
    assert "to" not in apiserver
    assert dns["ports"] == [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
    (peer,) = dns["to"]
    assert peer["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert peer["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
    }


def test_network_policy_with_the_apiserver_addresses(helm_env: dict[str, str]) -> None:
    np = policy(
        render(
            helm_env,
            *NP_ON,
            "--set", "networkPolicy.apiServer.cidrs={10.0.0.10/32,fd00::10/128}",
            "--set", "networkPolicy.probesFrom={10.0.0.0/16}",
            "--set", f"networkPolicy.webhookFrom[0].podSelector.matchLabels.k8s-app={AGENT}",
            "--set", "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring",
        )
    )  # fmt: skip
    ports = ingress_by_port(np)
    assert blocks(ports[9443]) == ["10.0.0.10/32", "fd00::10/128"]
    assert {"podSelector": {"matchLabels": {"k8s-app": AGENT}}} in (ports[9443] or [])
    assert blocks(ports[8081]) == ["10.0.0.0/16"]
    assert ports[8443] == [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    apiserver = np["spec"]["egress"][0]
    assert blocks(apiserver["to"]) == ["10.0.0.10/32", "fd00::10/128"]
    assert np["metadata"]["annotations"]["nmo.medik8s.io/api-server"] == (
        "networkPolicy.apiServer.cidrs"
    )


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("https://hooks.example.com/nmo", 443),
        ("http://receiver.tools/hook", 80),
        ("http://receiver.tools:8080/hook", 8080),
        ("https://user:pw@[fd00::1]:8443/x", 8443),
    ],
)
def test_network_policy_lets_the_notify_port_out(
    helm_env: dict[str, str], url: str, port: int
) -> None:
    np = policy(render(helm_env, *NP_ON, "--set-string", f"notify.url={url}"))
    notify = np["spec"]["egress"][-1]
    assert notify["ports"] == [{"port": port, "protocol": "TCP"}]
    # Any address (the receiver is a name), but no cloud metadata endpoint and no loopback.
    assert notify["to"] == [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16", "127.0.0.0/8"]}},
        {"ipBlock": {"cidr": "::/0", "except": ["fd00:ec2::254/128", "fe80::/10", "::1/128"]}},
    ]
    for block in notify["to"]:
        network = ipaddress.ip_network(block["ipBlock"]["cidr"])
        for excluded in block["ipBlock"]["except"]:  # the API server refuses others
            assert ipaddress.ip_network(excluded).subnet_of(network)  # type: ignore[arg-type]
    metadata = ["169.254.169.254", "fd00:ec2::254", "127.0.0.1", "::1", "fe80::1"]
    for address in map(ipaddress.ip_address, metadata):
        (block,) = [b["ipBlock"] for b in notify["to"]
                    if address in ipaddress.ip_network(b["ipBlock"]["cidr"])]  # fmt: skip
        assert any(address in ipaddress.ip_network(e) for e in block["except"]), address


def test_network_policy_extra_egress_and_its_absence(helm_env: dict[str, str]) -> None:
    np = policy(
        render(
            helm_env,
            *NP_ON,
            "--set", "networkPolicy.extraEgress[0].to[0].ipBlock.cidr=10.1.2.3/32",
            "--set", "networkPolicy.extraEgress[0].ports[0].port=8080",
        )
    )  # fmt: skip
    assert np["spec"]["egress"][-1] == {
        "to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}],
        "ports": [{"port": 8080}],
    }
    assert of_kind(render(helm_env, "--set", "networkPolicy.enabled=false"), "NetworkPolicy") == []
    assert (
        of_kind(render(helm_env, *NP_ON, "--set", "deployment.enabled=false"), "NetworkPolicy")
        == []
    )


def test_an_outside_webhook_opens_no_webhook_port(helm_env: dict[str, str]) -> None:
    np = policy(
        render(
            helm_env,
            *NP_ON,
            "--set",
            "webhook.url=https://10.0.0.5:9443/x",
            "--set",
            "webhook.caBundle=QQ==",
        )
    )
    assert set(ingress_by_port(np)) == {8443}


# -- the ValidatingAdmissionPolicy --------------------------------------------------


VAP_SERVED = ["--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"]
NODE_POLICY = "node-maintenance-operator-node-changes"
LEASE_POLICY = "node-maintenance-operator-lease-changes"


def policies(docs: list[Doc]) -> list[str]:
    """The names of the rendered policies, each checked to have its binding."""
    names = sorted(d["metadata"]["name"] for d in of_kind(docs, "ValidatingAdmissionPolicy"))
    bound = sorted(
        d["spec"]["policyName"] for d in of_kind(docs, "ValidatingAdmissionPolicyBinding")
    )
    assert bound == names
    return names


@pytest.mark.parametrize(
    ("values", "rendered"),
    [
        # helm install and upgrade ask the server: on where it serves the API
        (VAP_SERVED, [LEASE_POLICY, NODE_POLICY]),
        # offline rendering knows only --api-versions: nothing to go on
        ([], []),
        (["--kube-version", "1.35.0"], []),
        # the values force them off, or on
        ([*VAP_SERVED, "--set", "nodePolicy.enabled=false"], [LEASE_POLICY]),
        ([*VAP_SERVED, "--set", "leasePolicy.enabled=false"], [NODE_POLICY]),
        ([*VAP_SERVED, "--set-string", "nodePolicy.enabled=false"], [LEASE_POLICY]),
        (["--set", "nodePolicy.enabled=true", "--set", "leasePolicy.enabled=true"],
         [LEASE_POLICY, NODE_POLICY]),
        (["--set", "leasePolicy.enabled=true"], [LEASE_POLICY]),
    ],
    ids=["served", "offline", "offline-1.35", "node-off", "lease-off", "node-off-string",
         "both-forced", "lease-forced"],
)  # fmt: skip
def test_policies_are_on_where_the_cluster_serves_them(
    helm_env: dict[str, str], values: list[str], rendered: list[str]
) -> None:
    """A stolen token of nmo's account is held to what nmo does wherever the API
    server can enforce it (issue 20): on by default, the values can force it off."""
    assert policies(render(helm_env, *values)) == rendered


@pytest.mark.parametrize(
    ("version", "newer"),
    [
        ("1.30.0", ()),
        ("1.31.0", ("runtimeHandlers",)),
        ("1.35.4", ("runtimeHandlers", "features", "declaredFeatures")),
    ],
)
def test_node_policy_keeps_every_status_field_the_server_has(
    helm_env: dict[str, str], version: str, newer: tuple[str, ...]
) -> None:
    """Every NodeStatus field but conditions is compared (images and config were
    not); a field newer than the server is not named (it would not compile)."""
    docs = render(helm_env, "--set", "nodePolicy.enabled=true", "--kube-version", version)
    vap = one(docs, "ValidatingAdmissionPolicy")
    (status_rule,) = [
        v["expression"] for v in vap["spec"]["validations"] if "volumesInUse" in v["expression"]
    ]
    fields = set(re.findall(r"object\.status\.\?(\w+) ==", status_rule))
    always = {"phase", "capacity", "allocatable", "addresses", "daemonEndpoints", "nodeInfo"}
    always |= {"volumesAttached", "volumesInUse", "images", "config"}
    assert fields == always | set(newer)


def test_node_policy_binds_nmos_service_account_only(helm_env: dict[str, str]) -> None:
    docs = render(helm_env, "--set", "nodePolicy.enabled=true", "--kube-version", "1.30.0")
    vap = one(docs, "ValidatingAdmissionPolicy")
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    assert vap["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"]["policyName"] == vap["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    (condition,) = vap["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{SA_USER}'"
    (rule,) = vap["spec"]["matchConstraints"]["resourceRules"]
    # nodes/status too: a status update can change labels and annotations, and
    # nmo patches it for its node lifecycle conditions (nodeConditions.enabled).
    assert (rule["apiGroups"], rule["resources"]) == ([""], ["nodes", "nodes/status"])
    assert vap["spec"]["failurePolicy"] == "Fail"
    text = str(vap["spec"])
    for allowed in (
        c.EXCLUDE_FROM_REMEDIATION_LABEL,
        *c.MAINTENANCE_TAINT_KEYS,
        *(f"'{t}'" for t in c.NODE_CONDITION_TYPES),
    ):
        assert allowed in text
    audit = render(
        helm_env,
        "--set",
        "nodePolicy.enabled=true",
        "--set",
        "nodePolicy.validationActions={Warn,Audit}",
    )
    assert one(audit, "ValidatingAdmissionPolicyBinding")["spec"]["validationActions"] == [
        "Warn",
        "Audit",
    ]


@pytest.mark.parametrize("value", ["nodePolicy.enabled", "leasePolicy.enabled"])
def test_a_forced_policy_needs_1_30(helm_env: dict[str, str], value: str) -> None:
    result = template(helm_env, "--set", f"{value}=true", "--kube-version", "1.29.9")
    assert result.returncode != 0
    assert f"{value}=true needs" in result.stderr and "Kubernetes 1.30 or newer" in result.stderr
    # auto stays quiet before 1.30: the API is not served, so there is no policy
    assert policies(render(helm_env, "--kube-version", "1.29.9")) == []


def test_lease_policy_binds_nmos_service_account_in_the_lease_namespace(
    helm_env: dict[str, str],
) -> None:
    docs = render(helm_env, *VAP_SERVED, "--set", "leasePolicy.validationActions={Warn,Audit}")
    vap = one(docs, "ValidatingAdmissionPolicy", "-lease-changes")
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "-lease-changes")
    assert vap["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"]["policyName"] == LEASE_POLICY
    assert binding["spec"]["validationActions"] == ["Warn", "Audit"]
    assert one(docs, "ValidatingAdmissionPolicyBinding", "-node-changes")["spec"][
        "validationActions"
    ] == ["Deny"]
    assert vap["spec"]["failurePolicy"] == "Fail"
    (rule,) = vap["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == (["coordination.k8s.io"], ["leases"])
    assert rule["operations"] == ["CREATE", "UPDATE", "DELETE"]
    user, namespace = vap["spec"]["matchConditions"]
    assert user["expression"] == f"request.userInfo.username == '{SA_USER}'"
    assert namespace["expression"] == f"request.namespace == '{c.LEASE_NAMESPACE_DEFAULT}'"
    text = str(vap["spec"])
    assert f"'{c.LEASE_HOLDER}'" in text and "fieldManager" in text
    # The lease namespace is the release's: the leader-election and budget Leases are not its.
    same = render(helm_env, *VAP_SERVED, "--set", f"leases.namespace={c.OPERATOR_NAMESPACE}")
    (_, namespace) = one(same, "ValidatingAdmissionPolicy", "-lease-changes")["spec"][
        "matchConditions"
    ]
    assert f"request.namespace == '{c.OPERATOR_NAMESPACE}'" in namespace["expression"]
    assert f"'{c.LEADER_ELECTION_ID}', '{LEDGER_NAME}'" in namespace["expression"]


# -- RBAC ----------------------------------------------------------------------------


def test_leader_election_role_names_its_leases(helm_env: dict[str, str]) -> None:
    role = one(render(helm_env), "Role", "-leader-election-role")
    named, create = role["rules"]
    assert named["resourceNames"] == [c.LEADER_ELECTION_ID, LEDGER_NAME]
    assert named["verbs"] == ["get", "update"]
    # RBAC cannot limit create by name: the request names no object.
    assert create == {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["create"],
    }


@pytest.mark.parametrize(
    ("values", "may_create"),
    [
        ([], False),
        (["--set", "leases.createNamespace=false"], True),
        (
            [
                "--set",
                "leases.createNamespace=false",
                "--set",
                f"leases.namespace={c.OPERATOR_NAMESPACE}",
            ],
            False,
        ),
    ],
    ids=["chart creates it", "nmo creates it", "release namespace"],
)
def test_namespace_create_only_when_the_chart_does_not(
    helm_env: dict[str, str], values: list[str], may_create: bool
) -> None:
    docs = render(helm_env, *values)
    manager = one(docs, "ClusterRole", "-manager-role")
    granted = [r for r in manager["rules"] if "namespaces" in r.get("resources", [])]
    assert granted == (
        [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["create"]}]
        if may_create
        else []
    )
    chart_namespaces = [d["metadata"]["name"] for d in of_kind(docs, "Namespace")]
    assert (c.LEASE_NAMESPACE_DEFAULT in chart_namespaces) == (values == [])


@pytest.mark.parametrize(
    ("values", "verbs"),
    [
        ([], ["list", "watch"]),
        (["--set", "drain.allowPodDeletion=false"], ["list", "watch"]),
        (["--set", "drain.allowPodDeletion=true"], ["list", "watch", "delete"]),
        (
            ["--set", "drain.allowPodDeletion=true", "--set", "drain.onTimeout=Delete"],
            ["list", "watch", "delete"],
        ),
    ],
    ids=["default", "off", "on", "on-with-operator-wide-delete"],
)
def test_pod_deletion_only_with_allow_pod_deletion(
    helm_env: dict[str, str], values: list[str], verbs: list[str]
) -> None:
    """onTimeout Delete's permission: delete on pods, and nothing else, with the value."""
    manager = one(render(helm_env, *values), "ClusterRole", "-manager-role")
    pods = [r for r in manager["rules"] if r.get("resources") == ["pods"]]
    assert pods == [{"apiGroups": [""], "resources": ["pods"], "verbs": verbs}]
    default = one(render(helm_env), "ClusterRole", "-manager-role")
    others = [r for r in manager["rules"] if r.get("resources") != ["pods"]]
    assert others == [r for r in default["rules"] if r.get("resources") != ["pods"]]


def test_node_status_patch_only_with_node_conditions(helm_env: dict[str, str]) -> None:
    """--node-conditions' permission: patch on nodes/status, and nothing else, with the value."""
    default = one(render(helm_env), "ClusterRole", "-manager-role")
    on = one(
        render(helm_env, "--set", "nodeConditions.enabled=true"), "ClusterRole", "-manager-role"
    )
    status = [r for r in on["rules"] if r.get("resources") == ["nodes/status"]]
    assert status == [{"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]
    assert [r for r in on["rules"] if r not in status] == default["rules"]
    assert not any("nodes/status" in r.get("resources", []) for r in default["rules"])


@pytest.mark.parametrize("value", ["onTimeout", "maxAction"])
def test_operator_wide_delete_needs_allow_pod_deletion(
    helm_env: dict[str, str], value: str
) -> None:
    result = template(helm_env, "--set", f"drain.{value}=Delete")
    assert result.returncode != 0
    assert f"drain.{value}=Delete deletes the pods left" in result.stderr, result.stderr
    assert "set drain.allowPodDeletion=true" in result.stderr, result.stderr
    allowed = ("--set", "drain.allowPodDeletion=true")
    assert template(helm_env, "--set", f"drain.{value}=Delete", *allowed).returncode == 0
    assert template(helm_env, "--set", "drain.allowPodDeletion=yes").returncode != 0  # schema


# -- schema ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ("webhook.matchConditions=maybe", "matchConditions"),
        ("webhook.updateFailurePolicy=Never", "updateFailurePolicy"),
        ("networkPolicy.apiServer.cidrs={10.0.0.1}", "cidrs"),
        ("networkPolicy.probesFrom={nodes}", "probesFrom"),
        ("networkPolicy.dns.ports[0].port=0", "dns"),
        ("nodePolicy.validationActions={Deny,Warn}", "validationActions"),
        ("nodePolicy.validationActions={Block}", "validationActions"),
        ("nodePolicy.enabled=maybe", "nodePolicy"),
        ("leasePolicy.enabled=maybe", "leasePolicy"),
        ("leasePolicy.validationActions={Block}", "validationActions"),
    ],
)
def test_schema_refuses(helm_env: dict[str, str], value: str, where: str) -> None:
    result = template(helm_env, "--set", value)
    assert result.returncode != 0
    assert where in result.stderr, result.stderr


# -- the documentation -------------------------------------------------------------


def test_documented_values_exist() -> None:
    """Every value docs/install.md names for these features is a key of values.yaml."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    text = (ROOT / "docs" / "install.md").read_text()
    prefixes = "|".join(
        ("networkPolicy", "nodePolicy", "leasePolicy", "webhook", "openshift", "leases")
    )
    # Not the start of a longer dotted name: leases.coordination.k8s.io is an API group.
    named = set(re.findall(rf"(?<![\w./-])((?:{prefixes})(?:\.[A-Za-z]+)+)(?![\w/-]|\.\w)", text))
    assert {
        "networkPolicy.apiServer.cidrs",
        "nodePolicy.validationActions",
        "nodePolicy.enabled",
        "leasePolicy.enabled",
    } <= named
    for path in sorted(named):
        node: Any = values
        for key in path.split("."):
            assert isinstance(node, dict) and key in node, f"docs/install.md names {path}"
            node = node[key]


# -- the Go NMO's selector label -------------------------------------------------


@pytest.mark.parametrize("values", [[], OPENSHIFT, ["--set", "deployment.replicas=1"]])
def test_the_operator_pod_carries_the_go_nmo_label(
    helm_env: dict[str, str], values: list[str]
) -> None:
    """``kubectl get pods -l node-maintenance-operator=`` (scripts, the Go NMO's e2e
    suite) finds the operator pod; the selector stays as it was (it is immutable)."""
    deployment = one(render(helm_env, *values), "Deployment", "-controller-manager")
    assert deployment["spec"]["template"]["metadata"]["labels"]["node-maintenance-operator"] == ""
    assert deployment["metadata"]["labels"]["node-maintenance-operator"] == ""
    assert "node-maintenance-operator" not in deployment["spec"]["selector"]["matchLabels"]
