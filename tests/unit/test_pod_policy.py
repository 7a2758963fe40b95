"""What a crash in a pod keeps (corehandler/pods/policy.py): the namespace's setting or the default, and what the
pod's own annotation may change of it; the config that holds them refuses what Kubernetes would."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from corehandler.config import KubernetesConfig
from corehandler.pods import policy

CONFIG = KubernetesConfig(core="full", metadata_namespaces=["payments"], none_namespaces=["secrets"],
                          full_namespaces=["debug"])


@pytest.mark.parametrize("namespace, annotation, mode, keep, source", [
    ("web", None, "narrow", "full", "default"),
    ("payments", None, "narrow", "metadata", "namespace"),
    ("secrets", None, "narrow", "none", "namespace"),
    ("web", "none", "narrow", "none", "annotation"),          # an opt-out
    ("web", "metadata", "narrow", "metadata", "annotation"),
    ("payments", "full", "narrow", "metadata", "namespace"),   # a pod may not keep more than its namespace
    ("payments", "none", "narrow", "none", "annotation"),
    ("secrets", "full", "any", "full", "annotation"),          # unless the admin lets it
    ("web", "none", "ignore", "full", "default"),
    ("web", " None\n", "narrow", "none", "annotation"),       # as kubectl annotate may leave it
    ("debug", "metadata", "narrow", "metadata", "annotation"),
])
def test_the_namespace_or_default_then_what_the_annotation_may_change(namespace, annotation, mode, keep, source):
    config = CONFIG.model_copy(update={"pod_annotation": mode})
    decision = policy.decide(config, namespace, annotation)
    assert (decision.keep, decision.source, decision.warning) == (keep, source, None)


@pytest.mark.parametrize("annotation", ["", "core", "../../etc/passwd", "full;none", "\x1b[2Jnone", "x" * 5000, 7])
def test_an_unknown_annotation_is_the_namespaces_setting_and_a_warning_with_its_value_escaped(annotation):
    decision = policy.decide(CONFIG, "payments", annotation)
    assert (decision.keep, decision.source) == ("metadata", "namespace")
    assert decision.warning.startswith("annotation corehandler.io/core=") and "\x1b" not in decision.warning
    assert len(decision.warning) < 200


def test_the_recorded_labels_are_the_configured_keys_only_bounded():
    labels = {"team": "blue", "app.kubernetes.io/name": "cart", "other": "x", "long": "y" * 300, "num": 3}
    assert policy.chosen_labels(labels, ["team", "app.kubernetes.io/name", "long", "num", "absent"]) == \
        {"team": "blue", "app.kubernetes.io/name": "cart", "long": "y" * 63}
    assert policy.chosen_labels(None, ["team"]) == {} and policy.chosen_labels(["team"], ["team"]) == {}
    assert policy.decide(CONFIG, "web", None).section({"team": "blue"}) == \
        {"core": "full", "core_source": "default", "pod_labels": {"team": "blue"}}


@pytest.mark.parametrize("bad", [
    {"core": "some"}, {"pod_annotation": "raise"}, {"none_namespaces": ["Kube_System"]},
    {"none_namespaces": ["web"], "full_namespaces": ["web"]}, {"pod_labels": ["bad key!"]},
    {"pod_labels": [f"k{i}" for i in range(17)]}, {"pod_labels": ["-a/b"]}, {"metadata_namespaces": ["a" * 64]},
])
def test_the_config_refuses_what_kubernetes_would(bad):
    with pytest.raises(ValidationError):
        KubernetesConfig.model_validate(bad)


def test_label_keys_with_a_prefix_are_accepted():
    assert KubernetesConfig(pod_labels=["app.kubernetes.io/name", "team", "a_b.c-d"]).pod_labels[0] == \
        "app.kubernetes.io/name"
