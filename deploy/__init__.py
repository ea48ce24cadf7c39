"""Deploy units: systemd units and launchd plists, and the renderer behind ``install-units``."""
