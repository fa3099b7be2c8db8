"""The loopback cluster: a real Kubernetes control plane (1.35 by default; e2e/cluster/kubernetes/) on 127.0.0.1
plus the loopback kubelet.

`python -m e2e.cluster up|down|status|lose-node|add-node --state-dir DIR`; tests use `e2e.fixtures`.
"""
