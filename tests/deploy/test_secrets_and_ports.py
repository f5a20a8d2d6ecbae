"""Nothing leaves or listens by accident (issue 39, principle 5): ``simgraph submit`` never
ships files that look like secrets or that ``.gitignore`` ignores, lists what it sends, and
needs ``--include`` to send a refused file; a local Ray started by simgraph listens on
loopback only, with token authentication on; the default staging folder is per-user and
owner-only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from components.deploy.package import EXCLUDES, checked_env, package, runtime_env
from components.io.paths import project_root

ROOT = project_root()

SECRETS = {
    ".env": "AWS_SECRET_ACCESS_KEY=abc\n",
    ".env.production": "TOKEN=1\n",
    ".aws/credentials": "[default]\naws_secret_access_key=abc\n",
    "keys/server.pem": "-----BEGIN PRIVATE KEY-----\n",
    "keys/tls.key": "k\n",
    "id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\n",
    "notes/id_ed25519.pub": "ssh-ed25519 AAAA\n",
    ".netrc": "machine api.wandb.ai login user password k\n",
    ".git-credentials": "https://u:p@github.com\n",
    "my-project-service-account.json": '{"private_key": "x"}\n',
    "configs/gcloud/application_default_credentials.json": "{}\n",
    "credentials": "x\n",
}
CODE = {"pipelines/cli.py": "print('hi')\n", "components/data/a.py": "x = 1\n",
        "README.md": "# readme\n"}


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    for rel, text in {**SECRETS, **CODE, "scratch/big.bin": "0" * 100,
                      "local.log": "log\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / ".gitignore").write_text("scratch/\n*.log\n")
    (root / ".venv" / "lib").mkdir(parents=True)
    (root / ".venv" / "lib" / "x.py").write_text("")
    outside = tmp_path / "home"
    (outside / ".ssh").mkdir(parents=True)
    (outside / ".ssh" / "config").write_text("Host *\n")
    (outside / "plain.txt").write_text("x\n")
    (root / "homelink").symlink_to(outside)  # a folder symlink out of the project
    (root / "config.txt").symlink_to(outside / "plain.txt")  # a file symlink out of it
    (root / "components" / "loop").symlink_to(root)  # a cycle
    return root


def _ray_zip(root: Path, env: dict[str, Any], tmp_path: Path) -> set[str]:
    """The files Ray's own working_dir packing puts in the zip for ``env`` (the code path of
    ``JobSubmissionClient.submit_job``), as submit calls it (.gitignore left to the list)."""
    from ray._private.runtime_env.packaging import _zip_files

    out = tmp_path / "pkg.zip"
    _zip_files(str(root), env["excludes"], str(out), include_gitignore=False)
    with zipfile.ZipFile(out) as z:
        return {n for n in z.namelist() if not n.endswith("/")}


def test_submit_refuses_secrets_ignored_files_and_symlinks_out(tmp_path: Path) -> None:
    root = _project(tmp_path)
    env, pkg = checked_env(runtime_env(root))
    sent = {rel for rel, _ in pkg.files}
    assert sent == set(CODE) | {".gitignore"}, sent
    refused = dict(pkg.refused)
    for rel in SECRETS:  # each secret, or the folder that holds it, is named
        assert any(rel == r or rel.startswith(r + "/") for r in refused), rel
    assert "looks like a secret" in refused[".env"] and "'.aws'" in refused[".aws"]
    assert refused["scratch"] == refused["local.log"] == "ignored by .gitignore"
    assert "outside the project" in refused["homelink"]
    assert "outside the project" in refused["config.txt"]
    assert "a folder above it" in refused["components/loop"]
    # What Ray itself packs from that env is exactly the list: nothing else leaves.
    assert _ray_zip(root, env, tmp_path) == sent
    assert env["excludes"][:len(EXCLUDES)] == EXCLUDES
    # Nothing was touched in the project.
    assert (root / ".env").read_text() == SECRETS[".env"]


def test_submit_sends_a_refused_file_only_with_include(tmp_path: Path) -> None:
    from components.deploy.jobs import SubmitError

    root = _project(tmp_path)
    env, pkg = checked_env(runtime_env(root), include=[".env", "scratch", ".aws"])
    sent = {rel for rel, _ in pkg.files}
    assert {".env", "scratch/big.bin", ".aws/credentials"} <= sent
    assert ".env.production" not in sent and ".netrc" not in sent
    assert pkg.included == [".aws", ".env", "scratch"]
    assert _ray_zip(root, env, tmp_path) == sent
    with pytest.raises(SubmitError, match=r"--include README.md: nothing refused has that "
                                          r"path .*refused: .*\.env"):
        checked_env(runtime_env(root), include=["README.md"])


def test_submit_lists_what_it_sends_with_sizes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`simgraph submit` end to end, with a stand-in for Ray's client: the listing is printed
    before the job leaves, and the runtime_env the client gets packs only the listed files."""
    import ray.job_submission

    from pipelines import cli, submit

    root = _project(tmp_path)
    got: dict[str, Any] = {}

    class Client:
        def __init__(self, address: str) -> None:
            pass

        def submit_job(self, **kw: Any) -> str:
            got.update(kw, gitignore_env=os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE"))
            return str(kw["submission_id"])

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", Client)
    monkeypatch.setattr(submit, "project_root", lambda: root)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    rc = cli.main(["submit", "--skip-check", "--no-wait", "--address", "http://127.0.0.1:1",
                   "--", "validate", "x.yaml"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "sending 4 files, 42 B, " in out and f"from {root}:" in out
    listing = out[out.index("sending"):out.index("simgraph submit: not sent")].splitlines()
    assert [ln.split() for ln in listing[1:]] == [
        [".gitignore", "15", "B"], ["README.md", "9", "B"],
        ["components/", "6", "B", "1", "file"], ["pipelines/", "12", "B", "1", "file"]]
    assert "  .env: '.env' looks like a secret" in out and "`--include PATH` sends one" in out
    assert out.index("sending") < out.index("sent to http://127.0.0.1:1")
    assert _ray_zip(root, got["runtime_env"], tmp_path) == set(CODE) | {".gitignore"}
    assert got["gitignore_env"] == "1"  # Ray packs the list; it does not re-apply .gitignore


def test_the_project_itself_ships_no_refused_tracked_file() -> None:
    """The real checkout: every tracked file is sent (no false alarm on the code), and the
    listing is what git tracks plus untracked, unignored files."""
    pkg = package(ROOT, EXCLUDES)
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.split())
    refused = {rel for rel, _ in pkg.refused}
    assert not {t for t in tracked if any(t == r or t.startswith(r + "/") for r in refused)}
    assert {t for t in tracked if (ROOT / t).is_file()} <= {rel for rel, _ in pkg.files}


# ---------------------------------------------------------------------------------------------
# A local Ray listens on loopback only.

PROBE = r"""
import json, os, sys
import psutil
from components.runtime.session import ray_session
with ray_session(1):
    from ray._raylet import AuthenticationMode, get_authentication_mode
    mine = {p.pid for p in psutil.process_iter() if p.uids().real == os.getuid()}
    socks = sorted({(c.laddr.ip, c.laddr.port) for c in psutil.net_connections("inet")
                    if c.status == psutil.CONN_LISTEN and c.pid in mine})
    print("RESULT", json.dumps({"socks": socks,
                                "token": get_authentication_mode() == AuthenticationMode.TOKEN}))
"""

NAMESPACE = ("ip link set lo up && ip link add d0 type bridge && "
             "ip addr add 10.77.0.1/24 dev d0 && ip link set d0 up && "
             "ip route add default dev d0 && exec \"$0\" -c \"$1\"")


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                    reason="needs root's unshare -n for a private network namespace")
def test_a_local_ray_listens_on_loopback_only_with_a_token(tmp_path: Path) -> None:
    """In a network namespace with a routable address (10.77.0.1, a default route) — where
    Ray's own choice of node address is that interface and its gRPC servers listen on every
    interface — the Ray that simgraph starts listens on 127.0.0.1 only, with token auth on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(tmp_path), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(["unshare", "-n", "bash", "-c", NAMESPACE, sys.executable, PROBE],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-3000:]
    got = json.loads(line.removeprefix("RESULT "))
    assert len(got["socks"]) >= 4  # gcs, raylet, agents, the driver: all seen
    exposed = [(ip, port) for ip, port in got["socks"]
               if ip not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]
    assert not exposed, got["socks"]
    assert got["token"]
