#!/usr/bin/env bash
# Runs vtrace's test suite on a fresh machine: installs what the tests need
# (a stock Linux kernel image to boot, headless Chromium for the HTML
# report, DuckDB to read exports), then runs every test.
# Idempotent: what is already installed is not installed again.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# A real, unmodified Linux kernel for tests/run_linux.rs.
if [ -z "${VTRACE_TEST_KERNEL:-}" ] && ! ls /boot/vmlinuz-* >/dev/null 2>&1; then
    echo "scripts/test.sh: installing linux-image-cloud-amd64 (a kernel to boot in the tests)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
        linux-image-cloud-amd64 >/dev/null
fi

# setpriv (util-linux) lets a test drop root to check the /dev/kvm permission error.
if ! command -v setpriv >/dev/null 2>&1; then
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq util-linux >/dev/null
fi

# The AMD-V test machine (scripts/amdv.sh, tests/amdv.rs): QEMU emulating an
# AMD CPU with SVM, busybox for its userspace, cpio to pack it.
missing=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || missing+=(qemu-system-x86)
# A static busybox: it runs in the machine without shared libraries.
if ! command -v busybox >/dev/null 2>&1 || ldd "$(command -v busybox)" >/dev/null 2>&1; then
    missing+=(busybox-static)
fi
command -v cpio >/dev/null 2>&1 || missing+=(cpio)
# The VT-x test machine (scripts/vtx.sh, tests/vtx.rs): Bochs emulating an
# Intel CPU with VMX, booted from an isolinux CD that xorriso makes, with
# an lz4 initramfs.
command -v bochs >/dev/null 2>&1 || missing+=(bochs)
[ -r /usr/share/bochs/BIOS-bochs-latest ] || missing+=(bochsbios)
[ -r /usr/share/vgabios/vgabios.bin ] || missing+=(vgabios)
[ -r /usr/lib/ISOLINUX/isolinux.bin ] || missing+=(isolinux)
[ -r /usr/lib/syslinux/modules/bios/ldlinux.c32 ] || missing+=(syslinux-common)
command -v xorriso >/dev/null 2>&1 || missing+=(xorriso)
command -v lz4 >/dev/null 2>&1 || missing+=(lz4)
if [ ${#missing[@]} -gt 0 ]; then
    echo "scripts/test.sh: installing ${missing[*]} (the AMD-V and VT-x test machines)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

# gdb drives `vtrace analyze gdb` in tests/gdb.rs, as a user would.
if ! command -v gdb >/dev/null 2>&1; then
    echo "scripts/test.sh: installing gdb (the debugger tests drive it)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
        gdb >/dev/null
fi

# Headless Chromium renders `vtrace analyze report` pages in tests/analyze.rs.
if ! command -v chromium >/dev/null 2>&1; then
    echo "scripts/test.sh: installing chromium (renders the HTML report in the tests)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
        chromium >/dev/null
fi

# DuckDB (the Python package) reads `vtrace analyze export`'s Parquet and
# JSON lines back in tests/export.rs, as a user's own tools would; pyarrow
# (what pandas reads Parquet with) reads it there too.
if ! command -v python3 >/dev/null 2>&1 || ! python3 -m pip --version >/dev/null 2>&1; then
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq python3 python3-pip >/dev/null
fi
if ! python3 -c "import duckdb" >/dev/null 2>&1; then
    echo "scripts/test.sh: installing duckdb for Python (reads the exports in the tests)"
    # A distribution's Python refuses pip outside a virtualenv (PEP 668).
    python3 -m pip install --quiet --disable-pip-version-check duckdb 2>/dev/null ||
        python3 -m pip install --quiet --disable-pip-version-check --break-system-packages duckdb
fi
if ! python3 -c "import pyarrow" >/dev/null 2>&1; then
    echo "scripts/test.sh: installing pyarrow for Python (reads the exports in the tests)"
    python3 -m pip install --quiet --disable-pip-version-check pyarrow 2>/dev/null ||
        python3 -m pip install --quiet --disable-pip-version-check --break-system-packages pyarrow
fi

# Perfetto's Python package carries Perfetto's own trace message
# definitions: tests/timeline.rs decodes the protobuf timeline with them.
if ! python3 -c "from perfetto.protos.perfetto.trace import perfetto_trace_pb2" >/dev/null 2>&1; then
    echo "scripts/test.sh: installing perfetto for Python (decodes the protobuf timeline in the tests)"
    python3 -m pip install --quiet --disable-pip-version-check perfetto protobuf 2>/dev/null ||
        python3 -m pip install --quiet --disable-pip-version-check --break-system-packages \
            perfetto protobuf
fi

# cargo fuzz (fuzz/): its targets build with the stable toolchain and no
# sanitizer.
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "scripts/test.sh: installing cargo-fuzz (the fuzz targets)"
    cargo install cargo-fuzz --locked --quiet
fi

# Space where the build and the tests write: a linker whose output file
# loses its backing dies with a bus error, which says nothing of why.
echo "scripts/test.sh: free space: $(df -h --output=avail . | tail -n 1 | tr -d ' ') here, $(df -h --output=avail "${TMPDIR:-/tmp}" | tail -n 1 | tr -d ' ') in ${TMPDIR:-/tmp}"

# The code's own bar: formatted, and no clippy warning anywhere.
echo "scripts/test.sh: cargo fmt --check, cargo clippy and cargo doc"
cargo fmt --all -- --check
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo clippy --manifest-path fuzz/Cargo.toml --quiet -- -D warnings
# Documentation links that lead nowhere are bugs in the docs: the public
# docs' (no link to a private item) and the private items' own.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --document-private-items --quiet

echo "scripts/test.sh: building the tests ($SECONDS s so far)"
cargo test --workspace --no-run "$@"
if [ "$#" -eq 0 ]; then
    # The two test machines' emulators are one thread each (QEMU's TCG with
    # one CPU, Bochs), and each machine's tests take their turns in it, so
    # each binary alone leaves a core idle for minutes. The VT-x machine's
    # run beside the rest of the suite, which begins with the AMD-V
    # machine's (tests/amdv.rs comes first): the two emulators get a core
    # each. Bochs keeps time by instructions (clock: sync=none), so what
    # runs beside it cannot change what its guests do. The VT-x machine is
    # done minutes before the AMD-V one; the Linux boots of
    # tests/run_linux.rs follow it there, one at a time, on the core it
    # leaves (the AMD-V tests slow somewhat beside them: they use more
    # than one core, with QEMU's I/O thread and their own analyses).
    echo "scripts/test.sh: cargo test (the VT-x machine's tests, then tests/run_linux.rs, beside the rest, $SECONDS s so far)"
    beside_log="$(mktemp)"
    (
        s=0
        cargo test --test vtx || s=1
        cargo test --test run_linux -- --test-threads 1 || s=1
        exit "$s"
    ) >"$beside_log" 2>&1 &
    beside_pid=$!
    # An interrupted suite takes the machine with it.
    # (set -e holds in the trap too: a command there that fails, as pkill
    # does with nothing left to kill, would fail the suite.)
    trap 'pkill -P "$beside_pid" 2>/dev/null || true; kill "$beside_pid" 2>/dev/null || true' EXIT
    # Every other test file of the root package, named one by one (cargo
    # has no option to leave a test file out), then the other packages.
    mine=()
    for file in tests/*.rs; do
        name="$(basename "$file" .rs)"
        case "$name" in
        vtx | run_linux) ;;
        *) mine+=(--test "$name") ;;
        esac
    done
    status=0
    cargo test -p vtrace --bins "${mine[@]}" || status=$?
    cargo test --workspace --exclude vtrace || status=$?
    beside_status=0
    wait "$beside_pid" || beside_status=$?
    echo "scripts/test.sh: the VT-x machine's tests and tests/run_linux.rs:"
    cat "$beside_log"
    rm -f "$beside_log"
    if [ "$status" -ne 0 ] || [ "$beside_status" -ne 0 ]; then
        echo "scripts/test.sh: tests failed"
        exit 1
    fi
else
    cargo test --workspace "$@"
fi
echo "scripts/test.sh: tests passed ($SECONDS s so far)"

# Each fuzz target for a short, bounded time from its seeds (real traces,
# images and symbol files in fuzz/seeds); a crash fails the suite and
# leaves its input in fuzz/artifacts/. VTRACE_FUZZ_SECONDS=0 skips this.
seconds="${VTRACE_FUZZ_SECONDS:-10}"
if [ "$seconds" -gt 0 ]; then
    for target in $(cargo fuzz list); do
        echo "scripts/test.sh: fuzzing $target for $seconds s"
        corpus="$(mktemp -d)"
        status=0
        # TMPDIR: what a target writes (the boot target's initrd) goes with
        # the corpus.
        TMPDIR="$corpus" cargo fuzz run --sanitizer none --release "$target" "$corpus" \
            "fuzz/seeds/$target" -- \
            -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
            >"$corpus.log" 2>&1 || status=$?
        grep -E '^stat::number_of_executed_units|panicked at|SUMMARY' "$corpus.log" || true
        if [ "$status" -ne 0 ]; then
            tail -n 40 "$corpus.log"
            echo "scripts/test.sh: fuzz target $target failed (input in fuzz/artifacts/$target)"
            exit 1
        fi
        rm -rf "$corpus" "$corpus.log"
    done
fi
