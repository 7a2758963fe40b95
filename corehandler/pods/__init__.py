"""Kubernetes pods: what a crash in a pod keeps (policy.py) and the pod's metadata from the API server
(apiserver.py)."""
