#!/bin/sh
# bcd installer, written by `bc-controlplane install-script`.
#
# Installs or upgrades bcd @VERSION@ from the control plane at @API@ (the
# package's SHA-256 and the control plane's CA are pinned below), writes
# /etc/bcd/config.toml, takes the bcd user out of the tss group, joins with
# the @ATTESTOR@ attestor, then enables and (re)starts the units. Run it as
# root. Running it again upgrades bcd and keeps the node ("already joined
# as <node>").
@ATTESTOR_DOC@
set -eu
umask 022

api='@API@'
package='@PACKAGE@'
package_sha256='@SHA256@'
attestor='@ATTESTOR@'
config=/etc/bcd/config.toml
@VARS@
# Transitional: bcd node runs as root, opening the TPM itself, only while
# the installed bcd has no `bcd helper` (see step 3).
no_helper_dropin=/etc/systemd/system/bcd-node.service.d/10-no-helper.conf
no_helper_tmpfiles=/etc/tmpfiles.d/bcd.conf
# Whether this script changed a unit (systemd must reread them).
units_changed=no

say() { printf 'bcd-install: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run this script as root"
if [ "$attestor" = tpm ] && [ ! -c /dev/tpmrm0 ]; then
  die "no TPM: /dev/tpmrm0 is missing, and this script joins with --attestor tpm (enable the TPM, or use a join-token script)"
fi
for tool in curl sha256sum dpkg systemctl; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (apt-get install curl ca-certificates)"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
cat >"$work/ca.pem" <<'BCD_CA_EOF'
@CA@BCD_CA_EOF

# 1. The package, over TLS pinned to the control plane's CA (no other CA is
# trusted), then checked against the pinned SHA-256. curl retries with a
# doubling pause.
say "downloading $package from $api"
curl --fail --silent --show-error --proto '=https' --tlsv1.2 --cacert "$work/ca.pem" \
  --connect-timeout 10 --max-time 600 --retry 6 --retry-connrefused \
  --max-filesize @MAX_BYTES@ -o "$work/$package" "$api/dist/$package" ||
  die "cannot download $api/dist/$package"
actual=$(sha256sum "$work/$package" | cut -d' ' -f1)
[ "$actual" = "$package_sha256" ] ||
  die "$package has SHA-256 $actual, not the pinned $package_sha256: refusing to install it"

# 2. Install or upgrade; apt-get brings the Depends (libtss2), dpkg alone
# where there is no apt. apt's sandbox user must be able to read the file.
chmod 0755 "$work"
chmod 0644 "$work/$package"
if command -v apt-get >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "$work/$package" >&2 || die "cannot install $package"
else
  dpkg -i "$work/$package" >&2 || die "cannot install $package"
fi
version=$(dpkg-query -W -f='${Version}' bcd)

# 3. The configuration: this control plane's pins, and [helper] when this
# bcd has a root helper. Written whole, then renamed over the old one.
cat >"$work/config.toml" <<'BCD_CONFIG_EOF'
@CONFIG@BCD_CONFIG_EOF
if bcd helper --help >/dev/null 2>&1; then
  printf '\n# bcd node (user bcd) reaches the TPM only through bcd helper (root).\n[helper]\n' >>"$work/config.toml"
  # A bcd without a helper ran before: its drop-in goes, so units change.
  [ ! -e "$no_helper_dropin" ] || units_changed=yes
  rm -f "$no_helper_dropin" "$no_helper_tmpfiles"
  # The data directory is the node's user's (a root node may have left it root's).
  systemd-tmpfiles --create bcd.conf
  chown -R bcd:bcd /var/lib/bcd
  helper=yes
else
  say "bcd $version has no root helper: bcd node runs as root until a bcd with one is installed"
  units_changed=yes
  mkdir -p "${no_helper_dropin%/*}"
  cat >"$no_helper_dropin" <<'BCD_DROPIN_EOF'
# Written by the bcd install script for a bcd without `bcd helper`: bcd node
# then opens the TPM itself, as root. Removed by the script once bcd has one.
[Service]
User=root
Group=root
PrivateUsers=no
PrivateDevices=no
DeviceAllow=/dev/tpmrm0 rw
# /dev/tpmrm0 is tss:tss 0660 and the unit keeps no capability.
SupplementaryGroups=tss
BCD_DROPIN_EOF
  # bcd refuses a data directory that is not its user's: root's, then.
  printf 'd /var/lib/bcd 0700 root root -\nd /run/bcd 0755 root root -\n' >"$no_helper_tmpfiles"
  systemd-tmpfiles --create bcd.conf
  helper=no
fi
install -d -m 0755 /etc/bcd
install -m 0644 "$work/config.toml" "$config.new"
mv -f "$config.new" "$config"

# 4. bcd is never in tss: whoever opens /dev/tpmrm0 can clear the TPM.
if id -nG bcd 2>/dev/null | tr ' ' '\n' | grep -qx tss; then
  gpasswd -d bcd tss >/dev/null
  say "took bcd out of the tss group"
fi

# 5. The helper first: bcd status, as the node's user, reaches the node key
# through it.
# systemd rereads its units only when this script changed one (the
# package's postinst reloaded for its own files): each reload runs every
# generator, seconds on a small VM, and `enable` reloads too.
[ "$units_changed" = no ] || systemctl daemon-reload
if [ "$helper" = yes ]; then
  systemctl -q is-enabled bcd-helper.socket 2>/dev/null || systemctl enable bcd-helper.socket >/dev/null 2>&1
  systemctl start bcd-helper.socket
  systemctl try-restart bcd-helper.service
else
  systemctl disable --now bcd-helper.socket >/dev/null 2>&1 || true
fi

# 6. Join, unless this machine already has an identity.
# bcd status runs as the user that runs bcd node (whose data directory it is).
node_id() {
  if [ "$helper" = yes ]; then
    setpriv --reuid=bcd --regid=bcd --init-groups -- bcd status --json --config "$config" 2>/dev/null
  else
    bcd status --json --config "$config" 2>/dev/null
  fi | sed -n 's/^ *"nodeId": *"\([^"]*\)".*/\1/p'
}
node=$(node_id)
if [ -n "$node" ]; then
  say "already joined as $node"
else
@JOIN@
  node=$(node_id)
  [ -n "$node" ] || die "bcd join succeeded but bcd status shows no identity"
  say "joined as $node"
fi

# 7. The node, restarted so that an upgrade runs the new binary.
systemctl -q is-enabled bcd-node.service 2>/dev/null || systemctl enable bcd-node.service >/dev/null 2>&1
systemctl restart bcd-node.service
say "bcd $version installed; node $node; bcd-node restarted"
