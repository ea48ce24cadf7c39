"""The node's deferred operations: the host registry, its policy and continuations.

Shared state of the node, not of one process: core reserves and confirms here,
the poller claims and records, the operator view reads it alone.
"""
