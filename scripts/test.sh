#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs, then runs pytest
# (unit tests, integration tests on lab servers over SSH, and the molecule scenarios).
set -euo pipefail
cd "$(dirname "$0")/.."
bash install.sh --test
# Lab tests fail rather than skip when lab servers can't run: a skip would hide a broken install.
export PROVISIONER_REQUIRE_LAB=1
# Two workers (pytest-xdist): the tests sharing one lab server stay together on one of them
# (tests/conftest.py), the molecule scenarios and the rest fill the other.
exec .venv/bin/pytest -ra -n 2 --durations=25 "$@"
