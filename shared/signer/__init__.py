"""The scoped signer grant's wire: what an action's helper and core's signer say, and
exactly which bytes are signed. Standard library only: the helper runs in the sandbox."""
