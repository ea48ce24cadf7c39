"""Running an envelope: the spawn under the baseline and its capture (launcher, the
sandbox mechanisms), the start journal, keyed attempts, and the outcome of a spawn."""
