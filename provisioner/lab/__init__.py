"""Disposable Debian 12 "lab servers" on this machine: systemd-nspawn over an overlay, or
(`up_vm`) full qemu virtual machines with their own kernel (vm.py, image.py).

A lab server is a booted Debian 12 (systemd as PID 1, sshd listening) in its own
network namespace, reachable from the host at 10.213.N.2 with the lab's ssh key and a
strict, per-server known_hosts file. Its root filesystem is an overlay over one
read-only rootfs built once with mmdebstrap, so creating one takes about a second and
throwing it away discards every change.

Layout:
    cache_dir()/bookworm-KEY.tar.zst   the mmdebstrap tarball (KEY hashes the recipe)
    cache_dir()/bookworm-KEY/          the extracted rootfs (overlay lowerdir, never written)
    cache_dir()/bookworm-fresh-KEY*    the same for `up(NAME, fresh=True)`: a server as a minimal
                                       install leaves it, its inventory's known_hosts empty
    lab_dir()/id_ed25519[.pub]         the lab key pair (root login on every server)
    lab_dir()/ip_forward.saved         host's net.ipv4.ip_forward before the first server
    lab_dir()/NAME/                    upper/ work/ merged/ state.json console.log
                                       known_hosts inventory.yml ssh_config
    lab_dir()/.discarded/              servers taken down, being deleted in the background

Everything needs root, systemd-nspawn, mmdebstrap, iptables, iproute2 and openssh.

Modules:
    rootfs     the cached rootfs: mmdebstrap from the host's apt sources, tarball, extraction
    mounts     the overlay over it, and the block devices bound into a server
    ssh        the lab key, each server's host key and identity, the client files
    processes  systemd-nspawn: command line, start, PID 1, sshd answering, stop
    network    veth addresses, ip_forward and the NAT rule (saved and restored)
    state      LabServer, NAME/state.json, the listing
    server     up, up_vm, down, a running VM's drive taken out or put back, and the lab lock,
               composed from the above
    vm         qemu: the command line, drives and their refusals, accelerator, boot, stop, and
               the QMP commands that take a drive out of a running VM and put it back
    image      the cached VM disk image: mmdebstrap, the disk, grub installed by one boot

VM layout:
    lab_dir()/images/bookworm-vm-KEY.qcow2   the read-only disk image (KEY hashes the recipe)
    lab_dir()/NAME/                          disk.qcow2 (overlay) nvmeI.qcow2 seed/ console.log
                                             qemu.log qmp.sock state.json known_hosts inventory.yml ssh_config
"""

from __future__ import annotations

from .common import LabError, missing_requirement
from .network import NAT_COMMENT
from .rootfs import ensure_rootfs
from .server import down, frozen, set_drive, up, up_vm
from .state import LabServer, list_servers
from .vm import missing_vm_requirement

__all__ = [
    "NAT_COMMENT",
    "LabError",
    "LabServer",
    "down",
    "ensure_rootfs",
    "frozen",
    "list_servers",
    "missing_requirement",
    "missing_vm_requirement",
    "set_drive",
    "up",
    "up_vm",
]
