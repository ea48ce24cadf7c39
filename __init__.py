"""Sensorium: a node-local enaction runtime.

The import namespace maps the repository's top-level folders: ``sensorium.core``,
``sensorium.connectors.os``, ``sensorium.poller``, ``sensorium.supervisor``,
``sensorium.client`` and ``sensorium.shared``.
"""

__version__ = "0.1.0"
