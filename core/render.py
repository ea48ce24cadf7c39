"""JSON-e rendering of a flow step's parameters, bounded and off core's event loop.

A template is caller input, and a few hundred bytes of ``$map`` over ``range`` can
take minutes: rendered on the loop, it would starve every other request and get
core killed by its watchdog, again on each restart. So templates render in a small
worker process (``python -m sensorium.core.render``), one at a time, each within a
time budget and under an address-space cap; a render that overruns is killed with
its worker and the step fails ``flow-invalid``.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import struct
import sys
from typing import Any

import msgspec

from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError

RENDER_TIMEOUT_S = 2.0
WORKER_MAX_BYTES = 512 * 1024 * 1024
_HEADER = struct.Struct(">I")


class Renderer:
    def __init__(self, timeout_s: float = RENDER_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._worker: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"<Renderer timeout={self.timeout_s}s worker={self._worker and self._worker.pid}>"

    async def render(self, step_id: str, template: Any, context: dict[str, Any]) -> Any:
        request = msgspec.msgpack.encode([template, context])
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
    """The worker: length-prefixed msgpack ``[template, context]`` in, ``[ok, value]`` out."""
    import jsone

    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MAX_BYTES, WORKER_MAX_BYTES))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while head := stdin.read(_HEADER.size):
        (size,) = _HEADER.unpack(head)
        template, context = msgspec.msgpack.decode(stdin.read(size))
        try:
            reply: list[Any] = [True, jsone.render(template, context)]
        except (jsone.JSONTemplateError, RecursionError, TypeError, ValueError) as exc:
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
