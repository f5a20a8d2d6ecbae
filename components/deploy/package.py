"""What a submitted job ships: its ``runtime_env`` (the project as ``working_dir``,
environment variables, optionally the project's pip requirements) and the walk that decides
which of the project's files go (:func:`package`), listed before anything leaves.

What is shipped (:func:`package`): the project's files minus :data:`EXCLUDES`, the user's
``excludes``, everything a ``.gitignore`` / ``.rayignore`` ignores, every file or folder whose
name looks like a secret (:data:`SECRET_PATTERNS`: ``.env*``, ``.aws/``, ``*.pem``, ``id_rsa*``,
``.netrc``, service-account JSON, ...) and every symlink that leads out of the project (or to a
folder above itself). Each refused path is listed (not sent); ``--include PATH`` sends one
anyway. The list of what is sent, with sizes, is printed before anything leaves, and Ray gets
an ``excludes`` list that names every refused path, so Ray's own walk packs exactly that list
(it is told not to apply ``.gitignore`` itself: the list already did, and ``--include`` may
override it).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from components.deploy.jobs import SubmitError
from components.io.paths import BASE_ENV, is_uri

# Never shipped: the venv, git history, outputs and datasets (Ray also honours .gitignore).
# gitignore syntax: "/data/" is the top-level dir only; "data/" would also drop components/data.
EXCLUDES = ["/.git", "/.venv", "/runs/", "/data/", "*.beton", "__pycache__/", ".mypy_cache/",
            ".ruff_cache/", ".pytest_cache/", "*.egg-info/"]
# Never shipped unless ``--include`` names them: file or folder names that usually hold secrets
# (matched case-insensitively against every component of a path).
SECRET_PATTERNS = (
    ".env", ".env.*", "*.env", ".envrc", ".aws", ".ssh", ".gnupg", ".azure", ".kube", ".docker",
    "gcloud", ".gcloud", ".vault-token", "credentials", "credentials.*", "*credentials*.json",
    ".credentials*", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.ppk",
    "*.kdbx", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", ".netrc", "_netrc",
    ".git-credentials", ".pgpass", ".pypirc", ".npmrc", ".htpasswd", "*service-account*.json",
    "*service_account*.json", "*serviceaccount*.json", "client_secret*.json",
    "application_default_credentials.json", "secrets", "secrets.*", ".secrets", "*.secret",
    "*.secrets", "*.tfstate", "*.tfstate.*", "auth_token", "*.token", "token.json",
    "kubeconfig", "*.ovpn")
# How many refused paths the listing names one by one (the rest are counted).
SHOW_REFUSED = 20
# Installed by the cluster itself, not per job: Ray must match the cluster's version, and
# ffcv builds against apt packages (examples/cluster/ installs both).
CLUSTER_PROVIDED = ("ray", "ffcv")


# ---------------------------------------------------------------------------------------------
# The runtime environment.


def project_requirements(root: Path) -> list[str]:
    """The project's Python dependencies from ``pyproject.toml``, minus what the cluster must
    provide itself (:data:`CLUSTER_PROVIDED`)."""
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    name = re.compile(r"^[A-Za-z0-9_.-]+")
    return [d for d in deps if (m := name.match(d)) and m.group(0).lower() not in CLUSTER_PROVIDED]


def runtime_env(root: Path, *, pip: str = "none", base_dir: str | None = None,
                env: Sequence[str] = (), extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job's ``runtime_env``: the project as ``working_dir``, environment variables, and
    (``pip="project"``) the project's pip requirements; ``extra`` (a user YAML) is merged on
    top, its ``env_vars`` and ``excludes`` added to ours.

    Raises:
        SubmitError: a malformed ``--env`` item or ``extra`` that is not a mapping.
    """
    env_vars = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}  # nothing downloads weights
    if base_dir is not None:
        env_vars[BASE_ENV] = base_dir
    for item in env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SubmitError(f"--env {item!r} must be KEY=VALUE")
        env_vars[key] = value
    out: dict[str, Any] = {"working_dir": str(root), "excludes": list(EXCLUDES),
                           "env_vars": env_vars}
    if pip == "project":
        out["pip"] = project_requirements(root)
    elif pip != "none":
        raise SubmitError(f"--pip {pip!r} is not allowed: none or project")
    if extra:
        if not isinstance(extra, dict):
            raise SubmitError("--runtime-env must hold a mapping (runtime_env keys)")
        for key, value in extra.items():
            if key == "env_vars":
                out["env_vars"].update({str(k): str(v) for k, v in value.items()})
            elif key == "excludes":
                out["excludes"] += list(value)
            else:
                out[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# What the job's working_dir holds.


@dataclasses.dataclass(kw_only=True)
class Package:
    """What :func:`package` found under ``root``: ``files`` (project-relative POSIX path, size)
    that are sent; ``refused`` (path, why) that are not, each named in ``excludes`` for Ray;
    ``included``: refused paths that ``--include`` sends anyway."""

    root: Path
    files: list[tuple[str, int]]
    refused: list[tuple[str, str]]
    included: list[str]
    excludes: list[str]

    @property
    def total(self) -> int:
        return sum(size for _, size in self.files)


def looks_secret(rel: str) -> str | None:
    """The path component of ``rel`` whose name looks like a secret, else ``None``."""
    for part in rel.split("/"):
        low = part.lower()
        if any(fnmatch.fnmatchcase(low, pat) for pat in SECRET_PATTERNS):
            return part
    return None


def _anchored(rel: str) -> str:
    """``rel`` as a gitignore pattern matching exactly that path."""
    return "/" + re.sub(r"([][*?!#\\])", r"\\\1", rel)


def _matcher(base: Path, lines: Sequence[str]) -> Callable[[Path, bool], bool]:
    from ray._private.thirdparty.pathspec import PathSpec  # what Ray's own upload uses

    spec = PathSpec.from_lines("gitwildmatch", lines)

    def match(p: Path, is_dir: bool) -> bool:
        rel = p.relative_to(base).as_posix()
        return bool(spec.match_file(rel) or (is_dir and spec.match_file(rel + "/")))

    return match


def _ignore_file(folder: Path, name: str) -> Callable[[Path, bool], bool] | None:
    f = folder / name
    if not f.is_file():
        return None
    return _matcher(folder, f.read_text(encoding="utf-8", errors="replace").splitlines())


def _included(rel: str, include: Sequence[str]) -> str | None:
    return next((inc for inc in include if rel == inc or rel.startswith(inc + "/")), None)


def package(root: Path, excludes: Sequence[str] = (), include: Sequence[str] = ()) -> Package:
    """Walk ``root`` as Ray's working_dir upload does (``excludes``, then each folder's
    ``.gitignore`` / ``.rayignore``) and decide what is sent (module docstring).

    ``include``: project-relative paths of refused files or folders to send anyway.

    Raises:
        SubmitError: an ``include`` path that names nothing refused.
    """
    root = Path(root).absolute()
    real_root = root.resolve()
    include = [Path(os.path.normpath(i)).as_posix().strip("/") for i in include]
    top = _matcher(root, list(excludes))
    files: list[tuple[str, int]] = []
    refused: list[tuple[str, str]] = []
    used: set[str] = set()
    patterns = list(excludes)

    def refuse(rel: str, why: str) -> bool:
        inc = _included(rel, include)
        if inc is not None:
            used.add(inc)
            return False
        refused.append((rel, why))
        patterns.append(_anchored(rel))
        return True

    def walk(folder: Path, ignores: list[Callable[[Path, bool], bool]]) -> None:
        own = [m for m in (_ignore_file(folder, ".gitignore"), _ignore_file(folder, ".rayignore"))
               if m is not None]
        ignores = ignores + own
        for entry in sorted(folder.iterdir(), key=lambda p: p.name):
            rel = entry.relative_to(root).as_posix()
            is_dir = entry.is_dir()
            if top(entry, is_dir):
                continue
            secret = looks_secret(rel)
            if secret is not None and refuse(rel, f"{secret!r} looks like a secret"):
                continue
            if entry.is_symlink():
                target = entry.resolve()
                outside = target != real_root and real_root not in target.parents
                above = is_dir and target in entry.absolute().parents
                if (outside or above or looks_secret(target.as_posix())) and refuse(
                        rel, f"a symlink to {target}" + (
                            ", outside the project" if outside else
                            ", a folder above it" if above else ", which looks like a secret")):
                    continue
            if any(m(entry, is_dir) for m in ignores) and refuse(rel, "ignored by .gitignore"):
                continue
            if is_dir:
                walk(entry, ignores)
            elif entry.is_file():
                files.append((rel, entry.stat().st_size))

    walk(root, [])
    unused = [i for i in include if i not in used]
    if unused:
        raise SubmitError(f"--include {unused[0]}: nothing refused has that path (relative to "
                          f"{root}); refused: {', '.join(r for r, _ in refused) or 'nothing'}")
    return Package(root=root, files=files, refused=refused, included=sorted(used),
                   excludes=patterns)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def describe_package(pkg: Package) -> list[str]:
    """The listing printed before a job is sent: every top-level file, and each top-level
    folder with its file count, each with its size; then what was refused and why."""
    groups: dict[str, list[int]] = {}
    for rel, size in pkg.files:
        head, sep, _ = rel.partition("/")
        g = groups.setdefault(head + ("/" if sep else ""), [0, 0])
        g[0] += 1
        g[1] += size
    lines = [f"sending {len(pkg.files)} files, {_size(pkg.total)}, from {pkg.root}:"]
    width = max((len(k) for k in groups), default=0)
    for name, (count, size) in sorted(groups.items()):
        what = (f"{count} file{'s' if count != 1 else ''}" if name.endswith("/") else "")
        lines.append(f"  {name:<{width}}  {_size(size):>10}  {what}".rstrip())
    for rel in pkg.included:
        lines.append(f"  sent on request (--include): {rel}")
    if pkg.refused:
        lines.append(f"not sent ({len(pkg.refused)}; `--include PATH` sends one):")
        lines += [f"  {rel}: {why}" for rel, why in pkg.refused[:SHOW_REFUSED]]
        if len(pkg.refused) > SHOW_REFUSED:
            lines.append(f"  ... and {len(pkg.refused) - SHOW_REFUSED} more")
    return lines


def checked_env(env: dict[str, Any], include: Sequence[str] = ()) -> tuple[dict[str, Any],
                                                                          Package]:
    """``env`` with its ``excludes`` extended by every path :func:`package` refuses, and that
    package.

    Raises:
        SubmitError: ``py_modules`` from a local folder (not checked for secrets), or a bad
            ``include``.
    """
    local = [m for m in env.get("py_modules") or [] if not is_uri(str(m)) and "://" not in
             str(m)]
    if local:
        raise SubmitError(f"runtime_env py_modules {local[0]!r} is a local folder, which submit "
                          "does not check for secrets: put the code under the project, or "
                          "upload it yourself and name its URI")
    pkg = package(Path(env["working_dir"]), env.get("excludes", ()), include)
    return {**env, "excludes": pkg.excludes}, pkg


__all__ = ["CLUSTER_PROVIDED", "EXCLUDES", "Package", "SECRET_PATTERNS", "checked_env",
           "describe_package", "looks_secret", "package", "project_requirements", "runtime_env"]
