"""The commands of docs/train-your-own-target.md, as the tests run them.

The page's shell blocks are the source: ``guide_commands`` reads them (a line ending in
``\\`` continues on the next), numbered by the ``## N. ...`` section they sit in, and
``runnable`` turns one into what a test executes: the page's absolute paths
(``/models/...``, ``/runs/...``, ``/data/...``) moved under a test folder, the chart path
made absolute, and the programs replaced by this interpreter's modules and the pinned
helm. Nothing else is rewritten, so a flag or value changed on the page changes what the
tests run. The page's input files under ``/data/`` are ``DATA_FILES``: test files that
``provide_data`` copies under the test folder.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "train-your-own-target.md"
CHART = ROOT / "helm" / "dspark-sglang"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_SECTION = re.compile(r"^## (\d+)\. ", re.M)
#: The page's absolute folders; a test puts each under its own root.
PAGE_ROOTS = ("/models/", "/runs/", "/data/")
#: The page's input files and the test files (``tests/cli/data/``) that stand in for them:
#: the training chats (step 1) and the held-out chats (steps 5 and 7).
DATA_FILES = {
    "/data/my_chats.jsonl": ROOT / "tests" / "cli" / "data" / "own_target_chats.jsonl",
    "/data/heldout.jsonl": ROOT / "tests" / "cli" / "data" / "own_target_heldout.jsonl",
}
_DATA_PATH = re.compile(r"(?<![\w/.-])/data/[\w./-]+")


def guide_blocks(lang: str) -> list[tuple[int, str]]:
    """``(section number, body)`` of every fenced ``lang`` block (0 before the first)."""
    text = GUIDE.read_text(encoding="utf-8")
    starts = [(m.start(), int(m.group(1))) for m in _SECTION.finditer(text)]
    out = []
    for m in _FENCE.finditer(text):
        if m.group(1) != lang:
            continue
        section = max((n for pos, n in starts if pos < m.start()), default=0)
        out.append((section, m.group(2)))
    return out


def guide_commands() -> list[tuple[int, str]]:
    """``(section number, command line)`` of every shell command on the page."""
    out = []
    for section, body in guide_blocks("bash"):
        joined = re.sub(r"\\\n\s*", " ", body)
        out += [(section, line.strip()) for line in joined.splitlines() if line.strip()]
    return out


def page_data_paths() -> set[str]:
    """Every ``/data/...`` path the page's YAML and shell blocks name."""
    blocks = guide_blocks("yaml") + guide_blocks("bash")
    return {m.group(0) for _, body in blocks for m in _DATA_PATH.finditer(body)}


def provide_data(root: Path) -> None:
    """Copy ``DATA_FILES`` to where the page's commands read them under ``root``."""
    for page, source in DATA_FILES.items():
        dest = root / page.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, dest)


def at_root(text: str, root: Path) -> str:
    """``text`` with the page's absolute folders (``PAGE_ROOTS``) moved under ``root``."""
    for prefix in PAGE_ROOTS:
        for before in (" ", "=", "'"):
            text = text.replace(f"{before}{prefix}", f"{before}{root}{prefix}")
    return text


def runnable(command: str, root: Path, helm: str | None = None) -> str:
    """The page's ``command`` as a test runs it under ``root`` (see the module docstring)."""
    command = at_root(command, root).replace(" helm/dspark-sglang ", f" {CHART} ")
    program, _, rest = command.partition(" ")
    py = shlex.quote(sys.executable)
    replace = {
        "dspark-sglang": f"{py} -m dspark_sglang.cli",
        "torchrun": f"{py} -m torch.distributed.run",
    }
    if helm is not None:
        replace["helm"] = shlex.quote(helm)
    if program not in replace:
        raise ValueError(f"the guide runs {program!r}, which the tests cannot run: {command}")
    return f"{replace[program]} {rest}"


def run_guide_command(
    command: str, root: Path, *, helm: str | None = None, netns: bool = False, timeout: int = 600
) -> str:
    """Run one page command under ``root`` in bash (globs and redirections as for a user)."""
    line = runnable(command, root, helm)
    if netns:  # a loopback-only network: torchrun's store and gloo reach only 127.0.0.1
        argv = ["unshare", "--net", "bash", "-c", f"ip link set lo up && {line}"]
    else:
        argv = ["bash", "-c", line]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TQDM_DISABLE="1")
    proc = subprocess.run(
        argv, cwd=root, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{line}\nfailed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout + proc.stderr
