"""What the CLI prints to a terminal: program output made harmless to the terminal."""

from __future__ import annotations

import re

# Control characters other than newline and tab: an action's output or a log field must
# not be able to move the cursor, retitle the window or inject keystrokes.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str, tty: bool) -> str:
    """``text`` with control characters shown as escapes when it goes to a terminal."""
    if not tty:
        return text
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
