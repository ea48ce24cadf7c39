"""The OS connector (``sensorium-os``): the only process that spawns programs.

It knows processes, files, sockets, bytes and time — never a program.
"""
