"""The host signer boundary: the scoped signer grant of seed 048's ``signing`` block.

Core holds the signing keys (``keys.py``), registers exactly one bounded grant per
sync directive whose declaration has ``signing`` (``grants.py``), and answers the
action's helper over ``run/signer.sock`` (``server.py``); every grant, signature and
refusal is written to the audit store (``events.py``). The connector only hands the
action the channel; no action can read a key.
"""
