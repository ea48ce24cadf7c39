"""The kernel envelopes of the action classes: namespaces, Landlock, seccomp, fs policy."""
