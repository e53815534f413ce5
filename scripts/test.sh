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

# The second engine's library: Bochs's CPU from Debian's source package
# with vtrace's C ABI over it, built once and cached (scripts/engine.sh);
# bochs/tests/ runs it, and under CI requires it.
echo "scripts/test.sh: the engine's library ($SECONDS s so far)"
scripts/engine.sh >/dev/null

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
    # Two at a time, one per core, longest first (a file that is not in
    # the list runs after those in it): each worker takes the next test
    # file when its last is done. The two test machines' emulators are one
    # thread each (QEMU's TCG with one CPU, Bochs) and each machine's tests
    # take their turns in it, so each of those files alone would leave a
    # core idle for a quarter of an hour; they start together, and the
    # rest fill in behind whichever ends first. Bochs keeps time by
    # instructions (clock: sync=none), so what runs beside it cannot
    # change what its guests do. tests/run_linux.rs boots its Linux
    # guests one at a time. Last, every package's unit tests and other
    # test files, and the doc tests, always as the whole workspace: cargo
    # unifies dependencies' features over the packages it is given, and
    # `--exclude vtrace` built every dependency a second time (2.5 min).
    # The seconds each file took are printed, to keep the order true.
    longest_first=(amdv vtx run_linux engine trace smp peep gdb robustness export analyze
        conventions captures typed_probes memory_values probes nest_filters
        timeline_perfetto symbolize function_windows tracepoints run_demo doctor)
    queue=()
    for name in "${longest_first[@]}"; do
        [ -f "tests/$name.rs" ] && queue+=("$name")
    done
    for file in tests/*.rs; do
        name="$(basename "$file" .rs)"
        case " ${longest_first[*]} " in
        *" $name "*) ;;
        *) queue+=("$name") ;;
        esac
    done
    others=()
    shopt -s nullglob
    for file in */tests/*.rs */*/tests/*.rs; do
        others+=(--test "$(basename "$file" .rs)")
    done
    shopt -u nullglob
    queue+=(:workspace)
    # One file at a time prints its output.
    output_lock="$(mktemp)"
    run_test_file() {
        local name=$1 log status=0 started=$SECONDS
        log="$(mktemp)"
        case "$name" in
        run_linux) cargo test --test run_linux -- --test-threads 1 >"$log" 2>&1 || status=$? ;;
        :workspace)
            # shellcheck disable=SC2086 # one word per option
            { cargo test --workspace --lib --bins $TEST_SH_OTHERS &&
                cargo test --workspace --doc; } >"$log" 2>&1 || status=$?
            ;;
        *) cargo test --test "$name" >"$log" 2>&1 || status=$? ;;
        esac
        {
            flock 9
            cat "$log"
            if [ "$status" -eq 0 ]; then
                echo "scripts/test.sh: $name passed in $((SECONDS - started)) s"
            else
                echo "scripts/test.sh: $name FAILED (status $status) in $((SECONDS - started)) s"
            fi
        } 9>>"$TEST_SH_OUTPUT_LOCK"
        rm -f "$log"
        return "$status"
    }
    export -f run_test_file
    export TEST_SH_OTHERS="${others[*]}" TEST_SH_OUTPUT_LOCK="$output_lock"
    echo "scripts/test.sh: cargo test, two test files at a time ($SECONDS s so far)"
    status=0
    printf '%s\n' "${queue[@]}" | xargs -P 2 -n 1 bash -c 'run_test_file "$1"' _ || status=$?
    rm -f "$output_lock"
    if [ "$status" -ne 0 ]; then
        echo "scripts/test.sh: tests failed"
        exit 1
    fi
else
    cargo test --workspace "$@"
fi
echo "scripts/test.sh: tests passed ($SECONDS s so far)"

# Each fuzz target for a short, bounded time from its seeds (real traces,
# images and symbol files in fuzz/seeds), two at a time (one per core); a
# crash fails the suite and leaves its input in fuzz/artifacts/.
# VTRACE_FUZZ_SECONDS=0 skips this. The targets are built once first, with
# 16 codegen units: cargo fuzz's default of one leaves a core idle while
# the largest crates are optimised, and the build is most of this phase.
seconds="${VTRACE_FUZZ_SECONDS:-10}"
if [ "$seconds" -gt 0 ]; then
    echo "scripts/test.sh: building the fuzz targets ($SECONDS s so far)"
    cargo fuzz build --sanitizer none --release --codegen-units 16
    fuzz_target() {
        local target=$1 corpus status=0
        corpus="$(mktemp -d)"
        # TMPDIR: what a target writes (the boot target's initrd) goes with
        # the corpus.
        TMPDIR="$corpus" cargo fuzz run --sanitizer none --release --codegen-units 16 \
            "$target" "$corpus" "fuzz/seeds/$target" -- \
            -max_total_time="$TEST_SH_FUZZ_SECONDS" -rss_limit_mb=2048 -print_final_stats=1 \
            >"$corpus.log" 2>&1 || status=$?
        {
            flock 9
            echo "scripts/test.sh: fuzzed $target for $TEST_SH_FUZZ_SECONDS s"
            grep -E '^stat::number_of_executed_units|panicked at|SUMMARY' "$corpus.log" || true
            if [ "$status" -ne 0 ]; then
                tail -n 40 "$corpus.log"
                echo "scripts/test.sh: fuzz target $target failed (input in fuzz/artifacts/$target)"
            fi
        } 9>>"$TEST_SH_OUTPUT_LOCK"
        rm -rf "$corpus" "$corpus.log"
        return "$status"
    }
    export -f fuzz_target
    output_lock="$(mktemp)"
    export TEST_SH_FUZZ_SECONDS="$seconds" TEST_SH_OUTPUT_LOCK="$output_lock"
    status=0
    cargo fuzz list | xargs -P 2 -n 1 bash -c 'fuzz_target "$1"' _ || status=$?
    rm -f "$output_lock"
    if [ "$status" -ne 0 ]; then
        echo "scripts/test.sh: fuzzing failed"
        exit 1
    fi
fi
