"""Build hook: generate the gRPC stubs from protos/ whenever the package is built or installed.

Everything else about the package is in pyproject.toml. The stubs are never committed (serving/_proto/ is in
.gitignore) and never edited by hand:

- a wheel (``pip install .``, ``python -m build``) gets them in ``build_lib/bertzoo/serving/_proto/``;
- an editable install (``pip install -e .``) maps ``bertzoo.serving`` to the source folder ``serving/``, so they are
  written to ``serving/_proto/`` there. Re-run ``pip install -e .`` after changing a .proto file.

protoc names the Python module after the .proto file's path and imports the messages module by that path from the
services module. The proto is therefore compiled from a temporary copy laid out as
``bertzoo/serving/_proto/bertzoo.proto``, so the generated code imports ``bertzoo.serving._proto.bertzoo_pb2``:
the path it is installed at. grpcio-tools is pinned in ``[build-system] requires`` to the grpcio version the
package depends on, because generated stubs refuse to run on an older grpcio.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTOS = {"bertzoo.proto": ROOT / "protos" / "bertzoo" / "v1" / "bertzoo.proto"}
PACKAGE_PATH = Path("bertzoo", "serving", "_proto")  # the import path of the generated modules
SOURCE_DIR = ROOT / "serving" / "_proto"  # where bertzoo.serving._proto lives in an editable install


def generate_stubs(out_package_dir: Path) -> None:
    """Compile the protos into ``out_package_dir`` (messages, services, type stubs and an ``__init__.py``)."""
    from grpc_tools import protoc  # a build requirement; imported here so `setup.py --help` works without it

    with tempfile.TemporaryDirectory() as tmp:
        include, out = Path(tmp, "include"), Path(tmp, "out")
        (include / PACKAGE_PATH).mkdir(parents=True)
        out.mkdir()
        for name, source in PROTOS.items():
            shutil.copyfile(source, include / PACKAGE_PATH / name)
        # The well-known types (google/protobuf/*.proto) ship inside grpc_tools.
        well_known = Path(protoc.__file__).parent / "_proto"
        args = ["grpc_tools.protoc", f"-I{include}", f"-I{well_known}", f"--python_out={out}", f"--pyi_out={out}",
                f"--grpc_python_out={out}", *(str(PACKAGE_PATH / name) for name in PROTOS)]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {', '.join(map(str, PROTOS.values()))}")
        out_package_dir.mkdir(parents=True, exist_ok=True)
        for generated in (out / PACKAGE_PATH).iterdir():
            shutil.copyfile(generated, out_package_dir / generated.name)
    (out_package_dir / "__init__.py").write_text('"""Generated from protos/ at build time by setup.py; do not edit."""\n')


class BuildPyWithStubs(build_py):
    """build_py that also writes the stubs: into the build tree for a wheel, into the source tree when editable."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            generate_stubs(SOURCE_DIR)
        else:
            generate_stubs(Path(self.build_lib) / PACKAGE_PATH)


setup(cmdclass={"build_py": BuildPyWithStubs})
