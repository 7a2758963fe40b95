"""A crashed pod's annotations and labels from the Kubernetes API server: GET /api/v1/namespaces/NS/pods/NAME with
the pod's service-account token ([kubernetes] api; the chart's ClusterRole allows `get` on pods and nothing
else). The API server is what every node already talks to (the kubelet does); no other network is asked.

A lookup is bounded (a timeout, a response read to MAX_BYTES) and cached for TTL seconds per pod, misses too;
a pod recreated under the same name is another pod: the answer counts only if its uid is the crashed pod's
(when the runtime's bundle named it). Any failure is None and a warning: the policy then has the namespace's
setting, and the dump is ingested as ever. The token is read at every request (kubelet rotates it)."""

from __future__ import annotations

import json
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corehandler.printable import display

log = logging.getLogger("corehandler.pods")

ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_BYTES = 4 << 20
TIMEOUT = 3.0
TTL = 60.0
CACHE_MAX = 512


class PodLookup:
    def __init__(self, base_url: str, token_file: Path, ca_file: Path | None, *, timeout: float = TIMEOUT,
                 ttl: float = TTL, clock=time.monotonic):
        self.base_url, self.token_file, self.ca_file = base_url.rstrip("/"), token_file, ca_file
        self.timeout, self.ttl, self.clock = timeout, ttl, clock
        self._cache: dict[tuple[str, str], tuple[float, dict | None]] = {}
        self._lock = threading.Lock()

    @classmethod
    def in_cluster(cls, environ: Mapping[str, str] = os.environ, account_dir: Path = ACCOUNT_DIR) -> PodLookup | None:
        """The lookup as a pod makes it (KUBERNETES_SERVICE_HOST/PORT, the mounted token and CA); None, with a
        warning, where there is no API server or token to ask."""
        host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT", "443")
        token = account_dir / "token"
        if not host or not token.exists():
            log.warning("[kubernetes] api is on, but %s: pods' annotations come from their bundles only, and no "
                        "labels are recorded", "no API server is known (KUBERNETES_SERVICE_HOST)" if not host
                        else f"there is no service-account token ({token}; the chart's podLookup mounts it)")
            return None
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", token, account_dir / "ca.crt")

    def pod(self, namespace: str, name: str, uid: str | None = None) -> dict | None:
        """{"annotations": {...}, "labels": {...}} of the pod, or None (no such pod, another pod by that name,
        no answer)."""
        key = (namespace, name)
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
        if hit is None or now - hit[0] > self.ttl:
            hit = (now, self._fetch(namespace, name))
            with self._lock:
                if len(self._cache) >= CACHE_MAX:
                    self._cache.clear()
                self._cache[key] = hit
        found = hit[1]
        if found is None or (uid and found["uid"] and found["uid"] != uid):
            return None
        return found

    def _fetch(self, namespace: str, name: str) -> dict | None:
        where = f"pod {display(namespace)}/{display(name)}"
        url = (f"{self.base_url}/api/v1/namespaces/{urllib.parse.quote(namespace, safe='')}/pods/"
               f"{urllib.parse.quote(name, safe='')}")
        try:
            token = self.token_file.read_text().strip()
            request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}",
                                                           "Accept": "application/json"})
            context = ssl.create_default_context(cafile=str(self.ca_file)) if url.startswith("https:") else None
            with urllib.request.urlopen(request, timeout=self.timeout, context=context) as answer:
                data = answer.read(MAX_BYTES + 1)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                log.info("No %s in the API server (deleted since its crash?): its namespace's setting applies",
                         where)
            else:
                log.warning("The API server answered %s for %s%s: its namespace's setting applies", e.code, where,
                            " (the service account may not get pods: the chart's podLookup grants it)"
                            if e.code in (401, 403) else "")
            return None
        except (OSError, ValueError) as e:
            log.warning("Cannot ask the API server for %s: %s; its namespace's setting applies", where,
                        display(str(getattr(e, "reason", None) or e)))
            return None
        return _metadata(data, where)


def _metadata(data: bytes, where: str) -> dict | None:
    try:
        if len(data) > MAX_BYTES:
            raise ValueError(f"over {MAX_BYTES} bytes")
        meta = json.loads(data).get("metadata")
        if not isinstance(meta, dict):
            raise ValueError("no metadata")
    except (ValueError, AttributeError) as e:
        log.warning("The API server's answer for %s is not a pod (%s)", where, display(str(e)))
        return None
    return {"uid": meta.get("uid") if isinstance(meta.get("uid"), str) else None,
            "annotations": _strings(meta.get("annotations")), "labels": _strings(meta.get("labels"))}


def _strings(found: Any) -> dict[str, str]:
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}
