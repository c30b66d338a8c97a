"""Copies the CMake build's shared libraries into the package (twell/_lib) when it is built, so that
`pip install ./python` after the CMake build installs a package that finds them. Where they come
from: $TWELL_LIB_DIR, else the source tree's build/lib. Without them the package still installs and
looks for them at import time (twell._capi.library_path)."""
import os
import pathlib
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
LIBRARIES = ("libtwell_runtime.so", "libtwell_jit.so")


class BuildPyWithLibraries(build_py):
    def run(self):
        super().run()
        source = pathlib.Path(os.environ.get("TWELL_LIB_DIR", HERE.parent / "build" / "lib"))
        found = [source / name for name in LIBRARIES if (source / name).is_file()]
        if not found:
            shutil.rmtree(pathlib.Path(self.build_lib) / "twell" / "_lib", ignore_errors=True)
            print(f"twell: WARNING: no libraries in {source}: the package will look for them at import time "
                  "($TWELL_LIB_DIR)", file=sys.stderr)
            return
        target = pathlib.Path(self.build_lib) / "twell" / "_lib"
        shutil.rmtree(target, ignore_errors=True)  # never package a previous build's libraries
        target.mkdir(parents=True, exist_ok=True)
        for path in found:
            shutil.copy2(path, target / path.name)
            print(f"twell: packaged {path}")


try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70
    from wheel.bdist_wheel import bdist_wheel


class PlatformWheel(bdist_wheel):
    """py3-none-<platform>: any Python 3 (ctypes, no extension module), but this machine's platform
    (the wheel carries x86_64 Linux libraries)."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return ("py3", "none") + tuple(super().get_tag()[2:])


setup(cmdclass={"build_py": BuildPyWithLibraries, "bdist_wheel": PlatformWheel})
