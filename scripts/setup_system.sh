#!/usr/bin/env bash
# Debian packages the test suite drives as real parts: chromium + chromium-driver (the /ui
# browser test), prometheus (promtool checks the scrape config) and tini (the image's
# entrypoint, run as PID 1 by test_orphan_reaping.py). Installed only when
# missing and only as root; otherwise it says what to run and the tests that need them skip
# with that reason.
set -euo pipefail
need=()
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
command -v promtool >/dev/null || need+=(prometheus)
command -v tini >/dev/null || need+=(tini)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "setup_system: missing ${need[*]}; install them with: sudo apt-get install ${need[*]}" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
  || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }
