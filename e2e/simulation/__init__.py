"""Simulation processes: the requester and launcher roles the loopback kubelet runs for simulated Nodes' Pods."""
