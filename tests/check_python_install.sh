#!/bin/sh
# `pip install ./python` after the CMake build: the installed package carries the build's libraries
# (twell/_lib) and loads them with no TWELL_LIB_DIR and not from the source tree.
set -eu
python="$1"; package="$2"; build="$3"
target="$build/test-cache/python-install"
rm -rf "$target" "$package/build" && mkdir -p "$target"
TWELL_LIB_DIR="$build/lib" "$python" -m pip install -q --no-deps --no-build-isolation --target "$target" "$package"
rm -rf "$package/build" "$package"/*.egg-info
cd "$target"
env -u TWELL_LIB_DIR PYTHONPATH="$target" "$python" -c "
import twell, twell._capi as c
p = c.library_path()
assert str(p).startswith('$target'), p
assert twell.version() == twell.__version__ and twell.jit_available(), p
ctx = twell.Context(-1)
print('python_install: twell', twell.version(), 'from', p, '; target', ctx.target)
"
