#!/usr/bin/env bash
# Installs jaccl's C interface and the jaccl command:
#
#   scripts/install-c.sh [--prefix DIR] [--from DIR]
#
#   DIR/include/jaccl.h                      the header
#   DIR/lib/libjaccl.so, DIR/lib/libjaccl.a  the shared and the static library
#   DIR/lib/pkgconfig/jaccl.pc               cc prog.c $(pkg-config --cflags --libs jaccl)
#   DIR/lib/cmake/jaccl/                     find_package(jaccl) → target jaccl::jaccl
#   DIR/bin/jaccl                            jaccl launch -n 4 ./prog
#
# --prefix: /usr/local by default (pkg-config and CMake look there; elsewhere, add
# DIR/lib/pkgconfig to PKG_CONFIG_PATH, DIR to CMAKE_PREFIX_PATH and DIR/bin to PATH).
# Programs find the shared library through the run path pkg-config and CMake give them.
# --from: install what is already built in that directory (target/debug, say) instead of
# building it (cargo build --release -p jaccl-c -p jaccl-cli).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

prefix=/usr/local from=""
while (( $# )); do
  case $1 in
    --prefix) prefix=$2; shift 2 ;;
    --from) from=$2; shift 2 ;;
    *) echo "install-c.sh: unknown argument $1 (--prefix DIR, --from DIR)" >&2; exit 2 ;;
  esac
done

if [[ -z $from ]]; then
  cargo build --release --locked -p jaccl-c -p jaccl-cli
  target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
  from=$target/release
fi
for built in libjaccl.so libjaccl.a jaccl; do
  [[ -f $from/$built ]] || { echo "install-c.sh: $from/$built is not built" >&2; exit 1; }
done

if ! mkdir -p "$prefix" 2>/dev/null || [[ ! -w $prefix ]]; then
  echo "install-c.sh: cannot write to $prefix: run it as root, or with --prefix \$HOME/.local" \
    "(then PKG_CONFIG_PATH=\$HOME/.local/lib/pkgconfig and PATH=\$HOME/.local/bin:\$PATH)" >&2
  exit 1
fi
prefix=$(cd "$prefix" && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
install -d "$prefix/include" "$prefix/lib/pkgconfig" "$prefix/lib/cmake/jaccl" "$prefix/bin"
install -m 644 crates/jaccl-c/include/jaccl.h "$prefix/include/"
install -m 755 "$from/libjaccl.so" "$prefix/lib/"
install -m 644 "$from/libjaccl.a" "$prefix/lib/"
install -m 755 "$from/jaccl" "$prefix/bin/"

# What the static library needs besides (rustc --print native-static-libs).
static_libs="-ldl -lgcc_s -lutil -lrt -lpthread -lm -lc"
cat > "$prefix/lib/pkgconfig/jaccl.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: jaccl
Description: Collective communication for machine-learning processes (C interface)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -ljaccl
Libs.private: $static_libs
PC

cat > "$prefix/lib/cmake/jaccl/jacclConfig.cmake" <<'CMAKE'
# find_package(jaccl) gives the imported target jaccl::jaccl (the shared library and its
# header); jaccl::jaccl_static is the static one.
get_filename_component(_jaccl_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET jaccl::jaccl)
  add_library(jaccl::jaccl SHARED IMPORTED)
  set_target_properties(jaccl::jaccl PROPERTIES
    IMPORTED_LOCATION "${_jaccl_prefix}/lib/libjaccl.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_jaccl_prefix}/include")
  add_library(jaccl::jaccl_static STATIC IMPORTED)
  set_target_properties(jaccl::jaccl_static PROPERTIES
    IMPORTED_LOCATION "${_jaccl_prefix}/lib/libjaccl.a"
    INTERFACE_INCLUDE_DIRECTORIES "${_jaccl_prefix}/include"
    INTERFACE_LINK_LIBRARIES "dl;gcc_s;util;rt;pthread;m")
endif()
unset(_jaccl_prefix)
CMAKE
cat > "$prefix/lib/cmake/jaccl/jacclConfigVersion.cmake" <<CMAKE
set(PACKAGE_VERSION "$version")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
CMAKE

echo "installed jaccl $version into $prefix (include/jaccl.h, lib/libjaccl.{so,a}, lib/pkgconfig/jaccl.pc, lib/cmake/jaccl, bin/jaccl)"
