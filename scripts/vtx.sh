#!/usr/bin/env bash
# The VT-x test machine: runs a command inside a Bochs machine that emulates
# an Intel CPU with VMX (EPT, unrestricted guest), under the installed Debian
# kernel with its own kvm-intel module loaded, so /dev/kvm in there is KVM's
# real VMX code. See docs/vtx.md for what in it is KVM and what is Bochs.
#
#   scripts/vtx.sh [--vtrace BIN] [--file HOST[:GUEST]]... [--out DIR]
#                  [--timeout SECONDS] -- COMMAND [ARG]...
#
# The command runs as root in /work inside the machine, with `vtrace` (BIN,
# default target/release/vtrace) and busybox on PATH. Files named with
# --file are copied in (GUEST defaults to the base name, relative to /work).
# Whatever the command leaves in /out comes back into DIR, over the serial
# line (keep it small: about 10 KB/s). The command's output is printed; the
# script exits with the command's exit status, or 124 when the machine ran
# out of time, or 125 when it could not boot.
set -euo pipefail

die() {
    echo "vtx.sh: $*" >&2
    exit 125
}

top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/lib/machine.sh"
vtrace="$top/target/release/vtrace"
out=""
timeout=900
files=()
while [ $# -gt 0 ]; do
    case "$1" in
        --vtrace) vtrace=$2; shift 2 ;;
        --file) files+=("$2"); shift 2 ;;
        --out) out=$2; shift 2 ;;
        --timeout) timeout=$2; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
