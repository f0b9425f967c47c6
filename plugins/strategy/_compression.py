"""No ssh compression under Mitogen unless a host asks for it.

Mitogen asks ssh to compress its stream (-o Compression yes) by default; Ansible's own ssh
connection here does not (provisioner's ssh_args leave -C out). What travels is mostly wheels and
zip archives, compressed already: zlib at ssh's level gains 1.5% on them at about 45 MB/s of a core
(measured on a wheel of the stack), slower than a 1 Gb/s link and a cost to both ends. The strategy
puts uncompressed() on Mitogen's ssh connection methods with _host_keys.wrap_methods.
"""

from __future__ import annotations

from typing import Any


def uncompressed(kwargs: dict[str, Any], spec: Any) -> dict[str, Any]:
    """Mitogen's ssh connection arguments (`_connect_ssh`'s kwargs) without ssh's compression,
    unless the host's mitogen_ssh_compression sets it (either way)."""
    if spec.mitogen_ssh_compression() is not None:
        return kwargs
    return dict(kwargs, compression=False)
