#!/usr/bin/env bash
# Fetches FlashAttention-4 and what it needs for a CUDA 13 host with Python 3.12 into DIR, for
# bench/device.sh fa4 on a machine without network (its FA4_STAGE):
#   bash bench/fa4_wheels.sh DIR
# nvidia-cutlass-dsl-libs-cu13 is over 90 MB; its files are repacked as one tar.xz cut into two
# pieces (DIR/cu13.part00, .part01) so that each fits a 64 MiB transfer; the other wheels stay as
# they are. Exit status: pip's, unzip's or xz's on failure; 2 for a usage error.
set -euo pipefail
[ $# -eq 1 ] || { echo "error: usage: bash bench/fa4_wheels.sh DIR" >&2; exit 2; }
DIR=$1
mkdir -p "$DIR"
WHEELS=(flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
        nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5
        apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$DIR" "${WHEELS[@]}"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
unzip -q "$DIR"/nvidia_cutlass_dsl_libs_cu13-*.whl -d "$TMP/files"
tar -C "$TMP/files" -cf - . | xz -T0 -6 > "$TMP/cu13.tar.xz"
split -n 2 -d "$TMP/cu13.tar.xz" "$DIR/cu13.part"
rm "$DIR"/nvidia_cutlass_dsl_libs_cu13-*.whl
ls -l "$DIR"
