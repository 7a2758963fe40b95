"""What a crash in a pod keeps: `full` (the core), `metadata` (the record without its core) or `none` (nothing: no
record, no row, counted in corehandler_crashes_excluded_total). Pure functions of the config, the dump's identity
and the pod's metadata; ingest.py applies the decision before the core is validated, analysed or compressed.

Who decides, for a dump whose identity names a pod (analysis/identity.py: the runtime's bundle, which csplice
read while the process existed):
  1. the chart's values, as [kubernetes]: the pod's namespace in full_namespaces, metadata_namespaces or
     none_namespaces, else `core` (the global default);
  2. the pod's annotation `corehandler.io/core: full|metadata|none`, from the bundle where the runtime passes pod
     annotations (csplice keeps this one), else from the API server's pod ([kubernetes] api). pod_annotation
     says what it may do: `narrow` (the default) only keeps less than step 1 (an opt-out), `any` also more (an
     opt-in), `ignore` nothing.
The annotation is the pod owner's text: a value that is not one of the three is step 1's choice and a warning.
It chooses among the three outcomes only: no path, size or budget; capture's limits, the store's retention and
the fleet budget apply to a `full` dump as to any other. Processes outside pods (no namespace in the identity)
are not the policy's: they keep what capture kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from corehandler.printable import display

ANNOTATION = "corehandler.io/core"
FULL, METADATA, NONE = "full", "metadata", "none"
_RANK = {NONE: 0, METADATA: 1, FULL: 2}
# Why a dump kept no core, as the record's capture.dropped_reason says it (nocore.py explains it).
DROPPED_REASON = "pod_policy"
# Kubernetes label values are at most 63 characters; a longer one (from a fake API) is cut there.
MAX_LABEL_VALUE = 63
# An annotation value longer than this is not a policy: shown cut in the warning.
MAX_SHOWN = 64


@dataclasses.dataclass(frozen=True)
class Decision:
    keep: str                 # full, metadata or none
    source: str               # default, namespace or annotation
    annotation: str | None    # the pod's annotation as found (None: none)
    warning: str | None = None

    def section(self, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The record's `kubernetes` section: the decision and the pod labels the config chose."""
        out: dict[str, Any] = {"core": self.keep, "core_source": self.source}
        if labels:
            out["pod_labels"] = dict(labels)
        return out


def namespace_setting(config, namespace: str | None) -> tuple[str, str]:
    """(keep, source) from the config alone: the namespace's list, else the global default."""
    for keep in (NONE, METADATA, FULL):
        if namespace and namespace in getattr(config, f"{keep}_namespaces"):
            return keep, "namespace"
    return config.core, "default"


def decide(config, namespace: str | None, annotation: Any) -> Decision:
    """The decision for a crash in a pod of namespace whose corehandler.io/core annotation is annotation (None:
    the pod has none, or it is not known)."""
    keep, source = namespace_setting(config, namespace)
    if annotation is None or config.pod_annotation == "ignore":
        return Decision(keep, source, None if annotation is None else str(annotation))
    value = annotation.strip().lower() if isinstance(annotation, str) else None
    if value not in _RANK:
        shown = display(str(annotation)[:MAX_SHOWN])
        return Decision(keep, source, str(annotation), warning=f"annotation {ANNOTATION}={shown!r} is not full, "
                        f"metadata or none: {keep} ({source}) applies")
    if config.pod_annotation == "any" or _RANK[value] < _RANK[keep]:
        return Decision(value, "annotation", value)
    return Decision(keep, source, value)


def chosen_labels(labels: Any, keys: list[str]) -> dict[str, str]:
    """The pod's labels the config names, string values only, each cut to MAX_LABEL_VALUE characters."""
    if not isinstance(labels, Mapping):
        return {}
    return {key: labels[key][:MAX_LABEL_VALUE] for key in keys if isinstance(labels.get(key), str)}
