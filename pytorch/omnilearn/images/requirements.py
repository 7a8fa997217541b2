"""A user's extra packages (``docker.requirements``) as one layer on the worker image.

The derived image is tagged by a hash of the requirements and of the worker image it is built on,
so it is built once and rebuilt only when either changes; with no requirements the worker image is
used as it is (nothing built, no network needed). The Dockerfile is generated, never a shell line:
``RUN`` in its JSON (exec) form gets pip's argument list.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

from omnilearn.emulator.backends.docker import docker_sdk
from omnilearn.emulator.backends.dockerd import LogFn, emit_to, image_or_none, split_tag
from omnilearn.errors import UserError

LABEL_REQUIREMENTS = "omnilearn.requirements-sha256"


def requirements_tag(image: Any, base_tag: str, requirements: list[str]) -> str:
    digest = hashlib.sha256(json.dumps([image.id, sorted(requirements)]).encode()).hexdigest()
    repo, _ = split_tag(base_tag)
    return f"{repo}-req:{digest[:16]}"


def dockerfile(base_id: str, requirements: list[str]) -> str:
    pip = ["pip", "install", "--no-cache-dir", *requirements]  # none starts with "-" (config check)
    return "\n".join([f"FROM {base_id}", "USER 0:0", f"RUN {json.dumps(pip)}", 'RUN ["pip", "check"]',
                      "USER 10001:10001", ""])


def with_requirements(client: Any, base_tag: str, requirements: list[str], on_log: LogFn | None = None) -> str:
    """The image the workers run: ``base_tag``, or its derived image holding ``requirements``."""
    if not requirements:
        return base_tag
    emit = emit_to(on_log)
    base = image_or_none(client, base_tag)
    if base is None:
        raise UserError(f"docker.image: {base_tag} not found (build it with `omnilearn image build`)")
    tag = requirements_tag(base, base_tag, requirements)
    if image_or_none(client, tag) is not None:
        return tag
    emit(f"building {tag}: {base_tag} with {', '.join(requirements)}")
    text = dockerfile(base.id, requirements)
    tail: list[str] = []
    try:
        stream = client.api.build(fileobj=io.BytesIO(text.encode()), tag=tag, rm=True, forcerm=True, pull=False,
                                  decode=True, labels={LABEL_REQUIREMENTS: tag.rsplit(":", 1)[1]})
        for chunk in stream:
            if "error" in chunk:
                raise UserError(f"docker.requirements: installing {', '.join(requirements)} on {base_tag} failed: "
                                f"{str(chunk['error']).strip()}\n" + "\n".join(tail[-15:]))
            for line in str(chunk.get("stream") or "").splitlines():
                if line.strip():
                    tail.append(line)
                    emit(line)
    except docker_sdk().errors.APIError as e:
        raise UserError(f"docker.requirements: cannot build {tag}: {e.explanation or e}") from None
    return tag
