"""A real S3-compatible server for the tests: moto's server mode on a loopback port, in a
process of its own (tkg.jobs.bench.build.local_s3, the one `tkg bench build --s3-server` starts).

The tests reach it over HTTP exactly as a cluster reaches AWS S3 or MinIO: pyarrow's
S3FileSystem, LanceDB's object store and DuckDB all get the endpoint from the config's
`storage` section (or AWS_ENDPOINT_URL) and the credentials from AWS_* variables.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tkg.jobs.bench.build import TEST_CREDENTIALS, free_port, local_s3

__all__ = ["S3Server", "free_port", "s3_server", "use_test_credentials"]


def use_test_credentials() -> None:
    """moto accepts any key; set before any Ray worker starts so workers inherit them."""
    for name, value in TEST_CREDENTIALS.items():
        os.environ.setdefault(name, value)


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
    """The server on 127.0.0.1 with one bucket, stopped on exit."""
    use_test_credentials()
    with local_s3((bucket,)) as endpoint:
        yield S3Server(endpoint=endpoint, bucket=bucket)
