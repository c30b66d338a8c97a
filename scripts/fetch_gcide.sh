#!/usr/bin/env bash
# Fetches the GNU Collaborative International Dictionary of English (Debian package dict-gcide), the
# byte-level training corpus of bench/sparse_lm. `apt-get download` needs no root; the file stays
# dictzip-compressed (gzip-compatible, Python's gzip reads it) so that it is small enough to carry to a
# GPU machine without internet. Safe to run twice: skips when the destination exists. As root, apt-get
# warns that it downloads "unsandboxed" (its _apt user cannot write the temporary folder): harmless.
# Usage: scripts/fetch_gcide.sh [DEST]   (default build/data/gcide.dict.dz, relative to the repo root)
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-build/data/gcide.dict.dz}"
if [ -s "$dest" ]; then
  echo "fetch_gcide: $dest present, skipping"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -q dict-gcide)
dpkg-deb -x "$tmp"/dict-gcide_*.deb "$tmp/root"
mkdir -p "$(dirname "$dest")"
# Copy under a temporary name and rename, so that an interrupted run never leaves a partial corpus
# that the skip test above would accept.
cp "$tmp/root/usr/share/dictd/gcide.dict.dz" "$dest.part"
mv "$dest.part" "$dest"
echo "fetch_gcide: $dest ($(du -h "$dest" | cut -f1))"
