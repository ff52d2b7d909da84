"""Regenerate the gRPC stubs in gpu_queue_scaler/_proto from protos/externalscaler.proto.

Run `python -m gpu_queue_scaler.serve.protogen` after editing the proto. The stubs are committed (so
installing the scaler needs no protoc), and a test regenerates them into a temporary folder and
diffs, so the committed files can never drift from the proto. grpcio-tools and mypy-protobuf are
pinned in the `test` extra because their version is written into the generated files.
"""

from __future__ import annotations

import shutil
import sys
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "protos" / "externalscaler.proto"
PACKAGE_DIR = "gpu_queue_scaler/_proto"


def generate(out_root: Path) -> list[Path]:
    """Write the stubs under out_root/scaler/_proto and return their paths."""
    from grpc_tools import protoc

    bin_dir = Path(sys.executable).parent
    plugins = []
    for name in ("protoc-gen-mypy", "protoc-gen-mypy_grpc"):
        found = shutil.which(name) or shutil.which(name, path=str(bin_dir))
        if found is None:
            raise SystemExit(f"{name} not found: pip install mypy-protobuf")
        plugins.append(f"--plugin={name}={found}")
    (out_root / PACKAGE_DIR).mkdir(parents=True, exist_ok=True)
    include = resources.files("grpc_tools") / "_proto"
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PACKAGE_DIR}={PROTO.parent}",
            f"-I{include}",
            *plugins,
            f"--python_out={out_root}",
            f"--grpc_python_out={out_root}",
            f"--mypy_out={out_root}",
            f"--mypy_grpc_out={out_root}",
            str(PROTO),
        ]
    )
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")
    return sorted((out_root / PACKAGE_DIR).glob("externalscaler_pb2*"))


if __name__ == "__main__":
    for path in generate(ROOT):
        print(path.relative_to(ROOT))
