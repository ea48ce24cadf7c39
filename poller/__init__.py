"""The DeferredOperationPoller: drives long work under host-owned policy."""
