#!/usr/bin/env bash
# Build engine._imgcodec._core with AddressSanitizer + UndefinedBehaviorSanitizer into a temporary
# directory and run the codec tests against that build (the editable install is left untouched).
#
#   scripts/asan_imgcodec.sh [extra pytest args]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
CC="${CC:-gcc}"
TMP="$(mktemp -d /tmp/asan_imgcodec.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT

SUFFIX="$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
INC="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"

# A minimal copy of the package: engine/__init__.py and engine/_imgcodec/*.py plus the ASan build.
mkdir -p "$TMP/engine/_imgcodec"
cp "$ROOT/engine/__init__.py" "$TMP/engine/"
cp "$ROOT"/engine/_imgcodec/*.py "$TMP/engine/_imgcodec/"
"$CC" -std=c11 -shared -fPIC -O1 -g -fno-omit-frame-pointer -Wall -Wextra -Werror \
    -fsanitize=address,undefined -fno-sanitize-recover=undefined \
    -I"$INC" "$ROOT/engine/_imgcodec/imgcodec.c" -o "$TMP/engine/_imgcodec/_core$SUFFIX" -lturbojpeg
echo "built $TMP/engine/_imgcodec/_core$SUFFIX"

LIBASAN="$("$CC" -print-file-name=libasan.so)"
LIBUBSAN="$("$CC" -print-file-name=libubsan.so)"
export LD_PRELOAD="$LIBASAN $LIBUBSAN"
# CPython's allocator and interned objects trip the leak checker: leaks are not what we look for here.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:strict_string_checks=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export PYTHONMALLOC=malloc  # let ASan see every Python allocation too

cd "$TMP"
# Drop the editable install's import redirect (and /work/main-style path entries) so that
# `import engine` resolves to the ASan copy in $TMP, then run pytest in that same interpreter.
export ASAN_ROOT="$ROOT" ASAN_TMP="$TMP"
"$PY" - "$@" <<'PYEOF'
import os
import sys

root, tmp = os.environ["ASAN_ROOT"], os.environ["ASAN_TMP"]
sys.meta_path[:] = [f for f in sys.meta_path if "skbc" not in type(f).__module__]
sys.path[:] = [tmp] + [p for p in sys.path if os.path.abspath(p or ".") not in (root, tmp)]
import pytest  # noqa: E402

import engine._imgcodec._core as core  # noqa: E402

print("using", core.__file__, flush=True)
if not core.__file__.startswith(tmp):
    sys.exit("not the ASan build")
with open("/proc/self/maps") as maps:
    if "libasan" not in maps.read():
        sys.exit("libasan is not loaded")
args = ["-q", "--noconftest", "-p", "no:cacheprovider", "-p", "no:asyncio", "--rootdir", tmp, "-c", os.devnull]
args += [os.path.join(root, "tests", "test_imgcodec.py"), os.path.join(root, "tests", "test_imgcodec_ops.py")]
sys.exit(pytest.main(args + sys.argv[1:]))
PYEOF
