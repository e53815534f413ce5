#!/usr/bin/env bash
# The AMD-V test machine: runs a command inside a QEMU (TCG) machine that
# emulates an AMD CPU with SVM, under the installed Debian kernel with its
# own kvm-amd module loaded, so /dev/kvm in there is KVM's real SVM code.
# See docs/amdv.md for what in it is KVM and what is QEMU.
#
#   scripts/amdv.sh [--vtrace BIN] [--file HOST[:GUEST]]... [--out DIR]
#                   [--timeout SECONDS] [--memory SIZE] [--serial-port PORT]
#                   -- COMMAND [ARG]...
#
# The command runs as root in /work inside the machine, with `vtrace` (BIN,
# default target/release/vtrace) and busybox on PATH. Files named with
# --file are copied in (GUEST defaults to the base name, relative to /work).
# Whatever the command leaves in /out comes back into DIR. The command's
# output is printed; the script exits with the command's exit status, or
# 124 when the machine ran out of time, or 125 when it could not boot.
# --serial-port PORT connects the machine's second serial port (ttyS1) to
# TCP port PORT on the host's 127.0.0.1 (a host program such as gdb
# connects there; in the machine, a bridge such as busybox nc carries it).
# The command's output comes line by line as it runs, for a caller that
# waits for a line.
set -euo pipefail

die() {
    echo "amdv.sh: $*" >&2
    exit 125
}

top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/lib/machine.sh"
vtrace="$top/target/release/vtrace"
out=""
timeout=600
memory=3G
files=()
ttys1=(-serial null)
while [ $# -gt 0 ]; do
    case "$1" in
        --vtrace) vtrace=$2; shift 2 ;;
        --file) files+=("$2"); shift 2 ;;
        --out) out=$2; shift 2 ;;
        --timeout) timeout=$2; shift 2 ;;
        --memory) memory=$2; shift 2 ;;
        --serial-port) ttys1=(-serial "tcp:127.0.0.1:$2,server=on,wait=off"); shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
[ $# -gt 0 ] || die "no command given (see --help)"

for tool in qemu-system-x86_64 busybox cpio; do
    command -v "$tool" >/dev/null || die "$tool is missing: scripts/test.sh installs it (qemu-system-x86, busybox-static, cpio)"
done
ldd "$(command -v busybox)" >/dev/null 2>&1 && die "busybox is not the static build: install busybox-static"
[ -x "$vtrace" ] || die "no vtrace binary at $vtrace: build it first (cargo build --release)"
kernel=$(machine_kernel "${VTRACE_AMDV_KERNEL:-}")
version=${kernel##*/vmlinuz-}
modules=/lib/modules/$version/kernel
[ -d "$modules" ] || die "no modules for $version in /lib/modules"

work=$(mktemp -d "${TMPDIR:-/tmp}/vtrace-amdv.XXXXXX")
[ -n "${VTRACE_AMDV_KEEP:-}" ] && echo "amdv.sh: keeping $work" >&2 || trap 'rm -rf "$work"' EXIT
root=$work/root
machine_root "$root"

# Modules in load order: KVM, then the virtio disk that carries /out back.
mods=(virt/lib/irqbypass.ko arch/x86/kvm/kvm.ko arch/x86/kvm/kvm-amd.ko
      drivers/virtio/virtio_ring.ko drivers/virtio/virtio.ko
      drivers/virtio/virtio_pci_legacy_dev.ko drivers/virtio/virtio_pci_modern_dev.ko
      drivers/virtio/virtio_pci.ko drivers/block/virtio_blk.ko)
for m in "${mods[@]}"; do
    machine_module "$modules" "$m" "$root/modules/${m##*/}"
done

machine_vtrace "$root" "$vtrace"
machine_files "$root" ${files[@]+"${files[@]}"}

# The command, quoted once for the guest's shell.
printf '%q ' "$@" >"$root/command"

# A heartbeat on the third serial port (ttyS2, into a host file, never
# into the command's output): where the machine runs out of time, it
# tells a kernel whose clock stood still (QEMU lost its timer interrupt:
# docs/amdv.md) from a command that hung on a clock that ran.
cat >"$root/before-command" <<'EOF'
(while :; do cut -d' ' -f1 /proc/uptime >/dev/ttyS2; sleep 5; done) &
EOF

machine_init "$root" AMDV irqbypass kvm kvm-amd virtio_ring virtio virtio_pci_legacy_dev \
    virtio_pci_modern_dev virtio_pci virtio_blk
cat >>"$root/init" <<'EOF'
if [ -b /dev/vda ]; then
    tar cf /dev/vda -C /out . && sync
fi
poweroff -f
EOF
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet) >"$work/initramfs.cpio"

# The disk that carries /out back: a tar stream written over a raw image.
disk=$work/out.img
truncate -s 1G "$disk"

log=$work/console.log
# nohz=off highres=off: the machine's kernel ticks with its local APIC
# timer in periodic mode, so a timer interrupt QEMU's SVM loses
# (docs/amdv.md) is raised again on the next tick; in one-shot mode the
# kernel re-arms the timer only from the interrupt it never gets.
set +e
timeout --foreground -k 10 "$timeout" qemu-system-x86_64 \
    -accel tcg -cpu EPYC,+svm -m "$memory" -smp 1 -nographic -no-reboot \
    -kernel "$kernel" -initrd "$work/initramfs.cpio" \
    -append "console=ttyS0 quiet panic=-1 rdinit=/init nohz=off highres=off" \
    -drive "file=$disk,format=raw,if=virtio" \
    -serial mon:stdio "${ttys1[@]}" -serial "file:$work/alive" \
    </dev/null 2>"$work/qemu.err" | stdbuf -oL tr -d '\r' | tee "$log" | sed -u -n '/AMDV-START$/,/^AMDV-EXIT/{/AMDV-START$/d;/^AMDV-EXIT/d;p}'
qemu_status=${PIPESTATUS[0]}
set -e
# QEMU's warnings about CPUID bits TCG lacks are noise; anything else is not.
grep -v 'TCG doesn.t support requested feature' "$work/qemu.err" >&2 || true

if grep -q '^AMDV-FAIL' "$log"; then
    grep '^AMDV-FAIL' "$log" >&2
    die "the machine did not come up"
fi
status=$(sed -n 's/^AMDV-EXIT \([0-9]*\).*/\1/p' "$log" | tail -n 1)
if [ -z "$status" ]; then
    if [ "$qemu_status" -eq 124 ]; then
        alive=$(tail -n 1 "$work/alive" 2>/dev/null || true)
        echo "amdv.sh: the machine ran out of time (${timeout} s); its kernel's heartbeat last came at uptime ${alive:-(none)} s" >&2
        exit 124
    fi
    tail -n 20 "$log" >&2
    die "the machine stopped before the command ended (QEMU status $qemu_status)"
fi
if [ -n "$out" ]; then
    mkdir -p "$out"
    tar xf "$disk" -C "$out" 2>/dev/null || echo "amdv.sh: nothing came back from /out" >&2
fi
exit "$status"
