"""Connectors: the only processes that touch the operating system."""
