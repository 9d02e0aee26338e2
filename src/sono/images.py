"""The Docker runner image: content-hashed builds, a project layer, an offline base.

Tags: ``so-runner:<hash>`` (and ``so-runner:latest``, so a project ``.so/Dockerfile`` can say
``FROM so-runner``), ``so-project-<slug>:<hash>`` for the project layer, ``so-base:<suite>``
for the base ``so image bootstrap`` makes from a debootstrap rootfs. The hash covers
everything that goes into a build, so an image is rebuilt only when one of them changes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sono import proc
from sono.errors import SoError
from sono.textsafe import one_line

RUNNER_REPO = "so-runner"
BOOTSTRAP_REPO = "so-base"
DEFAULT_SUITE = "bookworm"
FALLBACK_BASE = "debian:bookworm-slim"
LABEL = "so.image"
BOOTSTRAP_PACKAGES = (
    "ca-certificates",
    "git",
    "jq",
    "ripgrep",
    "nodejs",
    "procps",
    "bash",
    "less",
    "python3-minimal",  # runs so's network forwarder (sono/net/forward.py) inside
)
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")

Progress = Callable[[str], None]


def agent_ids() -> tuple[int, int]:
    """The container user's uid/gid: the host user's, so workspace files keep their owner —
    except for root, which gets an unprivileged 1000 (the workspace is chowned to it)."""
    uid, gid = os.getuid(), os.getgid()
    return (1000, 1000) if uid == 0 else (uid, gid)


def dockerfile() -> str:
    return resources.files("sono.runner").joinpath("Dockerfile").read_text()


def project_dockerfile(project: Path) -> Path | None:
    """``<project>/.so/Dockerfile`` when there is one (its directory: the build context)."""
    path = project / ".so" / "Dockerfile"
    return path if path.is_file() else None


@dataclass(frozen=True)
class RunnerSpec:
    base: str
    uid: int
    gid: int
    project: Path | None = None  # a project whose .so/Dockerfile is layered on top
    # The digest of the .so/ build context the user trusted (``so trust``), if any.
    trusted_context: str | None = None

    def project_dockerfile(self) -> Path | None:
        return None if self.project is None else project_dockerfile(self.project)


def _instructions(dockerfile_text: str) -> list[list[str]]:
    """The Dockerfile's instructions as word lists, line continuations joined."""
    escape = "\\"
    head = dockerfile_text.lstrip().splitlines()[:1]
    if head and head[0].replace(" ", "").lower() == "#escape=`":
        escape = "`"
    joined = re.sub(re.escape(escape) + r"[ \t]*\r?\n", " ", dockerfile_text)
    return [line.split() for line in joined.splitlines() if line.split()]


def remote_sources(dockerfile_text: str) -> list[str]:
    """What the engine itself would fetch for this Dockerfile, from the host's network
    whatever the build's network: an ``ADD`` of a URL (any scheme, ``git@``) or of a source
    named through a variable (``ADD $U``: it may expand to a URL), and a ``COPY --from`` /
    ``ADD --from`` of anything but an earlier stage (an image reference: a pull)."""
    found = []
    stages: set[str] = set()
    for words in _instructions(dockerfile_text):
        op = words[0].upper()
        if op == "FROM" and len(words) >= 4 and words[-2].upper() == "AS":
            stages.add(words[-1].lower())
        if op not in ("ADD", "COPY"):
            continue
        for raw in words[1:]:
            word = raw.strip('[],"')
            if word.lower().startswith("--from="):
                source = word.split("=", 1)[1]
                if source.lower() not in stages and not source.isdigit():
                    found.append(f"{op} {word}")
            elif op == "ADD" and ("://" in word or word.startswith("git@") or "$" in word):
                found.append(word)
    return found


def base_images(dockerfile_text: str) -> list[str]:
    """The images the ``FROM`` lines name (not earlier stages, not ``scratch``)."""
    found, stages = [], set()
    for words in _instructions(dockerfile_text):
        if words[0].upper() != "FROM":
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if args and args[0].lower() not in stages and args[0].lower() != "scratch":
            found.append(args[0])
        if len(args) >= 3 and args[-2].upper() == "AS":
            stages.add(args[-1].lower())
    return found


