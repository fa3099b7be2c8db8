"""The Kubernetes toolkit both controllers and the loopback cluster's kubelet stand on: the API client (rate-limited,
every request counted and timed), informers fed by one list/watch loop, a rate-limited work queue with its `Result`
contract, leader election, and the clock that tells a pass's own time from its waits. Nothing here knows dualpods'
objects: it imports only `api`.
"""
