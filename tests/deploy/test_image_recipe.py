"""The serving image's recipe (deploy/docker), checked without a Docker engine.

- One SGLang pin: the Dockerfile's base ``lmsysorg/sglang:v${SGLANG_VERSION}`` and its ARG
  default, pyproject's ``sglang`` extra, scripts/setup.sh, requirements/*.txt and the
  chart's appVersion ``<package version>-sglang<SGLang version>`` (the default image tag)
  agree; the examples that set ``image.tag`` use it.
- The image runs as uid 1000 (the chart's podSecurityContext), with the chart's command as
  its ENTRYPOINT, and nothing deploy-time (weights, drafter, cost tables, STS) is baked.
- The install step installs the project source from the build context that .dockerignore
  leaves, and the wheel built from exactly that has the ``sglang.srt.plugins`` entry point.
- pip's resolver, for the image's CPython 3.12 on manylinux x86_64, resolves
  ``dspark-sglang[sglang,gpu,fleet]`` with the pinned SGLang (needs the package index).
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
CHART = ROOT / "helm" / "dspark-sglang"
PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN = ("dspark_sglang", "dspark_sglang.sglang_plugin:load")
BASE_IMAGE = "lmsysorg/sglang"

# The official image: CPython 3.12 on x86_64 Ubuntu 22.04 (glibc 2.35). A resolution that
# holds for glibc 2.35 holds for newer ones too.
IMAGE_PYTHON = "3.12"
IMAGE_GLIBC_MINOR = 35

# Files that are deploy-time artifacts, never part of the image.
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".ckpt", ".onnx", ".npz")


def is_deploy_artifact(name: str) -> bool:
    """Weights, or an STS / cost-table data file (profiles/<hw>/<model>-tp<N>.json)."""
    name = name.lower()
    stem, _, suffix = name.rpartition(".")
    table = suffix in {"json", "yaml", "yml", "csv"} and bool(
        re.search(r"(^|[-_.])(sts|cost[-_]table)([-_.]|$)|-tp\d+(\.|$)", stem)
    )
    return name.endswith(WEIGHT_SUFFIXES) or table


# --- Dockerfile parsing ------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    cmd: str
    args: str
    line: int


def dockerfile() -> list[Instruction]:
    """Instructions with continuations joined and comment lines dropped (Docker's rules)."""
    out: list[Instruction] = []
    buf: list[str] = []
    start = 0
    for n, raw in enumerate(DOCKERFILE.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf.append(line[:-1].strip())
            continue
        buf.append(line)
        cmd, _, args = " ".join(buf).partition(" ")
        out.append(Instruction(cmd.upper(), args.strip(), start))
        buf = []
    assert not buf, "Dockerfile ends inside a continued line"
    return out


def instructions(cmd: str) -> list[Instruction]:
    return [i for i in dockerfile() if i.cmd == cmd]


def arg_defaults(before_from: bool) -> dict[str, str]:
    """``ARG NAME=default`` before the first FROM (global) or after it (build stage)."""
    out: dict[str, str] = {}
    seen_from = False
    for ins in dockerfile():
        seen_from = seen_from or ins.cmd == "FROM"
        if ins.cmd == "ARG" and seen_from != before_from:
            name, eq, value = ins.args.partition("=")
            if eq:
                out[name.strip()] = value.strip().strip('"')
    return out


def copy_steps() -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY from the build context."""
    steps = []
    for ins in instructions("COPY"):
        words = [w for w in shlex.split(ins.args) if not w.startswith("--")]
        assert "--from" not in ins.args, f"line {ins.line}: multi-stage COPY not expected"
        steps.append((words[:-1], words[-1]))
    return steps


def run_commands() -> list[list[str]]:
    """Every shell command of every RUN as words, split at ``;``, ``&&``, ``||``, ``|``."""
    cmds: list[list[str]] = []
    for ins in instructions("RUN"):
        lex = shlex.shlex(ins.args, posix=True, punctuation_chars=";&|")
        lex.whitespace_split = True
        cmd: list[str] = []
        for tok in lex:
            if tok and set(tok) <= set(";&|"):
                if cmd:
                    cmds.append(cmd)
                cmd = []
            else:
                cmd.append(tok)
        if cmd:
            cmds.append(cmd)
    return cmds


def pip_installs() -> list[list[str]]:
    """The arguments after ``pip install`` of each pip install command."""
    out = []
    for cmd in run_commands():
        for n in range(len(cmd) - 1):
            if cmd[n] == "pip" and cmd[n + 1] == "install":
                out.append(cmd[n + 2 :])
    return out


# --- pins --------------------------------------------------------------------------------


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def chart_app_version() -> str:
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


def sglang_pins() -> dict[str, str]:
    """Every place that pins SGLang -> the version it pins."""
    pins: dict[str, str] = {}
    extra = pyproject()["project"]["optional-dependencies"]["sglang"]
    (req,) = [r for r in extra if re.match(r"sglang\s*==", r)]
    pins["pyproject.toml [sglang] extra"] = req.split("==", 1)[1].strip()
    for n, v in enumerate(
        re.findall(r"\bsglang==([\w.]+)", (ROOT / "scripts/setup.sh").read_text())
    ):
        pins[f"scripts/setup.sh #{n + 1}"] = v
    for path in sorted((ROOT / "requirements").glob("*.txt")):
        for line in path.read_text().splitlines():
            m = re.match(r"\s*sglang\s*==\s*([\w.]+)", line.split("#", 1)[0])
            if m:
                pins[f"requirements/{path.name}"] = m.group(1)
    pins["Dockerfile ARG SGLANG_VERSION"] = arg_defaults(before_from=True).get("SGLANG_VERSION", "")
    app = chart_app_version()
    pins["Chart.yaml appVersion suffix"] = app.partition("-sglang")[2]
    return pins


# --- (a) one pinned version --------------------------------------------------------------


def test_base_image_is_the_official_sglang_release_of_the_arg() -> None:
    froms = instructions("FROM")
    assert len(froms) == 1, "one stage: the official SGLang release image"
    assert froms[0].args == f"{BASE_IMAGE}:v${{SGLANG_VERSION}}"
    assert "SGLANG_VERSION" in arg_defaults(before_from=True), (
        "ARG SGLANG_VERSION=<pin> before FROM"
    )
    # Re-declared in the stage so the build can check the base's sglang against it.
    assert any(i.args.split("=")[0] == "SGLANG_VERSION" for i in instructions("ARG")[1:])


def test_every_sglang_pin_agrees() -> None:
    pins = sglang_pins()
    assert len(pins) >= 4, pins
    assert len(set(pins.values())) == 1 and "" not in pins.values(), (
        "SGLang is pinned to different versions; change them together "
        f"(deploy/docker/README.md): {json.dumps(pins, indent=1)}"
    )


def test_chart_app_version_is_package_version_dash_sglang_version() -> None:
    version = pyproject()["project"]["version"]
    sglang = sglang_pins()["pyproject.toml [sglang] extra"]
    assert chart_app_version() == f"{version}-sglang{sglang}"
    init = (ROOT / "dspark_sglang" / "__init__.py").read_text()
    assert f'__version__ = "{version}"' in init, "dspark_sglang.__version__ != pyproject version"
    # The chart's default tag is appVersion (dspark.image in _helpers.tpl).
    assert (
        "default .Chart.AppVersion .Values.image.tag"
        in (CHART / "templates" / "_helpers.tpl").read_text()
    )
    assert yaml.safe_load((CHART / "values.yaml").read_text())["image"]["tag"] == ""


def test_examples_and_values_name_the_app_version() -> None:
    app = chart_app_version()
    tagged = 0
    for path in sorted((CHART / "examples").glob("*.yaml")):
        tag = (yaml.safe_load(path.read_text()) or {}).get("image", {}).get("tag")
        if tag:
            tagged += 1
            assert tag == app, f"{path.name}: image.tag {tag!r} is not appVersion {app!r}"
    assert tagged, "no example sets image.tag (expected some to)"
    mentioned = re.findall(r"\d+\.\d+\.\d+\S*-sglang[\w.]*\w", (CHART / "values.yaml").read_text())
    assert set(mentioned) <= {app}, f"values.yaml names tags {mentioned}, appVersion is {app}"


# --- (b) non-root, chart-compatible, nothing deploy-time baked ---------------------------


def test_image_runs_as_uid_1000_like_the_chart() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    psc = values["podSecurityContext"]
    users = instructions("USER")
    assert users, "no USER: the image would run as root"
    user, _, group = users[-1].args.partition(":")
    if not user.isdigit():  # a named user: it must be created with the chart's uid
        uids = [
            c[c.index("--uid") + 1]
            for c in run_commands()
            if c[0] == "useradd" and "--uid" in c and c[-1] == user
        ]
        assert uids, f"USER {user} is not created by a `useradd --uid N {user}`"
        user = uids[0]
    assert int(user) == psc["runAsUser"] == 1000
    assert not group or int(group) == psc["runAsGroup"] == 1000
    assert psc["runAsNonRoot"] is True and values["securityContext"]["readOnlyRootFilesystem"]
    # The pod's HOME / cache env (templates/_pod.tpl) is the image's too.
    pod = (CHART / "templates" / "_pod.tpl").read_text()
    chart_env = dict(re.findall(r"- name: (HOME|XDG_CACHE_HOME)\s+value: (\S+)", pod))
    image_env = dict(re.findall(r"(\w+)=(\S+)", " ".join(i.args for i in instructions("ENV"))))
    for key, value in chart_env.items():
        assert image_env.get(key) == value, f"ENV {key}: image {image_env.get(key)}, chart {value}"


def test_entrypoint_is_the_charts_command() -> None:
    pod = (CHART / "templates" / "_pod.tpl").read_text()
    m = re.search(r"- name: sglang\n.*?command:\n((?:\s+- \S+\n)+)", pod, re.S)
    assert m, "chart's sglang container command not found in _pod.tpl"
    command = re.findall(r"- (\S+)", m.group(1))
    (entry,) = instructions("ENTRYPOINT")
    assert json.loads(entry.args) == command == ["python", "-m", "sglang.launch_server"]
    (cmd,) = instructions("CMD")
    assert isinstance(json.loads(cmd.args), list), "CMD in exec form (the chart's args replace it)"


def test_nothing_deploy_time_is_copied_in(image_tree: Path) -> None:
    mounted = ("/models", "/etc/dspark")
    for ins in dockerfile():
        assert ins.cmd != "ADD", f"line {ins.line}: ADD (URLs/archives) not allowed, use COPY"
        for path in mounted:
            assert path not in ins.args, f"line {ins.line}: {ins.cmd} touches {path} (mounted)"
    for sources, _dest in copy_steps():
        for src in sources:
            assert not src.startswith(("profiles", "configs", "benchmarks", "helm")), src
    baked = [p for p in image_tree.rglob("*") if p.is_file()]
    assert baked, "the simulated COPY steps copied nothing"
    bad = [str(p.relative_to(image_tree)) for p in baked if is_deploy_artifact(p.name)]
    assert not bad, f"weights/tables would be baked into the image: {bad}"


def test_run_steps_parse_as_shell() -> None:
    for ins in instructions("RUN"):
        r = subprocess.run(["sh", "-n", "-c", ins.args], capture_output=True, text=True)
        assert r.returncode == 0, f"RUN at line {ins.line}: {r.stderr}"


# --- (c) the install step installs the project and its entry point -----------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = str(PurePosixPath(line.lstrip("!").strip().lstrip("/")))
        rules.append((negate, _pattern_regex(pattern)))
    return rules


def in_build_context(rel: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    included = True
    for negate, rx in rules:
        if any(rx.match(p) for p in prefixes):
            included = negate
    return included


@pytest.fixture(scope="module")
def image_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the COPY steps put into the image, from the build context .dockerignore leaves."""
    rules = dockerignore_rules()
    tree = tmp_path_factory.mktemp("image")
    for sources, dest in copy_steps():
        target = tree / dest.lstrip("/")
        for src in sources:
            path = ROOT / src
            assert path.exists(), f"COPY {src}: not in the repository"
            assert in_build_context(src, rules), f"COPY {src}: excluded by .dockerignore"
            if path.is_dir():
                for f in sorted(path.rglob("*")):
                    rel = f.relative_to(ROOT).as_posix()
                    if f.is_file() and in_build_context(rel, rules):
                        out = target / f.relative_to(path)
                        out.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(f, out)
            else:
                out = target / path.name if dest.endswith("/") or len(sources) > 1 else target
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, out)
    return tree


def project_install_dir() -> str:
    """The image path the Dockerfile COPYs pyproject.toml to (the source tree it installs)."""
    for sources, dest in copy_steps():
        if "pyproject.toml" in sources:
            return dest.rstrip("/") if dest.endswith("/") else str(PurePosixPath(dest).parent)
    raise AssertionError("the Dockerfile does not COPY pyproject.toml")


@pytest.fixture(scope="module")
def wheel(image_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project wheel, built from the source tree exactly as the image receives it."""
    src = image_tree / project_install_dir().lstrip("/")
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = out.glob("dspark_sglang-*.whl")
    return whl


def test_install_step_installs_the_project_source_without_deps() -> None:
    src = project_install_dir()
    assert src.startswith("/") and not src.startswith(("/models", "/etc/dspark", "/scratch"))
    installs = pip_installs()
    project = [c for c in installs if src in c or src + "/" in c]
    assert project, f"no `pip install` of the copied source tree {src}: {installs}"
    assert all("--no-deps" in c and "-e" not in c for c in project), project
    # Its runtime requirements: from runtime_requirements.py, under the base's constraints,
    # never upgrading what the base image has.
    reqs = [c for c in installs if "-r" in c]
    assert reqs, "the runtime requirements are not installed"
    for c in reqs:
        assert "-c" in c and not {"-U", "--upgrade", "--force-reinstall"} & set(c), c
    assert any(
        w.endswith("runtime_requirements.py") and c[0] == "python"
        for c in run_commands()
        for w in c
    )


def test_runtime_requirements_are_pyproject_deps_plus_the_extras(tmp_path: Path) -> None:
    helper = ROOT / "deploy" / "docker" / "runtime_requirements.py"
    extras = arg_defaults(before_from=False)["DSPARK_EXTRAS"]
    project = pyproject()["project"]
    want = list(project["dependencies"])
    for extra in extras.split(","):
        want += project["optional-dependencies"][extra]
    got = subprocess.run(
        [sys.executable, str(helper), str(ROOT / "pyproject.toml"), extras],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert got == want
    assert "sglang" not in extras.split(","), "the base image provides sglang"
    refused = subprocess.run(
        [sys.executable, str(helper), str(ROOT / "pyproject.toml"), "gpu,sglang"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode != 0 and "base image" in refused.stderr


def test_wheel_from_the_build_context_has_the_plugin_entry_point(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (ep_name,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        eps = configparser.ConfigParser()
        eps.read_string(zf.read(ep_name).decode())
    assert PLUGIN_GROUP in eps, f"no [{PLUGIN_GROUP}] in {ep_name}"
    assert dict(eps[PLUGIN_GROUP]) == {PLUGIN[0]: PLUGIN[1]}
    assert "dspark_sglang/sglang_plugin.py" in names
    baked = [n for n in names if is_deploy_artifact(n.rsplit("/", 1)[-1]) or "/drafters/" in n]
    assert not baked, f"the wheel carries weights/drafters: {baked}"


# --- (d) the GPU install resolves for the image's Python and platform --------------------

NETWORK_ERROR = re.compile(
    r"Failed to establish a new connection|Max retries exceeded|Temporary failure in name "
    r"resolution|Name or service not known|Network is unreachable|ConnectTimeout|"
    r"ReadTimeoutError|Connection (?:refused|reset)|ProxyError|No route to host",
    re.I,
)


def _index_url() -> str:
    url = os.environ.get("PIP_INDEX_URL", "")
    if not url:
        r = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
            capture_output=True, text=True,
        )  # fmt: skip
        url = r.stdout.strip() if r.returncode == 0 else ""
    return (url or "https://pypi.org/simple").rstrip("/")


def _skip_unless_index_reachable(index: str) -> None:
    probe = f"{index}/sglang/"
    try:
        with urllib.request.urlopen(probe, timeout=15) as resp:
            resp.read(1024)
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        pytest.skip(f"package registry unreachable ({probe}: {e}); cannot check the resolve")


def _resolve_cache_dir() -> Path:
    """``${DSPARK_CACHE_DIR:-$XDG_CACHE_HOME/dspark-sglang}/pip-resolve`` (as setup.sh)."""
    env = os.environ.get("DSPARK_CACHE_DIR")
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    root = Path(env) if env else Path(xdg) / "dspark-sglang"
    return root.expanduser() / "pip-resolve"


@pytest.mark.registry
@pytest.mark.timeout(900)
def test_gpu_install_resolves_for_the_image_python(wheel: Path, tmp_path: Path) -> None:
    index = _index_url()
    _skip_unless_index_reachable(index)
    sglang = arg_defaults(before_from=True)["SGLANG_VERSION"]
    extras = arg_defaults(before_from=False)["DSPARK_EXTRAS"]
    platforms = [f"manylinux_2_{m}_x86_64" for m in range(IMAGE_GLIBC_MINOR, 16, -1)]
    cmd = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
        "--report", str(tmp_path / "report.json"), "--only-binary=:all:",
        "--python-version", IMAGE_PYTHON, "--implementation", "cp",
        "--abi", "cp" + IMAGE_PYTHON.replace(".", ""),
        *[a for p in [*platforms, "manylinux2014_x86_64"] for a in ("--platform", p)],
        "--target", str(tmp_path / "target"),
        f"{wheel}[sglang,{extras}]", f"sglang=={sglang}",
    ]  # fmt: skip
    env = {**os.environ, "PIP_CACHE_DIR": str(_resolve_cache_dir())}
    # fast-deps reads each wheel's METADATA by HTTP range requests when the index serves no
    # PEP 658 metadata; without it pip downloads every wheel in full (torch + CUDA: GBs).
    t0 = time.monotonic()
    fast = [*cmd[:4], "--use-feature=fast-deps", *cmd[4:]]
    r = subprocess.run(fast, capture_output=True, text=True, env=env, timeout=840)
    if r.returncode != 0 and "fast-deps" in r.stderr and "invalid choice" in r.stderr:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=840)
    took = time.monotonic() - t0
    out = r.stdout[-4000:] + r.stderr[-4000:]
    if r.returncode != 0 and NETWORK_ERROR.search(r.stderr):
        pytest.skip(f"package registry unreachable during the resolve: {out[-500:]}")
    assert r.returncode == 0, (
        f"dspark-sglang[sglang,{extras}] with sglang=={sglang} does not resolve for CPython "
        f"{IMAGE_PYTHON} manylinux x86_64 ({took:.0f} s):\n{out}"
    )
    report = json.loads((tmp_path / "report.json").read_text())
    got = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
           for i in report["install"]}  # fmt: skip
    assert (
        got.get("sglang") == sglang
        and got.get("dspark-sglang") == pyproject()["project"]["version"]
    )
