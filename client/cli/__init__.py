"""The ``sensorium`` command: one module per subcommand, whose docstring is its help."""
