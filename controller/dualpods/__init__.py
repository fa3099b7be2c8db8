"""The dual-pods controller: binds server-requesting Pods to launcher-run inference servers (see controller.py)."""
