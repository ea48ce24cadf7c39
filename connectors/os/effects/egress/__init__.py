"""C4 egress: the DNS stub and the byte-capped TCP relay for one action's network namespace."""
