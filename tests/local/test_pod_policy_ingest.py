"""A pod's policy applied by the real daemon to real csplice records (pods/policy.py, ingest.py): the record's
container as csplice records it from a runtime's bundle, the pod's labels and annotations from an API server
over TLS with a service-account token (pods/apiserver.py) as a pod asks it. `full` is ingested as ever, with the
decision and the chosen labels in the record; `metadata` keeps the record without its core; `none` keeps
nothing and is counted."""

from __future__ import annotations

import http.server
import json
import ssl
import subprocess
import threading

import pytest

from corehandler import nocore, spool
from corehandler.config import KubernetesConfig
from corehandler.daemon import Settings
from corehandler.observe.crashlog import crash_fields
from corehandler.observe.metrics import MetricsObserver
from corehandler.pods import apiserver
from corehandler.store.index import Store
from support.daemon_harness import Recorder, Running, sample, wait_for
from support.spoolfeed import feed, write_settings

TOKEN = "eyJ-test-token"
PODS = {  # namespace/name -> the API's pod
    "web/cart": {"metadata": {"uid": "11111111-2222-3333-4444-555555555555", "annotations": {"x": "y"},
                              "labels": {"team": "blue\x1b[2J", "app.kubernetes.io/name": "cart", "tier": "t"}}},
    "web/quiet": {"metadata": {"uid": "u-quiet", "annotations": {"corehandler.io/core": "none"}, "labels": {}}},
    "web/renamed": {"metadata": {"uid": "a-newer-pod-by-that-name", "labels": {"team": "red"}}},
}


class _Api(http.server.BaseHTTPRequestHandler):
    asked: list = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.asked.append((self.path, self.headers.get("Authorization")))
        parts = self.path.split("/")  # /api/v1/namespaces/NS/pods/NAME
        pod = PODS.get(f"{parts[4]}/{parts[6]}") if len(parts) == 7 else None
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            pod, code = None, 401
        else:
            code = 200 if pod else 404
        body = json.dumps(pod or {"kind": "Status"}).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def api(tmp_path):
    """An API server on 127.0.0.1 with a certificate of its own CA, and the pod's token and CA files."""
    account = tmp_path / "account"
    account.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=kubernetes", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(tmp_path / "key"),
                    "-out", str(account / "ca.crt")], check=True, capture_output=True)
    (account / "token").write_text(TOKEN + "\n")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(account / "ca.crt", tmp_path / "key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Api.asked = []
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.server_address[1])}
    yield apiserver.PodLookup.in_cluster(env, account)
    server.shutdown()


def in_pod(spool_dir, record, namespace, name, uid=None, core=None):
    """The record as csplice writes it for a process in a pod's container (its bundle's annotations)."""
    notes = {"io.kubernetes.cri.sandbox-namespace": namespace, "io.kubernetes.cri.sandbox-name": name,
             "io.kubernetes.cri.container-name": "app"}
    if uid:
        notes["io.kubernetes.cri.sandbox-uid"] = uid
    if core is not None:
        notes["corehandler.io/core"] = core
    record["proc"]["container"] = {"id": "ab" * 32, "runtime": "containerd", "annotations": notes}
    spool.rewrite_record(spool_dir, record)
    return record["id"]


