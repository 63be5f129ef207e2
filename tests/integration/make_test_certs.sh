#!/usr/bin/env bash
# Writes a throw-away CA, a server certificate for localhost / 127.0.0.1 and a
# client certificate (all signed by the CA, valid one day) into DIR:
# ca.pem, server.pem, server.key, client.pem, client.key.
set -euo pipefail
dir="$1"
mkdir -p "$dir"
cd "$dir"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out "$1" 2>/dev/null; }
key ca.key
openssl req -x509 -new -key ca.key -days 1 -subj "/CN=switchserve test CA" -out ca.pem
for who in server client; do
  key "$who.key"
  openssl req -new -key "$who.key" -subj "/CN=$who" -out "$who.csr"
  if [[ $who == server ]]; then
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$who.ext"
  else
    printf 'extendedKeyUsage=clientAuth\n' >"$who.ext"
  fi
  openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
    -extfile "$who.ext" -out "$who.pem" 2>/dev/null
done
