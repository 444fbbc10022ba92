#!/usr/bin/env bash
# The extension's tests: build from the lock files and install, then the
# lint of the TypeScript and CSS (npm run lint:check: eslint, prettier and
# stylelint from the lock file), the front-end unit tests (vitest), the
# server extension's tests and the browser tests (pytest; Debian's chromium
# driven by Playwright). Under CI=true a missing part (chromium, go) fails.
#
#   bash labextension/scripts/test.sh          build, then every test
#   GPUMEM_EXT_SKIP_BUILD=1 bash ...           tests only
set -euo pipefail
cd "$(dirname "$0")/.."
py=${GPUMEM_LAB_PYTHON:-$PWD/../.venv/current/bin/python}
. ../scripts/lib.sh
install_missing chromium   # Debian's: Playwright's own browser download is not used
if [ -z "${GPUMEM_EXT_SKIP_BUILD:-}" ]; then
  bash scripts/build.sh "$py"
fi
[ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error
npm run --silent lint:check
npx vitest run
export GPUMEM_ARTIFACTS=${GPUMEM_ARTIFACTS:-$(mktemp -d /tmp/gpumem-ext-artifacts.XXXXXX)}
echo "screenshots and logs: $GPUMEM_ARTIFACTS"
"$py" -m pytest -q -p no:cacheprovider tests "$@"
