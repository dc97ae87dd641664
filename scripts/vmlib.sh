# shellcheck shell=bash
# Shared by scripts/vmtest (and scripts/pxetest): the Debian packages that
# run QEMU guests on these machines (../shared/vm-notes.md).

# QEMU comes from bookworm-backports: the image's qemu-utils is 10.x from
# there, and bookworm's QEMU 7.2 would remove it. The backports source is
# derived from the mirror already configured, never written into the repo.
# fdisk: sfdisk partitions the disk image scripts/pxetest wipes; zstd
# compresses the image its lifecycle round deploys. scripts/sbtest's UEFI
# guest: ovmf (the Secure Boot firmware and its variable stores), dosfstools
# and mtools (the ESP, made and filled without a loop mount); shim, grub and
# the kernels are downloaded and unpacked, not installed.
BCD_VM_PACKAGES=(qemu-system-x86 qemu-utils ipxe-qemu busybox-static mmdebstrap e2fsprogs openssl python3 fdisk zstd ovmf dosfstools mtools)

# ensure_backports: a bookworm-backports source beside the mirror apt
# already uses (any deb822 *.sources file, or a one-line sources.list), unless
# one is configured; returns 0 when it wrote one (apt-get update is then
# the caller's). The CI machines' image ships backports packages with the
# source removed, and scripts/sbtest downloads a backports kernel.
ensure_backports() {
  local bpo=/etc/apt/sources.list.d/bcd-bookworm-backports.sources uri sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  [ ! -e "$bpo" ] && ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/ || return 1
  uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ && $2 !~ /security/ { print $2; exit }' || true)
  [ -n "$uri" ] ||
    uri=$(awk '$1 == "deb" && $0 ~ / bookworm / && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$uri" ] || return 1
  printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uri" |
    "${sudo[@]}" tee "$bpo" >/dev/null
}

ensure_vm_packages() {
  local missing=() p
  for p in "${BCD_VM_PACKAGES[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = 'install ok installed' ] || missing+=("$p")
  done
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  if ! ((${#missing[@]})); then
    # Everything installed; scripts/sbtest still needs the backports index.
    if ensure_backports; then timeout 900 "${sudo[@]}" apt-get update -qq; fi
    return 0
  fi
  ensure_backports || true
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

# unpacked_deb CACHE PKG: Debian package PKG (an exact name) downloaded and
# unpacked (dpkg-deb -x, not installed: no maintainer scripts run) into
# CACHE/PKG/root, once.
unpacked_deb() {
  local dir=$1/$2
  [ ! -d "$dir/root" ] || return 0
  log "downloading $2"
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  (cd "$dir.tmp" && apt-get download -q -o APT::Sandbox::User=root "$2" >/dev/null && dpkg-deb -x ./*.deb root && rm -f ./*.deb) ||
    { log "cannot download $2"; exit 1; }
  mv "$dir.tmp" "$dir"
}

# guest_image CACHE WORK: Debian's cloud kernel (unpacked, not installed) and
# a Debian 12 root filesystem image with systemd and cloud-init (mmdebstrap,
# ext4, no partition table), cached under CACHE by a hash of their inputs.
# Sets vmlinuz, kver and image. GUEST_EXTRA_KERNELS (an array, may be
# unset) names other kernel packages whose modules go in the image too. Used by scripts/vmtest's guests and by
# scripts/pxetest's lifecycle round, which deploys this image onto a disk.
# shellcheck disable=SC2034,SC2154 # sets vmlinuz, kver, image; root is the caller's
guest_image() {
  local cache=$1 work=$2 kpkg kdir g include hooks key rootdir t0 h hook_args lock
  # One builder at a time: scripts/test runs the guest stages side by side,
  # and a cold cache would be downloaded and built twice into the same names.
  mkdir -p "$cache"
  exec {lock}>"$cache/.guest-image.lock"
  flock "$lock"
  kpkg=$(apt-cache depends linux-image-cloud-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | sed -n 1p)
  [ -n "$kpkg" ] || { log "cannot resolve linux-image-cloud-amd64"; exit 1; }
  unpacked_deb "$cache" "$kpkg"
  kdir=$cache/$kpkg
  kver=${kpkg#linux-image-}
  vmlinuz=$kdir/root/boot/vmlinuz-$kver

  # The root filesystem image, cached by its inputs.
  include=systemd,systemd-sysv,udev,dbus,iproute2,kmod,cloud-init,curl,ca-certificates,util-linux
  # bcd's Depends are in the image so that apt-get installs the package offline
  # (the guest reaches nothing but the control plane and the seed).
  include+=,libtss2-esys-3.0.2-0,libtss2-mu0,libtss2-tctildr0,libtss2-tcti-device0,libsqlite3-0
  g=$root/tests/vm/image
  hooks=(
    "cp -a '$kdir/root/lib/modules' \"\$1/lib/\" && chroot \"\$1\" depmod -a '$kver'"
    "install -D -m 0644 '$g/10-dhcp.network' \"\$1/etc/systemd/network/10-dhcp.network\""
    "install -D -m 0644 '$g/90-bcd-vmtest.cfg' \"\$1/etc/cloud/cloud.cfg.d/90-bcd-vmtest.cfg\""
    "install -D -m 0755 '$g/bcd-vmtest-report' \"\$1/usr/local/sbin/bcd-vmtest-report\""
    "install -D -m 0644 '$g/bcd-vmtest-report.service' \"\$1/etc/systemd/system/bcd-vmtest-report.service\""
    "chroot \"\$1\" systemctl enable -q systemd-networkd systemd-networkd-wait-online bcd-vmtest-report.service"
    "chroot \"\$1\" systemctl mask -q apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer"
    "echo bcd-vmtest > \"\$1/etc/hostname\""
  )
  # Other kernels' modules (GUEST_EXTRA_KERNELS, versioned package names):
  # a guest booted into one of them still has its NIC (scripts/sbtest).
  local xpkg
  for xpkg in "${GUEST_EXTRA_KERNELS[@]}"; do
    unpacked_deb "$cache" "$xpkg"
    hooks+=("cp -a '$cache/$xpkg/root/lib/modules' \"\$1/lib/\" && chroot \"\$1\" depmod -a '${xpkg#linux-image-}'")
  done
  # The image's inputs: packages, kernel, hooks and the guest files they copy
  # (paths made relative, so every clone shares the cache).
  key=$( { echo "$include $kpkg"; printf '%s\n' "${hooks[@]}" | sed "s|$root/||g"; cat "$g"/*; } | sha256sum | cut -c1-16)
  image=$cache/rootfs-$key.img
  if [ ! -f "$image" ]; then
    log "building the guest image $image (mmdebstrap)"
    t0=$(date +%s)
    rootdir=$work/rootfs
    hook_args=()
    for h in "${hooks[@]}"; do hook_args+=(--customize-hook="$h"); done
    # The mirror this machine's apt uses (deb822 or one-line), else
    # mmdebstrap's default: a fresh machine may have either file.
    local mirror=()
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
      mirror=(/etc/apt/sources.list.d/debian.sources)
    elif [ -s /etc/apt/sources.list ]; then
      mirror=(/etc/apt/sources.list)
    fi
    mmdebstrap --quiet --variant=minbase --include="$include" "${hook_args[@]}" \
      bookworm "$rootdir" "${mirror[@]}"
    mkfs.ext4 -q -L root -d "$rootdir" "$work/rootfs.img" 1536M >/dev/null
    rm -rf "$rootdir"
    mv "$work/rootfs.img" "$image.tmp" && mv "$image.tmp" "$image"
    log "image built in $(( $(date +%s) - t0 )) s"
    # Older images of this cache are of no use any more.
    find "$cache" -maxdepth 1 -name 'rootfs-*.img' ! -name "rootfs-$key.img" -delete
  fi
  exec {lock}>&-
}
