"""The deploy units: systemd units that `systemd-analyze verify` accepts (system and --user),
launchd plists that start the real entry points, and `sensorium install-units`."""

from __future__ import annotations

import importlib
import os
import plistlib
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sensorium.deploy import units
from sensorium.shared.paths import default_state_dir

REPO = Path(__file__).resolve().parents[2]
SENSORIUM = [sys.executable, "-m", "sensorium.client.cli.main"]
SCRIPTS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def _verify(directory: Path, *, user: bool) -> None:
    """`systemd-analyze verify` on every file: no error and no warning about any of them
    (it checks that each ExecStart= program exists, so the units name real files)."""
    assert SYSTEMD_ANALYZE, "systemd-analyze is missing (.ci/run installs the systemd package)"
    runtime = directory / "runtime"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_LOG_LEVEL": "notice"}
    files = sorted(str(p) for p in directory.iterdir() if p.is_file())
    res = subprocess.run(
        [SYSTEMD_ANALYZE, *(["--user"] if user else []), "verify", *files],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert not [line for line in out.splitlines() if str(directory) in line], out


def _write(files: dict[str, bytes], directory: Path) -> None:
    directory.mkdir()
    for name, data in files.items():
        (directory / name).write_bytes(data)


@pytest.mark.parametrize(
    ("user", "custom_state"),
    [(False, False), (False, True), (True, False), (True, True)],
    ids=["system", "system-state-dir", "user", "user-state-dir"],
)
def test_rendered_systemd_units_pass_systemd_analyze_verify(
    tmp_path: Path, user: bool, custom_state: bool
) -> None:
    state = tmp_path / "state" if custom_state else None
    opts = units.Options("systemd", user, units.find_launcher(), state)
    files = units.render(opts)
    assert sorted(files) == sorted(units.names("systemd"))
    _write(files, tmp_path / "units")
    _verify(tmp_path / "units", user=user)


def test_without_console_scripts_the_units_run_python_m(tmp_path: Path) -> None:
    found = units.find_launcher()
    launcher = units.Launcher(Path(sys.executable), None, found.package_dir)
    files = units.render(units.Options("systemd", False, launcher))
    exec_start = _directives(files["sensorium-os.service"].decode())["ExecStart"]
    assert exec_start == f"{sys.executable} -m sensorium.connectors.os --state-dir %S/sensorium"
    _write(files, tmp_path / "units")
    _verify(tmp_path / "units", user=False)


def test_the_committed_units_are_what_install_units_writes_for_the_default_install() -> None:
    """One truth: rendered for /usr/local/bin and the default state, each unit is the
    committed file under a header, and each plist the committed job."""
    default = units.Launcher(
        Path("/usr/bin/python3"),
        Path(units.DEFAULT_BIN),
        Path("/usr/local/lib/python3/dist-packages/sensorium"),
    )
    systemd = units.render(units.Options("systemd", False, default))
    for name, data in systemd.items():
        body = data.decode().split("#\n", 1)[1]
        assert body == units.committed("systemd", name).decode(), name
    launchd = units.render(units.Options("launchd", False, default))
    for name, data in launchd.items():
        assert plistlib.loads(data) == plistlib.loads(units.committed("launchd", name)), name


def _directives(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def test_each_unit_is_a_supervised_notify_service_hardened_for_what_it_does() -> None:
    for p in units.PROCESSES:
        d = _directives(units.committed("systemd", p.unit).decode())
        assert d["Type"] == "notify" and d["WatchdogSec"] == "30s"
        assert d["Restart"] == "on-failure" and d["StartLimitBurst"] == "5"
        assert d["KillMode"] == "control-group"
        assert d["ExecReload"] == "/bin/kill -HUP $MAINPID"
        assert d["StateDirectory"] == "sensorium" and d["StateDirectoryMode"] == "0700"
        assert d["PartOf"] == units.TARGET and d["WantedBy"] == units.TARGET
        assert d["NoNewPrivileges"] == "yes"
        assert "MemoryDenyWriteExecute" not in d  # pynacl's cffi
        if p.script == "sensorium-os":
            # It makes namespaces and mounts, and may write wherever a C3 root says;
            # nothing hides or remounts /proc (an action's fresh procfs needs it whole).
            assert not {"ProtectSystem", "PrivateTmp", "ProtectHome"} & set(d)
            assert not {"ProtectKernelTunables", "ProtectKernelLogs", "ProtectProc"} & set(d)
            assert "ProcSubset" not in d
            # Exactly what an action's sandbox is made of.
            assert d["RestrictNamespaces"].split() == ["user", "mnt", "pid", "net", "ipc", "uts"]
            # Its sandboxes go through a user namespace: no CAP_SYS_ADMIN on the host.
            caps = set(d["CapabilityBoundingSet"].split())
            assert not {"CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_RESOURCE"} & caps
            assert {"CAP_SETUID", "CAP_SETGID", "CAP_SETFCAP"} <= caps  # the id maps
        else:
            assert d["CapabilityBoundingSet"] == "" and d["ProtectSystem"] == "strict"
            assert d["RestrictNamespaces"] == "yes"
            assert d["SystemCallFilter"] == "@system-service"
    text = units.committed("systemd", units.TARGET).decode()
    wants = [w for line in text.splitlines() if line.startswith("Wants=") for w in line[6:].split()]
    assert wants == [*(p.unit for p in units.PROCESSES), *units.HELPERS]
    # The target's start waits for all three (through sensorium-ready), its stop too
    # (through sensorium-drain, stopped before it and stopping them).
    target = _directives(text)
    assert target["After"] == "sensorium-ready.service" and target["DefaultDependencies"] == "no"
    ready = _directives(units.committed("systemd", "sensorium-ready.service").decode())
    assert ready["After"].split() == [p.unit for p in units.PROCESSES]
    drain = _directives(units.committed("systemd", "sensorium-drain.service").decode())
    assert drain["After"] == units.TARGET and drain["StopPropagatedFrom"] == units.TARGET
    assert drain["ExecStop"].split()[2:] == [p.unit for p in units.PROCESSES]


def _exposure(unit: Path) -> float:
    """`systemd-analyze security --offline=yes` of one unit file: its overall exposure."""
    assert SYSTEMD_ANALYZE
    res = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice", "SYSTEMD_COLORS": "0"},
        timeout=60,
    )
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", res.stdout)
    if res.returncode != 0 and found is None and "offline" in res.stderr:
        pytest.skip(f"this systemd-analyze has no --offline: {res.stderr.strip()}")
    assert found, res.stdout + res.stderr
    return float(found.group(1))


# The issue-17 bounds: the connector (root, namespaces, mounts) at most 4.5 "OK".
EXPOSURE_BOUNDS = {"sensorium-os": 4.5, "sensorium-core": 2.0, "sensorium-poller": 2.0}


def test_systemd_analyze_security_scores_stay_within_bounds(tmp_path: Path) -> None:
    """The committed system units, and as install-units renders them here, each within
    its bound. (--user units are not bounded: a user manager cannot apply the mount and
    capability options.)"""
    for p in units.PROCESSES:
        path = tmp_path / p.unit
        path.write_bytes(units.committed("systemd", p.unit))
        assert _exposure(path) <= EXPOSURE_BOUNDS[p.script], p.unit
    here = units.find_launcher()
    files = units.render(units.Options("systemd", False, _out_of_tmp(here)))
    _write(files, tmp_path / "rendered")
    for p in units.PROCESSES:
        assert _exposure(tmp_path / "rendered" / p.unit) <= EXPOSURE_BOUNDS[p.script], p.unit
    # A checkout under /tmp costs exactly PrivateTmp= (the units must reach it there).
    relaxed = units.render(units.Options("systemd", False, here))
    for name, data in relaxed.items():
        d, neutral = _directives(data.decode()), _directives(files[name].decode())
        same = ("PrivateTmp", "ExecStart")
        assert {k: v for k, v in neutral.items() if k not in same} == {
            k: v for k, v in d.items() if k not in same
        }, name


def _out_of_tmp(launcher: units.Launcher) -> units.Launcher:
    """The same installation as if it lived outside /tmp and /var/tmp."""

    def moved(path: Path) -> Path:
        for root in units.TMP_DIRS:
            if path.is_relative_to(root):
                return Path("/opt/checkout") / path.relative_to(root)
        return path

    bin_dir = None if launcher.bin_dir is None else moved(launcher.bin_dir)
    return units.Launcher(moved(launcher.python), bin_dir, moved(launcher.package_dir))


def test_user_units_keep_only_what_a_user_manager_can_apply() -> None:
    opts = units.Options("systemd", True, units.find_launcher())
    for name, data in units.render(opts).items():
        d = _directives(data.decode())
        assert not units.SYSTEM_ONLY & set(d), name
        if name == units.TARGET:
            assert d["WantedBy"] == "default.target"
            continue
        if name in units.HELPERS:
            # The drain's stop speaks to the manager that owns the units: the user's.
            assert d.get("ExecStop", "systemctl --user ").startswith("systemctl --user "), d
            continue
        # The CLI's own default, as a path: %S is ~/.config for systemd < 254.
        assert d["ExecStart"].endswith(f" --state-dir {default_state_dir()}")
        assert "StateDirectory" not in d and d["NoNewPrivileges"] == "yes"


def test_a_state_dir_under_tmp_or_home_stays_reachable() -> None:
    opts = units.Options("systemd", False, units.find_launcher(), Path("/home/op/sensorium"))
    d = _directives(units.render(opts)["sensorium-core.service"].decode())
    assert d["ReadWritePaths"] == "/home/op/sensorium" and d["ProtectHome"] == "read-only"
    assert "StateDirectory" not in d
    assert d["ExecStart"].endswith(" --state-dir /home/op/sensorium")
    opts = units.Options("systemd", False, units.find_launcher(), Path("/var/tmp/a b%c"))
    d = _directives(units.render(opts)["sensorium-core.service"].decode())
    assert "PrivateTmp" not in d  # a private /tmp would hide it
    assert d["ExecStart"].endswith(' --state-dir "/var/tmp/a b%%c"')
    assert d["ReadWritePaths"] == '"/var/tmp/a b%%c"'
    with pytest.raises(ValueError, match="control character"):
        units.render(units.Options("systemd", False, units.find_launcher(), Path("/srv/a\nb")))


def test_entry_points_match_pyproject_and_import() -> None:
    assert {p.script for p in units.PROCESSES} <= set(SCRIPTS)
    for p in units.PROCESSES:
        module, _, func = SCRIPTS[p.script].partition(":")
        assert module == f"{p.module}.__main__"  # so `python -m` runs the same main
        assert callable(getattr(importlib.import_module(module), func))


@pytest.mark.parametrize("user", [False, True], ids=["daemon", "agent"])
def test_launchd_plists_start_the_real_console_scripts(tmp_path: Path, user: bool) -> None:
    launcher = units.find_launcher()
    assert launcher.bin_dir is not None, "console scripts are not installed beside python"
    state = None if user else tmp_path / "state"
    files = units.render(units.Options("launchd", user, launcher, state))
    assert sorted(files) == sorted(p.plist for p in units.PROCESSES)
    for p in units.PROCESSES:
        committed = plistlib.loads(units.committed("launchd", p.plist))
        assert Path(committed["ProgramArguments"][0]).name == p.script
        assert committed["Label"] == p.label
        assert committed["KeepAlive"] == {"SuccessfulExit": False}
        assert committed["ThrottleInterval"] >= 10 and committed["RunAtLoad"] is True
        job = plistlib.loads(files[p.plist])
        script, flag, where = job["ProgramArguments"]
        # The real console script of the matching [project.scripts] entry point.
        module, _, func = SCRIPTS[p.script].partition(":")
        assert os.access(script, os.X_OK) and Path(script).name == p.script
        text = Path(script).read_text(errors="replace")
        assert f"from {module} import {func}" in text, text
        assert flag == "--state-dir" and Path(where).is_absolute()
        assert job["StandardErrorPath"] == f"{where}/logs/{p.log_name}.stderr"
        assert {
            k: v for k, v in job.items() if k not in ("ProgramArguments", "StandardErrorPath")
        } == {
            k: v for k, v in committed.items() if k not in ("ProgramArguments", "StandardErrorPath")
        }


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SENSORIUM, "install-units", *args], capture_output=True, text=True, timeout=60
    )


