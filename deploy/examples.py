"""Regenerate the example cluster definitions in deploy/ (``make deploy-examples``).

The examples are sized for a logistic regression on 50,000,000 × 64 float64 rows (25.6 GB)
in ``s3://your-bucket``. ``deploy`` reads metadata only, so the arrays are created here
with their metadata alone (no chunk is written) in a loopback S3 server, reached through
``AWS_ENDPOINT_URL`` so that the spec the files carry names only ``s3://your-bucket``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROWS, COLS, CHUNK_ROWS = 50_000_000, 64, 500_000
COMMON = ["--set", "params.max_iter=50"]
EXAMPLES = {
    "deploy/ray-cluster.yaml": ["--target", "ray-cluster", "--nodes", "4", "--max-nodes", "8", *COMMON],
    "deploy/kuberay/rayjob.yaml": ["--target", "kuberay", "--nodes", "4", "--max-nodes", "8", *COMMON],
}


def main() -> None:
    import socket

    import boto3
    import zarr
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "examples",
           "AWS_SECRET_ACCESS_KEY": "examples", "AWS_DEFAULT_REGION": "us-east-1",
           "ARRAYJOB_BUCKET": "s3://your-bucket"}
    try:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="examples",
                     aws_secret_access_key="examples").create_bucket(Bucket="your-bucket")
        options = {"endpoint_url": endpoint, "key": "examples", "secret": "examples"}
        for name, shape, chunks in (("X", (ROWS, COLS), (CHUNK_ROWS, COLS)), ("y", (ROWS,), (CHUNK_ROWS,))):
            zarr.create_array(f"s3://your-bucket/demo/logreg/{name}.zarr", shape=shape, chunks=chunks,
                              dtype="float64", storage_options=options)
        for path, args in EXAMPLES.items():
            subprocess.run([sys.executable, "-m", "arrayjob", "deploy", "configs/logreg.toml", *args,
                            "--output", path], cwd=REPO, env=env, check=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
