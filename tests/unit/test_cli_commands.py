"""The CLI imports the module of the command it runs, and only that one: `sensorium
invoke` pays for no audit reader, no catalog validator (jsonschema), no doctor. Each
command's own parser reads its arguments exactly as the whole CLI's parser does."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sensorium.client.cli.main import COMMANDS, build_parser, named


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["invoke", "demo.system.uptime"], "invoke"),
        (["--state-dir", "/s", "status"], "status"),
        (["--state-dir=/s", "ops", "list"], "ops"),
        (["--state", "/s", "logs"], "logs"),  # argparse's abbreviation
        (["--st=/s", "audit"], "audit"),
        (["--state-dir", "invoke", "status"], "status"),  # a value named like a command
        (["--help"], None),
        (["--version"], None),
        (["invok"], None),  # a typo: the whole parser names the choices
        ([], None),
    ],
)
def test_the_command_is_found_before_any_module_is_imported(
    argv: list[str], expected: str | None
) -> None:
    assert named(argv) == expected


@pytest.mark.parametrize(
    "argv",
    [
        ["--state-dir", "/s", "invoke", "demo.system.uptime", "--param", "x=1", "--async"],
        ["ops", "list", "--state-dir", "/s"],
        ["status"],
        ["audit", "list"],
        ["restart", "core"],
    ],
)
def test_one_commands_parser_reads_argv_as_the_whole_cli_does(argv: list[str]) -> None:
    name = named(argv)
    assert name is not None
    alone, whole = build_parser(name).parse_args(argv), build_parser().parse_args(argv)
    assert vars(alone) == vars(whole)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_commands_help_is_the_same_alone(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    helps = []
    for parser in (build_parser(name), build_parser()):
        with pytest.raises(SystemExit) as ended:
            parser.parse_args([name, "--help"])
        assert ended.value.code == 0
        helps.append(capsys.readouterr().out)
    assert helps[0] == helps[1]
    assert helps[0].startswith(f"usage: sensorium {name}")


def test_invoke_imports_no_other_commands_module() -> None:
    probe = (
        "import sys\n"
        "from sensorium.client.cli.main import main\n"
        "try:\n"
        "    main(['invoke', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "mods = [m for m in sys.modules if m.startswith('sensorium.client.cli.')]\n"
        "print(' '.join(sorted(mods)))\n"
        "print('jsonschema' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    loaded = set(out[-2].split())
    assert "sensorium.client.cli.invoke" in loaded
    others = {f"sensorium.client.cli.{m[0]}" for m in COMMANDS.values()} - {
        "sensorium.client.cli.invoke",
        "sensorium.client.cli.completion",  # main answers a shell's TAB itself
    }
    assert not loaded & others, loaded & others
    assert out[-1] == "False"  # no jsonschema
