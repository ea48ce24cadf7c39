"""The one build step pyproject.toml cannot declare: the sandbox's compiled exec stage.

``connectors/os/run/sandbox/exec_stage.c`` (with ``reaper.c``, the parked sandbox's
init) becomes ``sensorium-exec-stage`` beside ``execstage.py`` (statically linked
where the C library allows, so its exec loads nothing). Without a C compiler, or off
Linux, the package still installs and parked sandboxes take the Python path; the
build says so.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "connectors" / "os" / "run" / "sandbox" / "exec_stage.c"
# The parked sandbox's init: the same program run as `reap <pid>`, or `park` from its start.
SOURCES = [SOURCE, SOURCE.with_name("reaper.c"), SOURCE.with_name("park.c")]
NAME = "sensorium-exec-stage"
INSTALLED = Path("sensorium", "connectors", "os", "run", "sandbox", NAME)


def compile_stage(out: Path) -> bool:
    # Never a stale one: a build that cannot compile ships none (a build dir persists).
    out.unlink(missing_ok=True)
    cc = shlex.split(os.environ.get("CC", ""))
    if not cc and (found := shutil.which("cc") or shutil.which("gcc")):
        cc = [found]
    if not sys.platform.startswith("linux") or not cc:
        print(f"sensorium: no C compiler: {NAME} not built (Python exec path)", file=sys.stderr)
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    errors = ""
    for link in (["-static"], []):
        try:
            done = subprocess.run(
                [*cc, "-O2", "-Wall", "-s", *link, "-o", str(out), *map(str, SOURCES)],
                capture_output=True,
                text=True,
                check=False,
            )
        except OSError as exc:
            errors = str(exc)
            break
        if done.returncode == 0:
            return True
        errors = done.stderr
    print(f"sensorium: {NAME} not built (Python exec path):\n{errors}", file=sys.stderr)
    return False


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            compile_stage(SOURCE.with_name(NAME))  # the source tree is the package
        else:
            compile_stage(Path(self.build_lib) / INSTALLED)


class BinaryDistribution(Distribution):
    """A wheel with a compiled program is for this platform only."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": BuildPy}, distclass=BinaryDistribution)
