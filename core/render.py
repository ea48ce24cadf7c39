"""JSON-e rendering of a flow step's parameters, bounded and off core's event loop.

A template is caller input, and a few hundred bytes of ``$map`` over ``range`` can
take minutes: rendered on the loop, it would starve every other request and get
core killed by its watchdog, again on each restart. So templates render in a small
worker process (``python -m sensorium.core.render``), one at a time, each within a
budget of render *steps* (``core/renderbudget.py``: counted work, so a template fails
the same way on every machine) and under an address-space cap; a template past its
budget fails its step ``flow-invalid``. A wall-clock timeout (far above what the
step budget takes) stays only as a last-resort net: a render that overruns it is
killed with its worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import struct
import sys
from typing import Any

import msgspec

from sensorium.core.renderbudget import Budget, BudgetExceeded, install
from sensorium.shared.config import Limits
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError

# Defaults from the one place they live (limits.flow_render_*): the step budget
# decides; the timeout is the last-resort net only.
_LIMITS = Limits()
WORKER_MAX_BYTES = 512 * 1024 * 1024
_HEADER = struct.Struct(">I")


class Renderer:
    def __init__(
        self,
        timeout_s: float = _LIMITS.flow_render_timeout_s,
        budget_steps: int = _LIMITS.flow_render_budget_steps,
    ) -> None:
        self.timeout_s = timeout_s
        self.budget_steps = budget_steps
        self._worker: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return (
            f"<Renderer budget={self.budget_steps} steps timeout={self.timeout_s}s "
            f"worker={self._worker and self._worker.pid}>"
        )

    async def render(self, step_id: str, template: Any, context: dict[str, Any]) -> Any:
        request = msgspec.msgpack.encode([template, context, self.budget_steps])
        async with self._lock:
            try:
                ok, value = await asyncio.wait_for(self._ask(request), self.timeout_s)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, msgspec.DecodeError):
                await self._kill()
                raise CodedError(
                    RuntimeErrorCode.FLOW_INVALID,
                    f"step {step_id!r}: its parameters template did not render within "
                    f"{self.timeout_s:g} s and {WORKER_MAX_BYTES >> 20} MiB",
                ) from None
        if not ok:
            raise CodedError(
                RuntimeErrorCode.FLOW_INVALID,
                f"step {step_id!r}: its parameters template does not render: {value}",
            )
        return value

    async def _ask(self, request: bytes) -> tuple[bool, Any]:
        if self._worker is None or self._worker.returncode is not None:
            self._worker = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "sensorium.core.render",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
        worker = self._worker
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdin.write(_HEADER.pack(len(request)) + request)
        await worker.stdin.drain()
        (size,) = _HEADER.unpack(await worker.stdout.readexactly(_HEADER.size))
        ok, value = msgspec.msgpack.decode(await worker.stdout.readexactly(size))
        return bool(ok), value

    async def _kill(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None and worker.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                worker.kill()
            await worker.wait()

    async def close(self) -> None:
        await self._kill()


def _serve() -> None:
    """The worker: length-prefixed msgpack ``[template, context, budget]`` in,
    ``[ok, value]`` out."""
    import jsone

    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MAX_BYTES, WORKER_MAX_BYTES))
    budget = Budget(0)  # every request sets its own limit
    install(budget)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while head := stdin.read(_HEADER.size):
        (size,) = _HEADER.unpack(head)
        template, context, steps = msgspec.msgpack.decode(stdin.read(size))
        budget.reset(int(steps))
        try:
            reply: list[Any] = [True, jsone.render(template, context)]
        except BudgetExceeded as exc:
            reply = [False, str(exc)]
        except (
            jsone.JSONTemplateError,
            RecursionError,
            TypeError,
            ValueError,
            ArithmeticError,
        ) as exc:
            reply = [False, f"{exc!s:.300}"]
        except MemoryError:
            reply = [False, f"it needs more than {WORKER_MAX_BYTES >> 20} MiB"]
        try:
            body = msgspec.msgpack.encode(reply)
        except (TypeError, OverflowError) as exc:  # a value msgpack cannot carry
            body = msgspec.msgpack.encode([False, f"its result cannot be encoded: {exc}"])
        stdout.write(_HEADER.pack(len(body)) + body)
        stdout.flush()


if __name__ == "__main__":
    _serve()
