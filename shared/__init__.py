"""What every Sensorium process uses: wire messages, RPC, logging, state, config."""
