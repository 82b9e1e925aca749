"""A real S3-compatible server for the tests: moto's server mode on a loopback port.

The tests reach it over HTTP exactly as a cluster reaches AWS S3 or MinIO: pyarrow's
S3FileSystem, LanceDB's object store and DuckDB all get the endpoint from the config's
`storage` section (or AWS_ENDPOINT_URL) and the credentials from AWS_* variables.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

# moto accepts any key; set before any Ray worker starts so workers inherit them.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1"}


def use_test_credentials() -> None:
    for name, value in CREDENTIALS.items():
        os.environ.setdefault(name, value)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class S3Server:
    endpoint: str  # http://127.0.0.1:PORT
    bucket: str

    def url(self, *parts: str) -> str:
        """A fresh `s3://bucket/...` location (prefix unique per call unless parts given)."""
        return "/".join([f"s3://{self.bucket}", *(parts or (uuid.uuid4().hex[:12],))])

    def storage(self) -> dict:
        """The config's `storage` section for this server."""
        return {"endpoint": self.endpoint, "region": "us-east-1", "path_style": True}


@contextmanager
def s3_server(bucket: str = "tkg-test") -> Iterator[S3Server]:
    """moto's ThreadedMotoServer on 127.0.0.1, with one bucket, stopped on exit."""
    from moto.server import ThreadedMotoServer

    use_test_credentials()
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        import pyarrow.fs as pafs

        fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http",
                               region="us-east-1", allow_bucket_creation=True)
        fs.create_dir(bucket)
        yield S3Server(endpoint=f"http://127.0.0.1:{port}", bucket=bucket)
    finally:
        server.stop()
