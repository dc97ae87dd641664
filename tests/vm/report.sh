#!/bin/sh
# The guest half of scripts/vmtest (served by its seed server): what the install script left behind,
# one `key=value` line each (multi-line values between `begin KEY` and
# `end KEY`), on stdout, which the unit sends to the host's report file.
# The host decides what passes; this script only looks.
set -u
config=/etc/bcd/config.toml
seed=$(sed -n 's/.*s=\(http[^;]*\).*/\1/p' /sys/class/dmi/id/product_serial)

kv() { printf '%s=%s\n' "$1" "$2"; }
block() { echo "begin $1"; cat; echo "end $1"; }
unit_user() {
  pid=$(systemctl show -p MainPID --value "$1")
  [ "${pid:-0}" -gt 0 ] && ps_user "$pid"
}
ps_user() { stat -c %U "/proc/$1"; }
tpm_openers() {
  for fd in /proc/[0-9]*/fd/*; do
    [ "$(readlink "$fd" 2>/dev/null)" = /dev/tpmrm0 ] || continue
    pid=${fd#/proc/}; pid=${pid%%/*}
    echo "$(cat "/proc/$pid/comm") $(ps_user "$pid")"
  done | sort -u | tr '\n' ';'
}
node_user() { systemctl show -p User --value bcd-node; }
as_node_user() {
  u=$(node_user)
  if [ -n "$u" ] && [ "$u" != root ]; then setpriv --reuid="$u" --regid="$u" --init-groups -- "$@"; else "$@"; fi
}

kv started "$(date -u +%FT%TZ)"
# One Python start under TCG is seconds: one call waits and reports.
kv cloud_init "$(cloud-init status --wait 2>&1 | sed -n 's/^status: //p')"
block cloud_init_output </var/log/cloud-init-output.log
kv package "$(dpkg-query -W -f='${Version}' bcd 2>&1)"
kv node_active "$(systemctl is-active bcd-node.service)"
kv node_restarts "$(systemctl show -p NRestarts --value bcd-node.service)"
kv node_user "$(unit_user bcd-node.service)"
kv helper_socket "$(systemctl is-active bcd-helper.socket)"
kv helper_active "$(systemctl is-active bcd-helper.service)"
kv helper_user "$(unit_user bcd-helper.service)"
kv bcd_groups "$(id -nG bcd 2>&1)"
kv tpm_openers "$(tpm_openers)"
kv token_file "$(if [ -e /run/bcd/join-token ]; then echo present; else echo absent; fi)"
kv data_dir "$(stat -c '%U %a' /var/lib/bcd)"
kv data_files "$(find /var/lib/bcd -mindepth 1 -printf '%P ' 2>&1)"
kv product_uuid "$(cat /sys/class/dmi/id/product_uuid 2>&1)"
kv node_enabled "$(systemctl is-enabled bcd-node.service 2>&1)"
as_node_user bcd status --json --config "$config" 2>&1 | block status
as_node_user bcd doctor --config "$config" 2>&1 | block doctor
kv doctor_rc "$(as_node_user bcd doctor --config "$config" >/dev/null 2>&1; echo $?)"

# What else this guest does, as the host's seed says (`steps`, words of
# renew, upgrade, remove, join-fresh, eventlog): each costs tens of seconds under TCG, so only the
# guests that test it do it.
steps=" $(curl -fsS "${seed}steps" 2>/dev/null | tr '\n' ' ') "
step() { case $steps in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# The host sends this node commands (inventory.refresh, logs.collect) over
# its channel once it joined: bcd-node stays up until the host says it is
# done (bounded), so that the node answers as installed, unprivileged.
if step commands; then
  i=0
  until curl -fsS -o /dev/null "${seed}commands-done" 2>/dev/null || [ $i -ge 150 ]; do sleep 2; i=$((i + 1)); done
  kv commands_done "$(curl -fsS "${seed}commands-done" 2>/dev/null || echo never)"
  kv commands_node_active "$(systemctl is-active bcd-node.service)"
fi

# A renewal, by bcd node itself as the unit's user (stopped meanwhile so
# that one process holds the identity).
if step renew; then
  systemctl stop bcd-node.service
  out=$(as_node_user bcd node --once --renew-now --config "$config" 2>&1)
  kv renew_now_rc $?
  printf '%s\n' "$out" | block renew
  as_node_user bcd doctor --config "$config" 2>&1 | block doctor_renewed
  kv renew_rc "$(as_node_user bcd node --once --config "$config" >/dev/null 2>&1; echo $?)"
  systemctl start bcd-node.service
  as_node_user bcd status --json --config "$config" 2>&1 | block status_renewed
fi

# Running the install script again (the host serves a newer package's
# script).
# First put bcd in tss, as an admin's mistake would: the run must take it out.
if step upgrade && curl -fsS -o /run/upgrade.sh "${seed}upgrade.sh"; then
  usermod -aG tss bcd 2>&1 | block pre_upgrade_usermod
  kv pre_upgrade_groups "$(id -nG bcd 2>&1)"
  sh /run/upgrade.sh 2>&1 | block upgrade
  kv upgrade_bcd_groups "$(id -nG bcd 2>&1)"
  kv upgrade_package "$(dpkg-query -W -f='${Version}' bcd 2>&1)"
  kv upgrade_node_active "$(systemctl is-active bcd-node.service)"
  kv upgrade_node_restarts "$(systemctl show -p NRestarts --value bcd-node.service)"
  kv upgrade_node_user "$(unit_user bcd-node.service)"
  # The running node is the new binary, not the replaced one ("(deleted)").
  kv upgrade_node_exe "$(readlink "/proc/$(systemctl show -p MainPID --value bcd-node.service)/exe")"
  as_node_user bcd status --json --config "$config" 2>&1 | block status_upgraded
fi
if step remove; then
  # Removing the package keeps the identity.
  DEBIAN_FRONTEND=noninteractive apt-get remove -y -q bcd >/dev/null 2>&1
  kv removed "$(dpkg-query -W -f='${Status}' bcd 2>&1)"
  kv removed_node "$(systemctl is-active bcd-node.service)"
  kv removed_kept "$(find /var/lib/bcd -mindepth 1 -maxdepth 1 -printf '%f ')"
fi
# A join with a fresh token the host minted for another machine (a refused
# guest): refused as well, and still nothing written.
if step join-fresh && (umask 077 && curl -fsS -o /run/bcd/fresh-token "${seed}fresh-token"); then
  out=$(bcd join --config "$config" --attestor provisioned --token-file /run/bcd/fresh-token </dev/null 2>&1)
  kv join_fresh_rc $?
  printf '%s\n' "$out" | block join_fresh
  kv join_fresh_files "$(find /var/lib/bcd -mindepth 1 -printf '%P ' 2>&1)"
fi
# What the firmware, shim, grub and the kernel measured (scripts/sbtest):
# the TCG event log as the kernel exposes it (root only), base64, with the
# command line and the Secure Boot variable's value byte.
if step eventlog; then
  kv cmdline "$(cat /proc/cmdline)"
  kv kernel "$(uname -r)"
  kv secure_boot "$(od -An -tu1 -j4 -N1 /sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c 2>&1 | tr -d ' ')"
  base64 -w 76 /sys/kernel/security/tpm0/binary_bios_measurements 2>&1 | block eventlog
fi
journalctl -b -u bcd-node.service -u bcd-helper.service --no-pager 2>&1 | tail -n 40 | block journal
kv 'done' yes