def test_full_metadata_and_none_as_the_namespace_the_default_and_the_pod_decide(tmp_path, feeder, csplice, api):
    state = tmp_path / "state"
    spool_dir = state / "spool"
    spool_dir.mkdir(parents=True, mode=0o700)
    settings = write_settings(tmp_path / "s.conf", spool_dir)
    crashes = {}
    for pid, (namespace, name, uid, core) in enumerate([
            ("web", "cart", "11111111-2222-3333-4444-555555555555", None),  # full, labels from the API
            ("web", "quiet", None, None),                  # the API's annotation: none
            ("web", "bundled", None, "none"),              # the bundle's annotation (Podman, containerd)
            ("payments", "pay", None, None),               # its namespace: metadata
            ("payments", "greedy", None, "full"),          # narrow: cannot keep more than its namespace
            ("web", "typo", None, "nope"),                 # not a policy: the default, and a warning
            ("web", "renamed", "the-crashed-pods-uid", None),  # another pod by that name now: no labels
            ("web", "gone", None, None),                   # deleted since: 404, the default
    ], start=300):
        record = feed(feeder, csplice, settings, size=1 << 20, pid=pid)
        crashes[name] = in_pod(spool_dir, record, namespace, name, uid, core)
    host = feed(feeder, csplice, settings, size=1 << 20, pid=399)["id"]  # no pod: the policy does not apply

    config = KubernetesConfig(metadata_namespaces=["payments"], pod_labels=["team", "app.kubernetes.io/name"],
                              api=True)
    metrics, rec = MetricsObserver(), Recorder()
    with Running(Settings(state, level=1, threads=1, sweep_interval=3600, analysis_enabled=False, mini_core=None,
                          pods=config, pod_lookup=api), [rec, metrics]):
        wait_for(lambda: not spool.committed_ids(spool_dir), what="the spool drained")
    with Store(state) as s:
        rows = {d.id: d for d in s.all()}

    # none: nothing of it anywhere but the count
    assert crashes["quiet"] not in rows and crashes["bundled"] not in rows
    assert not [p for p in spool_dir.iterdir() if p.suffix in (".core", ".json")]
    assert sample(metrics, "corehandler_crashes_excluded_total", source="annotation") == 2
    assert sample(metrics, "corehandler_crashes_excluded_total") == 2

    cart = rows[crashes["cart"]]
    assert cart.status == "ok" and cart.path
    assert cart.record["kubernetes"] == {"core": "full", "core_source": "default",
                                         "pod_labels": {"team": "blue\x1b[2J", "app.kubernetes.io/name": "cart"}}
    line = crash_fields(cart.record, {"id": cart.id, "status": "ok", "analysis": {"identity": {
        "pod_namespace": "web", "pod_name": "cart"}}}, "node-1")
    assert line["pod_labels"] == {"team": "blue\\x1b[2J", "app.kubernetes.io/name": "cart"}  # escaped for the log
    assert line["core_policy"] == "full"

    for name in ("pay", "greedy"):
        meta = rows[crashes[name]]
        assert (meta.status, meta.path, meta.problem) == ("dropped", None, "dump dropped: pod_policy")
        assert meta.record["kubernetes"]["core_source"] == "namespace" and meta.record["core"] is None
        assert "its namespace's setting" in nocore.explain(meta.record)["why"]
    assert rows[crashes["typo"]].status == "ok" and rows[crashes["typo"]].record["kubernetes"]["core"] == "full"
    assert "pod_labels" not in rows[crashes["renamed"]].record["kubernetes"]
    assert rows[crashes["gone"]].record["kubernetes"] == {"core": "full", "core_source": "default"}
    assert rows[host].status == "ok" and "kubernetes" not in rows[host].record
    # Each pod asked once (its labels), with the token.
    assert all(auth == f"Bearer {TOKEN}" for _, auth in _Api.asked)
    assert sorted(p.rsplit("/", 1)[1] for p, _ in _Api.asked) == sorted(
        ["cart", "quiet", "bundled", "pay", "greedy", "typo", "renamed", "gone"])


def test_without_a_token_there_is_no_lookup(tmp_path):
    assert apiserver.PodLookup.in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, tmp_path) is None
    assert apiserver.PodLookup.in_cluster({}, tmp_path) is None


def test_an_unreachable_or_refusing_api_server_is_no_answer(tmp_path, api):
    (api.token_file).write_text("a-revoked-token")
    assert api.pod("web", "cart") is None  # 401
    dead = apiserver.PodLookup("https://127.0.0.1:9", api.token_file, api.ca_file, timeout=1)
    assert dead.pod("web", "cart") is None
