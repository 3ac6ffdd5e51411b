#!/usr/bin/env bash
# What building the host needs beyond Rust: the wasm target for the plugins, and libclang
# (Debian's libclang-dev) for the RocksDB bindings of the `rocksdb` state backend, which
# `cargo build` generates. Sourced by demo.sh and test.sh; safe to run again.
set -euo pipefail

rustup target add wasm32-wasip2

if ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 &&
  ! ls /usr/lib/*/libclang*.so* >/dev/null 2>&1; then
  as_root=""
  if [ "$(id -u)" -ne 0 ]; then as_root="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $as_root apt-get install -y -qq libclang-dev >/dev/null ||
    { $as_root apt-get update -qq && $as_root apt-get install -y -qq libclang-dev >/dev/null; }
fi