def test_install_units_writes_then_refuses_to_overwrite_a_changed_file(tmp_path: Path) -> None:
    dest, state = tmp_path / "units", tmp_path / "state"
    args = ["--systemd", "--dest", str(dest), "--state-dir", str(state)]
    res = _cli(*args)
    assert res.returncode == 0, res.stderr
    for name in units.names("systemd"):
        assert f"wrote {dest / name}" in res.stdout
        assert (dest / name).stat().st_mode & 0o777 == 0o644
    assert "systemctl daemon-reload && systemctl enable --now sensorium.target" in res.stdout
    assert f"SENSORIUM_STATE_DIR={state}" in res.stdout
    assert state.is_dir() and state.stat().st_mode & 0o777 == 0o700
    _verify(dest, user=False)

    again = _cli(*args)
    assert again.returncode == 0 and again.stdout.count("unchanged ") == len(
        units.names("systemd")
    ), again.stdout

    core = dest / "sensorium-core.service"
    core.write_text(core.read_text() + "# an operator's edit\n")
    edited = core.read_bytes()
    refused = _cli(*args)
    assert refused.returncode == 1
    assert str(core) in refused.stderr and "--force" in refused.stderr, refused.stderr
    assert core.read_bytes() == edited  # nothing written

    dry = _cli(*args, "--dry-run")
    assert dry.returncode == 0 and f"{core} (differs" in dry.stdout
    assert core.read_bytes() == edited

    forced = _cli(*args, "--force")
    assert forced.returncode == 0 and f"replaced {core}" in forced.stdout, forced.stdout
    assert b"an operator's edit" not in core.read_bytes()


def test_install_units_launchd_user_agents(tmp_path: Path) -> None:
    dest = tmp_path / "agents"
    res = _cli("--launchd", "--user", "--dest", str(dest), "--state-dir", str(tmp_path / "s"))
    assert res.returncode == 0, res.stderr
    for p in units.PROCESSES:
        job = plistlib.loads((dest / p.plist).read_bytes())
        assert job["ProgramArguments"][1:] == ["--state-dir", str(tmp_path / "s")]
        assert f"launchctl bootstrap gui/{os.getuid()} {dest / p.plist}" in res.stdout
    assert (tmp_path / "s" / "logs").is_dir()  # where launchd opens the stderr files


def test_install_units_needs_a_manager() -> None:
    res = _cli("--dest", "/nonexistent")
    assert res.returncode == 2 and "--systemd" in res.stderr
