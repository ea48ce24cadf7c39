"""Request/reply over ZeroMQ: ROUTER servers, DEALER clients, ``request/id`` correlation.

Every socket has ``LINGER=0``, explicit high-water marks and a message-size cap;
every call has a finite timeout; a late or duplicate reply is dropped, never
delivered to the wrong caller; a peer that disappears fails its in-flight calls at
once instead of letting them wait out their timeouts.
"""
