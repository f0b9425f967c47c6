#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs, then runs pytest
# (unit tests, integration tests on lab servers over SSH, and the molecule scenarios).
set -euo pipefail
cd "$(dirname "$0")/.."
bash install.sh --test
# Lab tests fail rather than skip when lab servers can't run: a skip would hide a broken install.
export PROVISIONER_REQUIRE_LAB=1
# Three workers (pytest-xdist) on a 2-core machine: the tests sharing one lab server stay together
# on one of them (tests/conftest.py), the rest fill the others. With two workers a tenth of both
# cores sat idle (a test waiting on a reboot, a VM's sshd, a lab server's start); the third takes it.
exec .venv/bin/pytest -ra -n 3 --durations=25 "$@"
