"""``dspark-sglang --help`` lists every command on one line each, and the entry points work."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib import import_module
from pathlib import Path

import pytest

from dspark_sglang.cli import commands, main

REPO = Path(__file__).resolve().parents[2]
EXPECTED = {
    "demo",
    "generate",
    "train",
    "export-drafter",
    "import-drafter",
    "calibrate",
    "profile",
    "simulate",
    "plan",
    "bench",
}


def _help(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    return capsys.readouterr().out


def test_help_lists_every_command_with_a_one_line_help(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # argparse wraps to the terminal width
    registered = commands()
    assert set(registered) == EXPECTED
    out = _help(capsys, ["--help"])
    lines = out.splitlines()
    start = lines.index("  COMMAND") + 1
    block = []
    for line in lines[start:]:
        if not line.strip():
            break
        block.append(line)
    rows = {}
    for line in block:
        m = re.match(r"^    (\S+)\s{2,}(\S.*)$", line)
        assert m, f"not a one-line command row (a wrapped help?): {line!r}\n{out}"
        rows[m[1]] = m[2]
    assert list(rows) == list(registered)  # every command, in the registry's order
    for name, command in registered.items():
        assert "\n" not in command.help
        assert rows[name] == command.help, name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_command_has_its_own_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _help(capsys, [name, "--help"])
    assert out.startswith(f"usage: dspark-sglang {name}")


def test_no_command_prints_the_list_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_console_script_and_python_dash_m_reach_main() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, func = scripts["dspark-sglang"].partition(":")
    assert getattr(import_module(module), func) is main
    proc = subprocess.run(
        [sys.executable, "-m", "dspark_sglang.cli", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: dspark-sglang")


def test_no_domain_module_imports_the_cli() -> None:
    """The command line sits on top: packages under dspark_sglang/ other than cli/ never
    import it (so a library user never pulls in argparse glue, and nothing loops back)."""
    root = REPO / "dspark_sglang"
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if path.is_relative_to(root / "cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(n == "dspark_sglang.cli" or n.startswith("dspark_sglang.cli.") for n in names):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders
