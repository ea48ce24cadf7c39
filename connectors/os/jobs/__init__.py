"""Deferred jobs inside the connector: the job store and the runner that schedules them."""
