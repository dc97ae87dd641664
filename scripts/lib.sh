# Shared by scripts/demo, scripts/test and scripts/bench: make a fresh Debian
# machine able to build and run everything, without downloading anything but
# Debian packages and crates.

# Debian packages the build and the tests need.
BCD_PACKAGES=(
  pkg-config gcc libc6-dev ca-certificates
  protobuf-compiler   # prost-build runs the system protoc
  libsqlite3-dev      # rusqlite links the system SQLite
  libtss2-dev         # tss-esapi links libtss2 (esys, tctildr, mu)
  swtpm swtpm-tools tpm2-tools
  util-linux          # prlimit: the e2e load tests cap the control plane's descriptors
  shellcheck          # the e2e tests lint the install script
  dpkg-dev            # scripts/package: dpkg-shlibdeps computes Depends
  systemd             # systemd-socket-activate: the e2e test of bcd helper under socket activation
  curl openssl        # the e2e tests fetch from the control plane and read its certificates
  busybox-static      # a unit test unpacks bcd site's cpio archive with busybox cpio
  xxd time            # scripts/bench: tpm2-tools' inputs, peak memory (/usr/bin/time)
  postgresql          # the tests' PostgreSQL server (controlplane/src/pg_cluster.rs: initdb, pg_ctl, psql)
)

# Installs the missing packages, running `apt-get update` once when needed.
ensure_packages() {
  local missing=()
  local p
  for p in "${BCD_PACKAGES[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = 'install ok installed' ] || missing+=("$p")
  done
  if ((${#missing[@]})); then
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    echo "installing Debian packages: ${missing[*]}" >&2
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
  command -v cargo >/dev/null 2>&1 || { echo "cargo not found: install a Rust toolchain (rustup) first" >&2; exit 1; }
}
