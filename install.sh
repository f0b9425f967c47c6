#!/usr/bin/env bash
# Installs provisioner on this machine: Debian packages, a virtual environment with
# Ansible and the collections the roles use (from PyPI), and the `provisioner` command.
#   bash install.sh            the tool
#   bash install.sh --lab      plus what lab servers need (systemd-nspawn, mmdebstrap, ...)
#   bash install.sh --test     plus lab servers and the test tools (molecule, ansible-lint)
set -euo pipefail
cd "$(dirname "$0")"

lab=0 test=0
for arg in "$@"; do
  case "$arg" in
    --lab) lab=1 ;;
    --test) lab=1 test=1 ;;
    *) echo "install.sh: unknown option $arg (use --lab or --test)" >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root: it installs Debian packages and provisions this machine" >&2
  exit 2
fi

packages=(python3 python3-venv python3-apt openssh-client)
[ "$lab" = 1 ] && packages+=(systemd-container mmdebstrap iptables openssh-server zstd iproute2 util-linux btrfs-progs xfsprogs)
[ "$test" = 1 ] && packages+=(chromium-headless-shell)  # renders the HTML smoke report in a real browser
# Lab VMs (lab up --vm): qemu with software emulation where KVM does not work, fdisk and
# e2fsprogs to make the disk image
[ "$test" = 1 ] && packages+=(qemu-system-x86 qemu-utils fdisk e2fsprogs)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
extras=""
[ "$test" = 1 ] && extras="[test]"
# --no-compile: pip would byte-compile every file it installs, one after another (Ansible's
# collections alone are tens of thousands that provisioner never imports); Python compiles what
# it imports on first use instead. Half a minute less of an install here.
.venv/bin/pip install --quiet --disable-pip-version-check --no-compile -e ".${extras}"
ln -sf "$PWD/.venv/bin/provisioner" /usr/local/bin/provisioner
# Whole outputs, first line taken in the shell: a pipe into head can close before the
# writer is done and make it print a BrokenPipeError traceback.
ansible_version=$(.venv/bin/ansible --version)
echo "installed: $(provisioner --version) (${ansible_version%%$'\n'*})"
