# Shared by scripts/vmtest (and scripts/pxetest): the Debian packages that
# run QEMU guests on these machines (../shared/vm-notes.md).

# QEMU comes from bookworm-backports: the image's qemu-utils is 10.x from
# there, and bookworm's QEMU 7.2 would remove it. The backports source is
# derived from the mirror already configured, never written into the repo.
# fdisk: sfdisk partitions the disk image scripts/pxetest wipes.
BCD_VM_PACKAGES=(qemu-system-x86 qemu-utils ipxe-qemu busybox-static mmdebstrap e2fsprogs openssl python3 fdisk)

ensure_vm_packages() {
  local missing=() p
  for p in "${BCD_VM_PACKAGES[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = 'install ok installed' ] || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  local bpo=/etc/apt/sources.list.d/bcd-bookworm-backports.sources
  if [ ! -e "$bpo" ] && ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    local uri
    uri=$(awk '/^URIs:/ && $2 !~ /security/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    if [ -n "$uri" ]; then
      printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uri" |
        "${sudo[@]}" tee "$bpo" >/dev/null
    fi
  fi
  echo "installing Debian packages: ${missing[*]}" >&2
  timeout 900 "${sudo[@]}" apt-get update -qq
  local release=()
  # Not `apt-cache policy … | grep -q`: under pipefail grep's early exit
  # kills apt-cache with SIGPIPE, the test reads 141 and backports are never
  # asked for (issue 16).
  local policy
  policy=$(apt-cache policy qemu-system-x86)
  [[ $policy == *bookworm-backports* ]] && release=(-t bookworm-backports)
  DEBIAN_FRONTEND=noninteractive timeout 1200 "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${release[@]}" "${missing[@]}" >/dev/null
}

# wait_line REGEX SECONDS FILE...: waits until a line of one of the files
# (read as they grow; they may not exist yet) matches REGEX (bash =~), for
# at most SECONDS, and prints it. Returns 1 at the deadline. A wait on what
# a process writes, with a deadline, instead of a polling loop.
wait_line() {
  local re=$1 secs=$2 line fd pid left rc=1
  shift 2
  local deadline=$(($(date +%s) + secs))
  exec {fd}< <(exec tail -n +1 -q -F "$@" 2>/dev/null)
  pid=$!
  while left=$((deadline - $(date +%s))); ((left > 0)); do
    IFS= read -r -t "$left" -u "$fd" line || break
    if [[ $line =~ $re ]]; then
      printf '%s\n' "$line"
      rc=0
      break
    fi
  done
  kill "$pid" 2>/dev/null || true
  exec {fd}<&-
  return "$rc"
}

# wait_gone PID SECONDS: waits until process PID (not necessarily our child)
# is gone, for at most SECONDS. Returns 1 if it is still there.
wait_gone() {
  local deadline=$(($(date +%s) + $2))
  while kill -0 "$1" 2>/dev/null; do
    (($(date +%s) < deadline)) || return 1
    sleep 0.05
  done
}
