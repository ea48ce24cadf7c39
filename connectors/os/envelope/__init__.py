"""From a directive to an envelope: argv rendering, class rules, the sandbox plan of
one invocation, and what this host can enforce (probe, canaries, doctor)."""