def _require_trusted(spec: RunnerSpec, dockerfile: Path) -> None:
    """Refuse a project layer whose build context the user has not trusted as it is."""
    from sono.trust import context_digest

    digest = context_digest(dockerfile.parent)
    if spec.trusted_context == digest:
        return
    state = "has changed since you trusted it" if spec.trusted_context else "is not trusted"
    raise SoError(
        f"the Docker project layer {dockerfile} {state} (its build context {dockerfile.parent} "
        f"is built on your host's engine); review it, then run `so trust` in {spec.project}"
    )


def content_hash(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()[:16]


def _ca_bundle() -> bytes:
    return HOST_CA.read_bytes() if HOST_CA.is_file() else b""


class Images:
    """Image operations on one engine (a ``docker.DockerClient``)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def exists(self, ref: str) -> bool:
        import docker.errors

        try:
            self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            return False
        return True

    def _image_id(self, ref: str) -> str:
        import docker.errors

        try:
            return str(self.client.images.get(ref).id)
        except docker.errors.ImageNotFound:
            return ref  # a registry name: docker build will pull it (or fail clearly)

    def default_base(self) -> str:
        """The offline base when ``so image bootstrap`` made one, else Debian slim."""
        bootstrapped = f"{BOOTSTRAP_REPO}:{DEFAULT_SUITE}"
        return bootstrapped if self.exists(bootstrapped) else FALLBACK_BASE

    def runner_tag(self, spec: RunnerSpec) -> str:
        key = content_hash(
            dockerfile(), self._image_id(spec.base), str(spec.uid), str(spec.gid), _ca_bundle()
        )
        return f"{RUNNER_REPO}:{key}"

    def project_tag(self, spec: RunnerSpec, runner: str) -> str | None:
        path = spec.project_dockerfile()
        if path is None or spec.project is None:
            return None
        files = sorted(p for p in path.parent.rglob("*") if p.is_file())
        key = content_hash(
            runner,
            *(str(p.relative_to(path.parent)) for p in files),
            *(p.read_bytes() for p in files),
        )
        slug = "".join(ch if ch.isalnum() else "-" for ch in spec.project.name.lower())[:40]
        return f"so-project-{slug.strip('-') or 'project'}:{key}"

    def buildable(self, spec: RunnerSpec) -> bool:
        return self.exists(self.runner_tag(spec)) or self.exists(spec.base)

    def ensure(self, spec: RunnerSpec, progress: Progress) -> str:
        """The image to run for ``spec``, building what is missing."""
        runner = self.runner_tag(spec)
        if not self.exists(runner):
            self._build_runner(spec, runner, progress)
        project = self.project_tag(spec, runner)
        path = spec.project_dockerfile()
        if project is None or path is None:
            return runner
        _require_trusted(spec, path)  # an image built from it earlier is not run either
        if not self.exists(project):
            text = path.read_text(errors="replace")
            remote = remote_sources(text)
            if remote:
                raise SoError(
                    f"{path}: {one_line(remote[0], 120)} fetches from the network (the "
                    "engine itself does); the project layer builds without one: put what it "
                    "needs into .so/ and COPY it (no variables in ADD sources)"
                )
            pulls = [i for i in base_images(text) if "$" in i or not self.exists(i)]
            if pulls:
                raise SoError(
                    f"{path}: FROM {one_line(pulls[0], 120)} is not an image on this host "
                    "(the engine would pull it); build FROM the runner image or a local one"
                )
            progress(f"building the project image {project} from {path} (no network)")
            self._build(
                path.parent, project, {}, progress, dockerfile_name=path.name, network="none"
            )
        return project

    def _build_runner(self, spec: RunnerSpec, tag: str, progress: Progress) -> None:
        progress(f"building the runner image {tag} FROM {spec.base} (uid {spec.uid})")
        with tempfile.TemporaryDirectory(prefix="so-image-") as ctx:
            (Path(ctx) / "Dockerfile").write_text(dockerfile())
            (Path(ctx) / "ca-certificates.crt").write_bytes(_ca_bundle())
            args = {"BASE": spec.base, "SO_UID": str(spec.uid), "SO_GID": str(spec.gid)}
            self._build(Path(ctx), tag, args, progress)
        self.client.images.get(tag).tag(RUNNER_REPO, "latest")

    def _build(
        self,
        ctx: Path,
        tag: str,
        args: dict[str, str],
        progress: Progress,
        *,
        dockerfile_name: str = "Dockerfile",
        network: str | None = None,
    ) -> None:
        with without_credentials():
            self._stream_build(ctx, tag, args, progress, name=dockerfile_name, network=network)

    def _stream_build(
        self,
        ctx: Path,
        tag: str,
        args: dict[str, str],
        progress: Progress,
        *,
        name: str,
        network: str | None,
    ) -> None:
        stream = self.client.api.build(
            path=str(ctx),
            tag=tag,
            buildargs=args,
            decode=True,
            rm=True,
            forcerm=True,
            dockerfile=name,
            labels={LABEL: "1"},
            network_mode=network,
        )
        for chunk in _chunks(stream):
            if "error" in chunk:
                raise SoError(
                    f"building {tag} failed: {one_line(str(chunk['error']).strip(), 500)}"
                )
            text = str(chunk.get("stream", "")).strip()
            if text:
                progress(text)

    def list(self) -> list[dict[str, Any]]:
        out = []
        for image in self.client.images.list(filters={"label": LABEL}):
            for tag in image.tags or ["<none>"]:
                out.append(
                    {
                        "tag": tag,
                        "id": image.short_id,
                        "size_mb": round(image.attrs.get("Size", 0) / 1e6, 1),
                        "created": image.attrs.get("Created", ""),
                    }
                )
        return out

    def remove(self, ref: str) -> None:
        import docker.errors

        try:
            self.client.images.remove(ref, force=True)
        except docker.errors.ImageNotFound:
            raise SoError(f"no image {ref!r}; `so image list` shows so's images") from None

    def bootstrap(self, suite: str, mirror: str | None, progress: Progress) -> str:
        """An offline base: debootstrap a Debian rootfs and ``docker import`` it."""
        tag = f"{BOOTSTRAP_REPO}:{suite}"
        debootstrap = shutil.which("debootstrap")
        if debootstrap is None:
            raise SoError("so image bootstrap needs debootstrap: apt-get install debootstrap")
        if os.getuid() != 0:
            raise SoError("so image bootstrap needs root (debootstrap creates device nodes)")
        with tempfile.TemporaryDirectory(prefix="so-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            progress(f"debootstrap {suite} (minbase + {', '.join(BOOTSTRAP_PACKAGES)}) …")
            proc.run(
                [
                    debootstrap,
                    "--variant=minbase",
                    f"--include={','.join(BOOTSTRAP_PACKAGES)}",
                    suite,
                    str(rootfs),
                    *([mirror] if mirror else []),
                ]
            )
            shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
            archive = Path(tmp) / "rootfs.tar"
            proc.run(["tar", "-C", str(rootfs), "-cf", str(archive), "."])
            progress(f"docker import → {tag}")
            self.client.api.import_image(
                src=str(archive),
                repository=BOOTSTRAP_REPO,
                tag=suite,
                changes=[f"LABEL {LABEL}=base"],
            )
        return tag


@contextlib.contextmanager
def without_credentials() -> Iterator[None]:
    """The Docker SDK reads ``~/.docker/config.json`` when it builds and would send every
    registry credential there to the engine with the build; so's builds need none (and a
    malformed file must not break them): an empty config while it runs."""
    saved = os.environ.get("DOCKER_CONFIG")
    with tempfile.TemporaryDirectory(prefix="so-docker-config-") as empty:
        Path(empty, "config.json").write_text("{}\n")
        os.environ["DOCKER_CONFIG"] = empty
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop("DOCKER_CONFIG", None)
            else:
                os.environ["DOCKER_CONFIG"] = saved


def _chunks(stream: Any) -> Iterator[dict[str, Any]]:
    for chunk in stream:
        if isinstance(chunk, dict):
            yield chunk
