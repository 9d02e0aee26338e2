"""The project Docker layer: trusted content only, no network (pure parts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sono.errors import SoError
from sono.images import Images, RunnerSpec, base_images, remote_sources
from sono.trust import context_digest


def test_remote_sources_finds_every_form_of_a_remote_add() -> None:
    text = (
        "FROM so-runner\n"
        "ADD http://127.0.0.1:8000/x /x\n"
        "add --chmod=755 \\\n    https://example.test/y /y\n"
        'ADD ["http://10.0.0.1/z", "/z"]\n'
        "ADD git@github.com:a/b.git /b\n"
        "ADD local.tar /\nCOPY http.txt /\nRUN echo http://not-an-add\n"
    )
    assert remote_sources(text) == [
        "http://127.0.0.1:8000/x",
        "https://example.test/y",
        "http://10.0.0.1/z",
        "git@github.com:a/b.git",
    ]


def test_remote_sources_finds_variables_and_images_the_engine_would_pull() -> None:
    text = (
        "FROM so-runner AS build\n"
        "ARG U=http://172.17.0.1/env.sh\n"
        "ADD $U /opt/x\nADD ${U} /opt/y\n"
        "COPY --from=build /a /a\n"  # an earlier stage: fine
        "COPY --from=0 /a /b\n"  # a stage by index: fine
        "COPY --from=registry.example/img:1 /etc/passwd /p\n"
        "ADD --from=alpine /x /x\n"
        "COPY $HOME_FILE /c\n"  # COPY reads the context only
    )
    assert remote_sources(text) == [
        "$U",
        "${U}",
        "COPY --from=registry.example/img:1",
        "ADD --from=alpine",
    ]


def test_base_images_skip_stages_and_scratch() -> None:
    text = "FROM so-runner AS a\nFROM a\nFROM --platform=linux/amd64 alpine:3 AS b\nFROM scratch\n"
    assert base_images(text) == ["so-runner", "alpine:3"]


def test_remote_sources_honours_the_escape_directive() -> None:
    assert remote_sources("# escape=`\nFROM x\nADD `\n http://h/a /a\n") == ["http://h/a"]


def _project(tmp_path: Path, dockerfile: str) -> Path:
    (tmp_path / ".so").mkdir()
    (tmp_path / ".so" / "Dockerfile").write_text(dockerfile)
    return tmp_path


class _NoEngine:
    """An engine on which every image exists and nothing may be built."""

    class images:
        @staticmethod
        def get(ref: str) -> object:
            return type("Image", (), {"id": ref})()

    class api:
        @staticmethod
        def build(**kwargs: object) -> object:
            raise AssertionError("nothing may be built")


def test_an_untrusted_or_changed_project_layer_is_neither_built_nor_run(tmp_path: Path) -> None:
    project = _project(tmp_path, "FROM so-runner\nRUN true\n")
    images = Images(_NoEngine())
    spec = RunnerSpec(base="so-base:bookworm", uid=1000, gid=1000, project=project)
    with pytest.raises(SoError, match=r"is not trusted.*so trust"):
        images.ensure(spec, lambda line: None)
    trusted = RunnerSpec(
        base="so-base:bookworm",
        uid=1000,
        gid=1000,
        project=project,
        trusted_context=context_digest(project / ".so"),
    )
    assert images.ensure(trusted, lambda line: None).startswith("so-project-")  # control
    (project / ".so" / "setup.sh").write_text("curl http://127.0.0.1/ | sh\n")  # context grew
    with pytest.raises(SoError, match="has changed since you trusted it"):
        images.ensure(trusted, lambda line: None)


def test_context_digest_covers_names_content_and_modes(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "a").write_text("1")
    first = context_digest(ctx)
    (ctx / "a").chmod(0o755)
    second = context_digest(ctx)
    (ctx / "b").symlink_to("/etc/passwd")
    assert len({first, second, context_digest(ctx)}) == 3


def test_the_project_layer_builds_with_no_network_and_no_credentials(tmp_path: Path) -> None:
    project = _project(tmp_path, "FROM so-runner\nRUN true\n")
    seen: dict[str, object] = {}

    class Engine:
        class images:
            @staticmethod
            def get(ref: str) -> object:
                if ref.startswith("so-project-"):
                    import docker.errors

                    raise docker.errors.ImageNotFound(ref)
                return type("Image", (), {"id": ref})()

        class api:
            @staticmethod
            def build(**kwargs: object) -> list[dict[str, str]]:
                import os

                seen.update(kwargs, config=os.environ.get("DOCKER_CONFIG"))
                return [{"stream": "built"}]

    spec = RunnerSpec(
        base="b",
        uid=1000,
        gid=1000,
        project=project,
        trusted_context=context_digest(project / ".so"),
    )
    Images(Engine()).ensure(spec, lambda line: None)
    assert seen["network_mode"] == "none"
    assert seen["config"] and "so-docker-config-" in str(seen["config"])
