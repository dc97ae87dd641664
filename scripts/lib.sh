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
  postgresql          # the tests' PostgreSQL server (test-support/src/pg_cluster.rs: initdb, pg_ctl, psql)
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
    timeout 900 "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive timeout 1200 "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
  command -v cargo >/dev/null 2>&1 || { echo "cargo not found: install a Rust toolchain (rustup) first" >&2; exit 1; }
}

# A throwaway PostgreSQL server in DIR (a new, empty directory), started the
# way the tests start theirs (test-support/src/pg_cluster.rs): the newest
# /usr/lib/postgresql/<version>/bin, as postgres when root (initdb refuses
# root), on a free loopback port, TLS only over TCP (pg_hba hostssl, a
# throwaway CA in DIR/ca.crt), trust over the Unix socket in DIR (0700).
# Unlike the tests' server it keeps PostgreSQL's durable defaults (fsync,
# synchronous_commit), as SQLite's WAL does. PG_MAX_CONNECTIONS sessions
# (default 200). Sets PG_BIN and PG_PORT; the caller stops it with pg_stop
# DIR (in its EXIT trap).
pg_start() {
  local dir=$1 as=() port
  PG_BIN=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin 2>/dev/null | sort -V | tail -1)
  if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/initdb" ]; then
    echo "PostgreSQL is not installed: no /usr/lib/postgresql/<version>/bin/initdb (Debian's postgresql package)" >&2
    return 1
  fi
  chmod 700 "$dir"
  (
    cd "$dir" || exit 1
    umask 077
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=bcd bench PostgreSQL CA" \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
      -keyout ca.key -out ca.crt 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost \
      -keyout server.key -out server.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext \
      -out server.crt 2>/dev/null
    chmod 644 ca.crt server.crt
  )
  if [ "$(id -u)" -eq 0 ]; then
    as=(runuser -u postgres --)
    chown -R postgres: "$dir"
  fi
  (cd "$dir" && "${as[@]}" "$PG_BIN/initdb" -D "$dir/data" -U bcd --auth=trust -E UTF8 --locale=C >"$dir/initdb.log" 2>&1) || {
    cat "$dir/initdb.log" >&2
    return 1
  }
  cat >> "$dir/data/postgresql.conf" <<CONF
# scripts/lib.sh pg_start
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
ssl = on
ssl_cert_file = '$dir/server.crt'
ssl_key_file = '$dir/server.key'
max_connections = ${PG_MAX_CONNECTIONS:-200}
CONF
  printf 'local all all trust\nhostssl all all 127.0.0.1/32 trust\n' > "$dir/data/pg_hba.conf"
  for _ in $(seq 10); do
    port=$(( 20000 + RANDOM % 20000 ))
    if (cd "$dir" && "${as[@]}" "$PG_BIN/pg_ctl" -w -D "$dir/data" -l "$dir/server.log" -o "-p $port" start >/dev/null); then
      PG_PORT=$port
      return
    fi
    grep -q 'could not bind' "$dir/server.log" 2>/dev/null || { cat "$dir/server.log" >&2; return 1; }
  done
  echo "PostgreSQL: no free port after 10 attempts" >&2
  return 1
}

# Stops pg_start's server in DIR at once (nothing in it is kept).
pg_stop() {
  local dir=$1 as=()
  [ -f "$dir/data/postmaster.pid" ] || return 0
  [ "$(id -u)" -eq 0 ] && as=(runuser -u postgres --)
  (cd "$dir" && "${as[@]}" "$PG_BIN/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1) || true
}

# psql on database DB of pg_start's server in DIR, over its Unix socket: SQL
# from the remaining arguments, unaligned, tuples only, stopping at an error.
pg_psql() {
  local dir=$1 db=$2
  shift 2
  "$PG_BIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$dir" -p "$PG_PORT" -U bcd -d "$db" "$@"
}
