# What the test machines' scripts share (sourced by scripts/amdv.sh and
# scripts/vtx.sh, which define die): the kernel to boot, and the guest's
# root file system with busybox, the kernel's modules, vtrace with its
# libraries and the files a test names.

# The kernel to boot: $1 where given, else the newest in /boot.
machine_kernel() {
    local kernel=${1:-}
    if [ -n "$kernel" ]; then
        [ -r "$kernel" ] || die "the kernel $kernel (named in the environment) is not readable"
    else
        kernel=$( (ls -d /boot/vmlinuz-* 2>/dev/null || true) | sort -V | tail -n 1)
    fi
    [ -n "$kernel" ] && [ -r "$kernel" ] ||
        die "no kernel in /boot: scripts/test.sh installs linux-image-cloud-amd64"
    echo "$kernel"
}

# A root at $1 with busybox (static) in it.
machine_root() {
    mkdir -p "$1"/{bin,sbin,lib64,lib/x86_64-linux-gnu,modules,proc,sys,dev,tmp,work,out}
    cp "$(command -v busybox)" "$1/bin/busybox"
}

# Module $2 (relative to the module tree $1), uncompressed, into $3.
machine_module() {
    local src=$1/$2
    if [ -f "$src" ]; then cp "$src" "$3"
    elif [ -f "$src.xz" ]; then xz -dc "$src.xz" >"$3"
    elif [ -f "$src.zst" ]; then zstd -qdc "$src.zst" >"$3"
    else die "module $2 is missing from $1"
    fi
}

# The shared libraries $2 links, into the root $1.
machine_libraries() {
    ldd "$2" | awk '/=> \//{print $3} /^\t\/lib/{print $1}' | while read -r lib; do
        mkdir -p "$1$(dirname "$lib")"
        cp -L "$lib" "$1$lib"
    done
}

# vtrace ($2) and the shared libraries it links, into the root $1; and the
# second engine's library with its own, where this host has one (found as
# vtrace finds it: $VTRACE_ENGINE, else the newest scripts/engine.sh
# built), at /lib/vtrace, which the machine's VTRACE_ENGINE names.
machine_vtrace() {
    cp "$2" "$1/bin/vtrace"
    machine_libraries "$1" "$2"
    local home=${VTRACE_ENGINE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/vtrace/engine}
    local engine=${VTRACE_ENGINE:-$( (ls -t "$home"/lib-*/libvtrace_bochs.so 2>/dev/null || true) | head -n 1)}
    if [ -n "$engine" ] && [ -r "$engine" ]; then
        mkdir -p "$1/lib/vtrace"
        cp -L "$engine" "$1/lib/vtrace/libvtrace_bochs.so"
        machine_libraries "$1" "$engine"
    fi
}

# Files named HOST[:GUEST] (GUEST relative to /work, by default HOST's
# base name) into the root $1.
machine_files() {
    local root=$1 spec src dst
    shift
    for spec in "$@"; do
        src=${spec%%:*}
        dst=${spec#*:}
        [ "$dst" = "$spec" ] && dst=$(basename "$src")
        [ -r "$src" ] || die "--file $src: not readable"
        mkdir -p "$root/work/$(dirname "$dst")"
        cp -L "$src" "$root/work/$dst"
    done
}

# machine_init ROOT TAG MODULE...: ROOT's /init up to the command's end.
# It loads the MODULEs in the order given, runs /command in /work between
# the lines "TAG-START" and "TAG-EXIT status", and says "TAG-FAIL ..."
# where the machine did not come up; ROOT's /before-command, where there
# is one, is sourced first (what runs alongside). The caller appends how
# /out goes back and the power-off, then makes it executable.
machine_init() {
    local root=$1 tag=$2
    shift 2
    printf '#!/bin/busybox sh\ntag=%s\nmodules="%s"\n' "$tag" "$*" >"$root/init"
    cat >>"$root/init" <<'EOF'
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $modules; do
    insmod /modules/$m.ko || echo "$tag-FAIL insmod $m"
done
[ -c /dev/kvm ] || echo "$tag-FAIL no /dev/kvm"
if [ -f /lib/vtrace/libvtrace_bochs.so ]; then
    export VTRACE_ENGINE=/lib/vtrace/libvtrace_bochs.so
fi
[ -f /before-command ] && . /before-command
cd /work
echo "$tag-START"
sh -c "$(cat /command)"
status=$?
# On a line of its own even where the command's output ended mid-line.
echo
echo "$tag-EXIT $status"
EOF
}
