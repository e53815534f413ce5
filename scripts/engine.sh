#!/usr/bin/env bash
# Builds vtrace's second engine: Bochs 3.0's CPU (LGPL-2.1), from Debian's
# `bochs` source package, configured with its instrumentation hooks, and
# vtrace's own C ABI over it (bochs/cabi: memory, ports, the PC system,
# the parameters the CPU reads, the hooks that count steps), linked into
# one shared library, libvtrace_bochs.so. vtrace stays Apache-2.0: it
# never links Bochs, it loads that library at run time.
#
# Cached: Bochs's CPU once per version, the library once per version of
# bochs/cabi, under ${VTRACE_ENGINE_HOME:-${XDG_CACHE_HOME:-~/.cache}/vtrace/engine};
# a second run only prints where the library is. Nothing of the machine's
# apt state changes: the source index is read into a private directory.
# Prints the library's path.
set -euo pipefail

VERSION=3.0
ORIG=bochs_3.0+dfsg.orig.tar.xz
# What Debian 13's signed source index gives for it: a tarball that is
# not this one is refused, whatever served it.
ORIG_SHA256=78f6c73d4a6472d5130a87ab9dc306d02c7c71ed8e25b3a8ef642e2a7acd282b
SUITE=trixie

# x86-64 with SMP and the instrumentation hooks (the stubs' header names
# them; the engine's library defines them), no GUI, no devices: the
# engine brings vtrace's own. Every speedup but the repeat speedups
# (--enable-all-optimizations forces those on): they run many iterations
# of a REP string instruction between two of the hooks, and a trace has a
# step per iteration.
CONFIGURE=(--enable-fast-function-calls --enable-handlers-chaining --enable-trace-linking
    --disable-repeat-speedups --enable-cpu-level=6
    --enable-x86-64 --enable-smp --enable-instrumentation=instrument/stubs --with-nogui
    --disable-docbook)
config=$(echo "${CONFIGURE[*]}" | sha256sum | cut -c1-8)

home=${VTRACE_ENGINE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/vtrace/engine}
src=$home/bochs-$VERSION-$config
say() { echo "scripts/engine.sh: $*" >&2; }

cabi=$(cd "$(dirname "$0")/../bochs/cabi" && pwd)
abi=$(cat "$cabi"/*.h "$cabi"/*.cc "$0" | sha256sum | cut -c1-16)
lib=$home/lib-$VERSION-$config-$abi/libvtrace_bochs.so
if [ -e "$lib" ]; then
    echo "$lib"
    exit 0
fi
mkdir -p "$home"
command -v g++ >/dev/null && command -v make >/dev/null || {
    say "g++ and make are needed to build Bochs's CPU"
    exit 69
}

# The source tarball, through apt with a private source list, lists and
# cache: apt checks it against the suite's signed index. apt then fails
# on the .dsc (the registry these machines reach does not serve it), so
# its status is not the verdict: the tarball's hash is.
fetch() {
    local apt=$home/apt
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$home/dl"
    local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    echo "deb-src [signed-by=$keyring] http://deb.debian.org/debian $SUITE main" >"$apt/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=-
        -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -qq)
    say "fetching Bochs $VERSION's source (Debian $SUITE's bochs source package)"
    apt-get "${opts[@]}" update
    (cd "$home/dl" && apt-get "${opts[@]}" source --download-only bochs >/dev/null 2>&1) || true
}

# Bochs's CPU: libcpu.a and the libraries it needs, in $src.
build_cpu() {
    tarball=$home/dl/$ORIG
    if ! echo "$ORIG_SHA256  $tarball" | sha256sum -c --status 2>/dev/null; then
        fetch
    fi
    if ! echo "$ORIG_SHA256  $tarball" | sha256sum -c --status 2>/dev/null; then
        say "$ORIG is missing or not the one Debian $SUITE signed (sha256 $ORIG_SHA256)"
        exit 69
    fi

    # Configure and build in a scratch directory, moved into place whole: an
    # interrupted build leaves nothing that looks built.
    work=$(mktemp -d "$home/build.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    tar -xf "$tarball" -C "$work"
    tree=$work/bochs-$VERSION
    # -fPIC: the libraries go into a shared one.
    say "configuring Bochs's CPU (a few minutes)"
    (cd "$tree" && CFLAGS="-O2 -fPIC" CXXFLAGS="-O2 -fPIC" ./configure "${CONFIGURE[@]}" \
        >"$work/configure.log" 2>&1) || {
        say "configure failed; its log: $work/configure.log"
        trap - EXIT
        exit 70
    }
    jobs=$(nproc 2>/dev/null || echo 2)
    say "building Bochs's CPU with $jobs jobs (a few minutes)"
    for dir in cpu cpu/fpu cpu/cpudb cpu/softfloat3e; do
        target=
        [ "$dir" = cpu ] && target=libcpu.a
        make -C "$tree/$dir" -j"$jobs" $target >>"$work/make.log" 2>&1 || {
            say "building $dir failed; its log: $work/make.log"
            trap - EXIT
            exit 70
        }
    done
    touch "$tree/.built"
    rm -rf "$src"
    mv "$tree" "$src"
    rm -rf "$work"
    # Builds of other configurations go.
    find "$home" -maxdepth 1 -name "bochs-$VERSION*" ! -name "$(basename "$src")" -exec rm -rf {} +
    say "Bochs $VERSION's CPU is built in $src"
}

[ -e "$src/.built" ] || build_cpu

# The library: vtrace's C ABI and Bochs's parameter tree (what the CPU
# keeps its settings in), with the CPU's libraries whole inside it.
# -z defs: a symbol the CPU needs and no one defines fails here, not when
# vtrace loads it.
say "linking the engine's library"
out=$(mktemp -d "$home/lib.XXXXXX")
trap 'rm -rf "$out"' EXIT
flags=(-O2 -fPIC -I"$src" -I"$src/instrument/stubs" -I"$src/gui" -I"$cabi")
for room in "$cabi"/*.cc; do
    g++ "${flags[@]}" -Wall -Wno-unused-parameter -c "$room" -o "$out/$(basename "$room" .cc).o"
done
g++ "${flags[@]}" -c "$src/gui/paramtree.cc" -o "$out/paramtree.o"
g++ -shared -o "$out/libvtrace_bochs.so" "$out"/*.o \
    -Wl,--whole-archive "$src/cpu/libcpu.a" "$src/cpu/fpu/libfpu.a" "$src/cpu/cpudb/libcpudb.a" \
    "$src/cpu/softfloat3e/libsoftfloat.a" -Wl,--no-whole-archive -Wl,-z,defs
rm -f "$out"/*.o
rm -rf "$(dirname "$lib")"
mv "$out" "$(dirname "$lib")"
# Libraries of earlier versions of the C ABI go.
find "$home" -maxdepth 1 -name 'lib-*' ! -name "$(basename "$(dirname "$lib")")" -exec rm -rf {} +
say "the engine's library is $lib"
echo "$lib"
