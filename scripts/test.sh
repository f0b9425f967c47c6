#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs, then runs pytest
# (unit tests, integration tests on lab servers over SSH, and the molecule scenarios).
set -euo pipefail
cd "$(dirname "$0")/.."
bash install.sh --test
# Lab tests fail rather than skip when lab servers can't run: a skip would hide a broken install.
export PROVISIONER_REQUIRE_LAB=1
exec .venv/bin/pytest -ra "$@"
