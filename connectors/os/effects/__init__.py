"""What a run leaves behind, decided after it: C3 writes committed, C5 artifacts
promoted, C4 egress relayed and transcribed."""
