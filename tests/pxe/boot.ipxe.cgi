# shellcheck shell=sh
# A stand-in for `bcd site`'s GET /boot.ipxe, run by busybox httpd as a CGI
# (httpd.conf maps *.ipxe to /bin/sh) until `bcd site` lands: it renders
# ramdisk/boot.ipxe.in for a MAC that has an entry under $PXE_ENTRIES
# (files named by MAC holding "TOKEN ASSERTION") and ramdisk/exit.ipxe.in
# for any other, and logs one line per script to $PXE_LOG.
#
# httpd passes no environment of its own: the paths come from ./site.env.
# shellcheck disable=SC1091
. ./site.env
# iPXE sends the MAC URL-encoded (52%3A54%3A...).
mac=$(printf '%s' "&$QUERY_STRING&" | sed -n 's/.*&mac=\([^&]*\)&.*/\1/p' | sed 's/%3[aA]/:/g' | tr 'A-F' 'a-f')
case $mac in
  [0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]) ;;
  *) mac= ;;
esac
printf 'Content-Type: text/plain\r\n\r\n'
if [ -n "$mac" ] && [ -f "$PXE_ENTRIES/$mac" ]; then
  read -r token assertion <"$PXE_ENTRIES/$mac"
  echo "boot mac=$mac" >>"$PXE_LOG"
  sed -e "s|@BASE@|$PXE_BASE|g" -e "s|@TOKEN@|$token|g" -e "s|@ASSERTION@|$assertion|g" \
    -e "s|@NOW@|$(date +%s)|g" "$PXE_TEMPLATES/boot.ipxe.in"
else
  echo "exit mac=${mac:-none}" >>"$PXE_LOG"
  sed -e "s|@REASON@|no boot entry for \${net0/mac}|g" "$PXE_TEMPLATES/exit.ipxe.in"
fi
