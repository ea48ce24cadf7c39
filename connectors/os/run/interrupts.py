"""The sync actions running now, by directive: what core's stop may end at once.

Each sync spawn registers its process handles here under its directive id as well as
in the connector's set of everything running, so that ``sensorium.connector.interrupt``
can end exactly the directives core names, and their outcomes say so.
"""

from __future__ import annotations

from collections.abc import Iterator

from sensorium.connectors.os.run.spawning import Killable


class DirectiveHandles(set[Killable]):
    """One directive's handles; adding or removing one updates the connector's set too
    (``spawn`` keeps the set it is given current)."""

    def __init__(self, everything: set[Killable]) -> None:
        super().__init__()
        self._everything = everything

    def add(self, handle: Killable) -> None:
        super().add(handle)
        self._everything.add(handle)

    def discard(self, handle: object) -> None:
        super().discard(handle)
        self._everything.discard(handle)


class Interrupts:
    def __init__(self, everything: set[Killable]) -> None:
        self._everything = everything
        self._by_directive: dict[str, DirectiveHandles] = {}
        self.interrupted: set[str] = set()

    def handles_for(self, directive_id: str) -> DirectiveHandles:
        mine = DirectiveHandles(self._everything)
        self._by_directive[directive_id] = mine
        return mine

    def done(self, directive_id: str) -> bool:
        """Forget it; True when it was ended by an interrupt (its outcome says so)."""
        self._by_directive.pop(directive_id, None)
        if directive_id in self.interrupted:
            self.interrupted.discard(directive_id)
            return True
        return False

    def interrupt(self, directive_ids: tuple[str, ...], *, terminate: bool = False) -> int:
        """Kill the process groups of the named directives that run here now (SIGTERM
        them instead with ``terminate``: the caller SIGKILLs what is left later)."""
        ended = 0
        for d in directive_ids:
            handles = self._by_directive.get(d)
            if not handles:
                continue
            self.interrupted.add(d)
            for handle in list(handles):
                if terminate:
                    handle.terminate()
                else:
                    handle.kill()
            ended += 1
        return ended

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_directive)
