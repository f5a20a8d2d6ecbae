"""A local S3 for tests: moto's server on 127.0.0.1, reached through pyarrow's S3 client.

``s3_uri`` (registered in ``conftest.py``) yields ``s3://<fresh bucket>/data?endpoint_override=
127.0.0.1:<port>&scheme=http``: every test gets an empty bucket; the server is started once per
session on a free port. The endpoint travels in the URI's query string (pyarrow's
``FileSystem.from_uri`` reads ``endpoint_override`` and ``scheme``), so subprocesses and Ray
workers given the URI reach the same server. Fake credentials and a region are set in the
environment (inherited by subprocesses); instance metadata and ``~/.aws`` are switched off so
nothing tries to leave loopback.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

import pytest

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
_buckets = itertools.count()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """``127.0.0.1:<port>`` of a moto S3 server running for the whole session."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_uri(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch,
           tmp_path_factory: pytest.TempPathFactory) -> str:
    """``s3://<new bucket>/data?endpoint_override=...&scheme=http`` on the local server."""
    import pyarrow.fs as pafs

    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    nowhere = tmp_path_factory.mktemp("aws") / "none"
    monkeypatch.setenv("AWS_CONFIG_FILE", str(nowhere))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(nowhere))
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)
    bucket = f"simgraph-test-{next(_buckets)}"
    fs = pafs.S3FileSystem(endpoint_override=s3_endpoint, scheme="http", region="us-east-1",
                           allow_bucket_creation=True)
    fs.create_dir(bucket)
    return f"s3://{bucket}/data?endpoint_override={s3_endpoint}&scheme=http"
