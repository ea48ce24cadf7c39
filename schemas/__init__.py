"""JSON Schemas (2020-12) for every wire message and operator-written file."""
