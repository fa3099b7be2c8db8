"""The loopback kubelet: plays the kubelet of fake GPU Nodes and runs their Pods as local process groups.

A fake only because no container runtime and no GPU exist on the development machines; everything it
talks to (the API server, the scheduler, the controllers) is real. See `kubelet.py` for the process.
"""
