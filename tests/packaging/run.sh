#!/usr/bin/env bash
# ctest recall_packaging_sdk: the SDK as an outside project gets it.
#   1. `cmake --install` of this build into a temporary prefix; the installed binaries must
#      start (--help) and the CMake and pkg-config files name no path of the build or source.
#   2. A copy of client/chat_example.cc built out of tree twice: by consumer/CMakeLists.txt
#      (find_package(Recall), Recall::client) and by `c++ ... $(pkg-config --cflags --libs recall)`.
#   3. Each binary run against 127.0.0.1:1 (nothing listens): it must exit 1 with
#      "cannot start a session: UNAVAILABLE", neither hang nor crash.
#
# ctest sets RECALL_BUILD_DIR, RECALL_SOURCE_DIR, RECALL_INSTALL_LIBDIR and the tools the build
# used (RECALL_CMAKE, RECALL_CMAKE_GENERATOR, RECALL_CXX).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${RECALL_BUILD_DIR:?set RECALL_BUILD_DIR to the Recall build folder}
src=${RECALL_SOURCE_DIR:?set RECALL_SOURCE_DIR to the Recall source folder}
libdir=${RECALL_INSTALL_LIBDIR:-lib}
cmake=${RECALL_CMAKE:-cmake}
generator=${RECALL_CMAKE_GENERATOR:-Ninja}
cxx=${RECALL_CXX:-c++}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() {
  echo "FAIL $*"
  exit 1
}
# run LOG CMD...: runs CMD with its output in LOG, shown when it fails.
run() {
  local log=$1
  shift
  if ! "$@" >"$log" 2>&1; then
    tail -40 "$log"
    return 1
  fi
}

# ---- 1. Install -------------------------------------------------------------------------------
echo "cmake --install $build --prefix $prefix"
run "$work/install.log" "$cmake" --install "$build" --prefix "$prefix" ||
  fail "cmake --install (are recall, recall-worker, recall-coordinator and the SDK built?)"
for f in bin/recall bin/recall-worker bin/recall-coordinator \
  lib/librecall_sentencepiece.so include/recall/client/client.h include/recall/v1/chat.pb.h include/recall/v1/chat.grpc.pb.h \
  include/recall/v1/worker.pb.h "$libdir/librecall_client.a" "$libdir/librecall_proto.a" \
  "$libdir/cmake/Recall/RecallConfig.cmake" "$libdir/cmake/Recall/RecallConfigVersion.cmake" \
  "$libdir/cmake/Recall/RecallTargets.cmake" "$libdir/pkgconfig/recall.pc"; do
  [ -f "$prefix/$f" ] || fail "not installed: $f"
done
for b in recall recall-worker recall-coordinator; do
  run "$work/help.log" "$prefix/bin/$b" --help || fail "installed $b --help"
done
for tree in "$build" "$src"; do
  if grep -rlF "$tree" "$prefix/$libdir/cmake" "$prefix/$libdir/pkgconfig"; then
    fail "the installed files above name $tree"
  fi
done
mkdir "$work/app"
cp "$src/client/chat_example.cc" "$work/app/"

# ---- 2a. find_package(Recall) -----------------------------------------------------------------
echo "find_package(Recall): consumer/CMakeLists.txt"
run "$work/configure.log" "$cmake" -S "$here/consumer" -B "$work/cmake-build" -G "$generator" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCHAT_EXAMPLE_SOURCE="$work/app/chat_example.cc" || fail "configuring the consumer project"
recall_dir=$(sed -n 's/^Recall_DIR:[A-Z]*=//p' "$work/cmake-build/CMakeCache.txt")
[ "$recall_dir" = "$prefix/$libdir/cmake/Recall" ] ||
  fail "find_package(Recall) found '$recall_dir', not the prefix's $prefix/$libdir/cmake/Recall"
run "$work/build.log" "$cmake" --build "$work/cmake-build" ||
  fail "building chat_example.cc with find_package(Recall)"

# ---- 2b. pkg-config ---------------------------------------------------------------------------
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
flags=$(pkg-config --cflags --libs recall) || fail "pkg-config --cflags --libs recall"
echo "pkg-config --cflags --libs recall: $flags"
# shellcheck disable=SC2086  # the flags are words
run "$work/pkg-config.log" "$cxx" -O2 -o "$work/chat_example_pc" "$work/app/chat_example.cc" \
  $flags || fail "building chat_example.cc with pkg-config"

# ---- 3. Both binaries against no server -------------------------------------------------------
for bin in "$work/cmake-build/chat_example" "$work/chat_example_pc"; do
  [ -x "$bin" ] || fail "no binary: $bin"
  timeout 60 "$bin" 127.0.0.1:1 </dev/null >"$work/out" 2>"$work/err"
  rc=$?
  cat "$work/err"
  [ $rc -ne 124 ] || fail "$bin still running after 60 s against 127.0.0.1:1"
  [ $rc -eq 1 ] || fail "$bin exited $rc against 127.0.0.1:1 (expected 1)"
  grep -q "^cannot start a session: UNAVAILABLE" "$work/err" ||
    fail "$bin: no 'cannot start a session: UNAVAILABLE' on stderr"
done
echo "PASS: installed, built with find_package(Recall) and with pkg-config, both exit 1 with no server"
