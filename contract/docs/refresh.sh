#!/usr/bin/env bash
# Refreshes the vendored Redoc bundle that `GET /v1/docs` serves, from the npm registry, at the
# pinned version; the gateway needs no network at run time. To move to another version, change
# REDOC_VERSION, run this, check the page (tests/docs_page.rs renders it in Chromium), and
# commit the bundle and its gzip form (served to clients that accept gzip, a quarter of the
# bytes) together with the new SHA-256 below.
#
#   bash contract/docs/refresh.sh
set -euo pipefail
cd "$(dirname "$0")"
REDOC_VERSION=3.0.1
SHA256=8c70c2de83d33e33a75b225e573d6d9fe851f066f824b44b1637d831d52d7543
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "redoc@$REDOC_VERSION" >/dev/null && tar xzf "redoc-$REDOC_VERSION.tgz")
got=$(sha256sum "$work/package/bundles/redoc.standalone.js" | cut -d' ' -f1)
if [ "$got" != "$SHA256" ]; then
  echo "redoc@$REDOC_VERSION's bundle has SHA-256 $got, not the pinned $SHA256." >&2
  echo "If you are moving to a new version on purpose, update SHA256 in this script." >&2
  exit 1
fi
cp "$work/package/bundles/redoc.standalone.js" redoc.standalone.js
cp "$work/package/LICENSE" REDOC-LICENSE
gzip -9 -n -c redoc.standalone.js > redoc.standalone.js.gz
echo "contract/docs/redoc.standalone.js is redoc@$REDOC_VERSION ($got)"