[ $# -gt 0 ] || die "no command given (see --help)"

for tool in bochs xorriso busybox cpio lz4 strip; do
    command -v "$tool" >/dev/null || die "$tool is missing: scripts/test.sh installs it (bochs bochsbios vgabios isolinux syslinux-common xorriso lz4 busybox-static cpio)"
done
isolinux=/usr/lib/ISOLINUX/isolinux.bin
ldlinux=/usr/lib/syslinux/modules/bios/ldlinux.c32
bios=/usr/share/bochs/BIOS-bochs-latest
vgabios=/usr/share/vgabios/vgabios.bin
for f in "$isolinux" "$ldlinux" "$bios" "$vgabios"; do
    [ -r "$f" ] || die "$f is missing: scripts/test.sh installs it (isolinux syslinux-common bochsbios vgabios)"
done
ldd "$(command -v busybox)" >/dev/null 2>&1 && die "busybox is not the static build: install busybox-static"
[ -x "$vtrace" ] || die "no vtrace binary at $vtrace: build it first (cargo build --release)"
kernel=$(machine_kernel "${VTRACE_VTX_KERNEL:-}")
version=${kernel##*/vmlinuz-}
modules=/lib/modules/$version/kernel
[ -d "$modules" ] || die "no modules for $version in /lib/modules"

work=$(mktemp -d "${TMPDIR:-/tmp}/vtrace-vtx.XXXXXX")
[ -n "${VTRACE_VTX_KEEP:-}" ] && echo "vtx.sh: keeping $work" >&2 || trap 'rm -rf "$work"' EXIT
root=$work/root
machine_root "$root"

# KVM's modules in load order. Their signatures are stripped: checking one
# costs about 3 s of emulated RSA, and an unsigned module only taints.
for m in virt/lib/irqbypass.ko arch/x86/kvm/kvm.ko arch/x86/kvm/kvm-intel.ko; do
    dst=$root/modules/${m##*/}
    machine_module "$modules" "$m" "$dst"
    strip --strip-debug "$dst"
done

machine_vtrace "$root" "$vtrace"
machine_files "$root" ${files[@]+"${files[@]}"}

# The command, quoted once for the guest's shell.
printf '%q ' "$@" >"$root/command"

machine_init "$root" VTX irqbypass kvm kvm-intel
cat >>"$root/init" <<'EOF'
if [ -n "$(ls -A /out)" ]; then
    echo VTX-OUT-BEGIN
    tar cf - -C /out . | gzip -c | base64
    echo VTX-OUT-END
fi
# The serial driver sends what is written from its own buffer, by
# interrupts: give it time to drain before the power goes.
sleep 1
poweroff -f
EOF
chmod +x "$root/init"
# The BIOS reads the CD at about 2 MB/s: lz4 (legacy frames, as the kernel
# wants them) halves the initramfs and unpacks fast.
(cd "$root" && find . | cpio -o -H newc --quiet) | lz4 -l -q -c >"$work/iso-initrd.lz4"

iso=$work/iso
mkdir -p "$iso/isolinux"
cp "$isolinux" "$ldlinux" "$iso/isolinux/"
cp "$kernel" "$iso/vmlinuz"
mv "$work/iso-initrd.lz4" "$iso/initrd.lz4"
# cryptomgr.notests: the crypto self-tests cost about 15 s of emulation.
cat >"$iso/isolinux/isolinux.cfg" <<'EOF'
DEFAULT linux
PROMPT 0
TIMEOUT 0
LABEL linux
  KERNEL /vmlinuz
  APPEND initrd=/initrd.lz4 console=ttyS0,115200 rdinit=/init panic=-1 quiet mitigations=off cryptomgr.notests
EOF
xorriso -as mkisofs -quiet -o "$work/boot.iso" -b isolinux/isolinux.bin -c isolinux/boot.cat \
    -no-emul-boot -boot-load-size 4 -boot-info-table "$iso" 2>"$work/xorriso.err" ||
    { cat "$work/xorriso.err" >&2; die "xorriso could not make the boot CD"; }

# corei7_haswell_4770 has VMX with EPT and unrestricted guest, and a clock
# Linux reads right (skylake_x's runs ~70x fast; tigerlake and icelake_u hang
# on their XSAVE layout). Debian ships no `nogui` display: rfb listens for a
# viewer that never comes (timeout=0), inside a network namespace of its own
# where one can be made. Bochs is given names relative to the work folder:
# a long path overflows one of its buffers (it aborts).
log=$work/console.log
cat >"$work/bochsrc" <<EOF
cpu: model=corei7_haswell_4770, count=1, ips=50000000
megs: 1024
clock: sync=none
romimage: file=$bios
vgaromimage: file=$vgabios
ata0-master: type=cdrom, path=boot.iso, status=inserted
boot: cdrom
com1: enabled=1, mode=file, dev=console.log
display_library: rfb, options="timeout=0"
log: bochs.log
error: action=ignore
panic: action=fatal
speaker: enabled=0
sound: driver=dummy
EOF
# Debian's bochs has its debugger built in: it waits at a prompt unless told
# to continue.
echo c >"$work/rc"
: >"$log"

netns=()
unshare -n true 2>/dev/null && netns=(unshare -n)
set +e
(cd "$work" && timeout -k 10 "$timeout" "${netns[@]}" bochs -q -f bochsrc -rc rc \
    </dev/null >"$work/bochs.out" 2>&1)
bochs_status=$?
set -e
tr -d '\r' <"$log" >"$work/console.txt"
sed -n '/^VTX-START$/,/^VTX-EXIT/{/^VTX-START$/d;/^VTX-EXIT/d;p}' "$work/console.txt"

if grep -q '^VTX-FAIL' "$work/console.txt"; then
    grep '^VTX-FAIL' "$work/console.txt" >&2
    die "the machine did not come up"
fi
status=$(sed -n 's/^VTX-EXIT \([0-9]*\).*/\1/p' "$work/console.txt" | tail -n 1)
if [ -z "$status" ]; then
    if [ "$bochs_status" -eq 124 ] || [ "$bochs_status" -eq 137 ]; then
        echo "vtx.sh: the machine ran out of time (${timeout} s)" >&2
        exit 124
    fi
    tail -n 20 "$work/console.txt" >&2
    tail -n 5 "$work/bochs.out" >&2
    die "the machine stopped before the command ended (Bochs status $bochs_status)"
fi
if [ -n "$out" ]; then
    mkdir -p "$out"
    if grep -q '^VTX-OUT-END$' "$work/console.txt"; then
        sed -n '/^VTX-OUT-BEGIN$/,/^VTX-OUT-END$/{/^VTX-OUT-/d;p}' "$work/console.txt" |
            base64 -d | tar xzf - -C "$out" || echo "vtx.sh: /out came back damaged" >&2
    fi
fi
exit "$status"
