#!/usr/bin/env bash
# The README's first command: until the trainer lands, shows what the build offers.
set -euo pipefail
cd "$(dirname "$0")/.."
build/longtune info
