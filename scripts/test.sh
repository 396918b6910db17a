#!/usr/bin/env bash
# BackLite's test suite: builds the C library and the C tests with CMake and runs them (ctest),
# then runs pytest on the installed back_lite package (install it first: `pip install .`).
#
#   BL_TEST_BUILD_DIR   CMake build folder for the C tests (default build/tests)
#   BL_TEST_CUDA        ON to compile the CUDA backend into the C test build too (default OFF:
#                       the C tests exercise the CPU backend; `pip install .` compiles CUDA anyway)
#   PYTEST_ARGS         extra pytest arguments (e.g. "-x -k select")
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${BL_TEST_BUILD_DIR:-build/tests}
jobs=$(nproc 2>/dev/null || echo 2)

echo "== C library and C tests (CMake, ctest) in $build_dir"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DBL_BUILD_TESTS=ON \
      -DBL_ENABLE_CUDA="${BL_TEST_CUDA:-OFF}"
cmake --build "$build_dir" -j "$jobs"
# --no-tests=error: a build that found no C tests is a failure, not a pass
ctest --test-dir "$build_dir" --output-on-failure --no-tests=error -j "$jobs"

echo "== Python tests (pytest) on the installed back_lite"
# Run from tests/ so that the source tree's back_lite/ (which has no compiled library) does not
# shadow the installed package on sys.path.
rc=0
(cd tests && python -m pytest -rs ${PYTEST_ARGS:-} .) || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: failing the run" >&2
    exit 1
fi
exit "$rc"
