"""The supervisor: starts core, the OS connector and the poller, and keeps them running."""
