"""Small programs that the loopback cluster's tests run inside Pods (see e2e/kubelet/images.yaml)."""
