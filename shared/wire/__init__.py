"""Wire messages: msgspec Structs, MessagePack on the wire, field names as the seeds spell them.

One module per channel (client API, connector seam, supervisor control) plus the
documents they carry (directive, outcome, declaration, module report). Every
Struct here has a JSON Schema in ``schemas/``; ``tests/unit/test_schemas.py``
proves the two agree.
"""
