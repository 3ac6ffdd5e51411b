#!/usr/bin/env bash
# What building the host needs beyond Rust: the wasm target for the plugins, libclang
# (Debian's libclang-dev) for the RocksDB bindings of the `rocksdb` state backend, which
# `cargo build` generates, and OpenSSL's headers (libssl-dev, found with pkg-config) for
# the Kafka client's TLS and SASL. Sourced by demo.sh and test.sh; safe to run again.
set -euo pipefail

rustup target add wasm32-wasip2

# (libclang itself: `libclang-cpp`, which other packages bring, is not what bindgen loads.)
have_libclang() {
  local dir
  for dir in /usr/lib/llvm-*/lib /usr/lib/*; do
    compgen -G "$dir/libclang.so*" >/dev/null || compgen -G "$dir/libclang-[0-9]*.so*" >/dev/null &&
      return 0
  done
  return 1
}
missing=()
have_libclang || missing+=(libclang-dev)
command -v pkg-config >/dev/null || missing+=(pkg-config)
pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev)
if [ ${#missing[@]} -gt 0 ]; then
  as_root=""
  if [ "$(id -u)" -ne 0 ]; then as_root="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $as_root apt-get install -y -qq "${missing[@]}" >/dev/null ||
    { $as_root apt-get update -qq && $as_root apt-get install -y -qq "${missing[@]}" >/dev/null; }
fi
