"""Hardware classes and their groups in the inventory.

Hosts with the same hardware (the facts' CPU model, sockets, cores and threads, the memory to the
GiB, the drives' models and sizes) form a class, which tune measures on one of its hosts. With
--write a class of several hosts gets its values once, in group_vars of its group hw_FINGERPRINT,
and the group with its members goes into the inventory.

The inventory is edited as text, never loaded and dumped again: a YAML file gets each class as a
top-level group at its end, an INI file a section, an inventory directory a file of its own
(provisioner-classes.yml); the user's lines stay as they were, byte for byte. The groups named
hw_ and 12 hex digits, each with the one-line note above it, are this module's own: every write
rewrites them, each host in one class only (a host whose hardware changed leaves its old class)
and only hosts the rest of the inventory defines (a group would otherwise define a host the user
removed). The edited text is read with Ansible's own inventory parser before it replaces the
file; an inventory that cannot take a group so (a script, an inventory plugin's configuration,
TOML, JSON, a vault) is left as it was, and the caller writes each member's host_vars instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

# The inventory file an inventory directory gets for the classes' groups (Ansible reads every file of
# an inventory directory).
CLASSES_FILE = "provisioner-classes.yml"
GROUP = re.compile(r"hw_[0-9a-f]{12}")
NOTE = "# provisioner tune"


class CannotGroup(Exception):
    """The inventory cannot take the class's group by a file edit; the message says why."""


def fingerprint(hardware: Mapping[str, Any]) -> str:
    """A hardware class: the CPU model, cores, sockets, threads, the memory, the drives' models and sizes."""
    cpu = hardware.get("cpu", {})
    drives = sorted(
        (d.get("model") or "", int(d.get("size_bytes") or 0))
        for d in hardware.get("block_devices", [])
        if d.get("type", "disk") == "disk" and not d.get("loop")
    )
    key = {
        "cpu": [cpu.get("model_name"), cpu.get("sockets"), cpu.get("cores"), cpu.get("threads")],
        "memory_gib": round(int(hardware.get("memory", {}).get("total_bytes") or 0) / 2**30),
        "drives": drives,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def of(hardware_by_host: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Fingerprint -> its hosts, sorted; the first host of each class is the one measured."""
    out: dict[str, list[str]] = {}
    for host in sorted(hardware_by_host):
        out.setdefault(fingerprint(hardware_by_host[host]), []).append(host)
    return out


def class_group(print_: str) -> str:
    """The inventory group of one hardware class: hw_ and its fingerprint (a valid group name)."""
    return f"hw_{print_}"


def vars_beside(inventory: Path, where: str, name: str) -> Path:
    """WHERE/NAME.yml (host_vars or group_vars) beside the inventory: a file's directory, or the
    directory itself, where Ansible reads them for any inventory format."""
    base = inventory if inventory.is_dir() else inventory.parent
    return base / where / f"{name}.yml"


def group_file(inventory: Path, group: str) -> Path:
    return vars_beside(inventory, "group_vars", group)


def edited_file(inventory: Path) -> Path:
    """The file a class's group is written into: the inventory file (where a link points), or the
    directory's own provisioner-classes.yml."""
    return inventory / CLASSES_FILE if inventory.is_dir() else inventory.resolve()


def kind(inventory: Path) -> str:
    """dir, yaml or ini: how a group is added to INVENTORY; other when it cannot take one by a file
    edit (a script, a plugin's configuration, TOML, JSON, a vault, a file it cannot read)."""
    if inventory.is_dir():
        return "dir"
    try:
        text = inventory.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return "other"
    if text.startswith("#!") or text.lstrip().startswith("$ANSIBLE_VAULT") or inventory.suffix in (".json", ".toml"):
        return "other"
    from ansible.parsing.dataloader import DataLoader

    try:
        doc = DataLoader().load(text, json_only=False)
    except Exception:  # not YAML (Ansible's loader raises several kinds): an INI file
        return "ini"
    if isinstance(doc, Mapping):
        return "other" if "plugin" in doc else "yaml"
    return "ini"


# ---------------------------------------------------------------- the groups as text


def split(text: str, how: str) -> tuple[str, dict[str, tuple[str, list[str]]]]:
    """TEXT without the classes' groups, and those groups: name -> (its note, its hosts). A group's
    block must hold only what render writes (its hosts' names, blank lines): a line of anyone
    else's there raises CannotGroup naming it, so no line but the product's own is ever rewritten.
    Lines are split on newlines only: a line's carriage return stays with it."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    keep: list[str] = []
    groups: dict[str, tuple[str, list[str]]] = {}
    i = 0
    while i < len(lines):
        found = _header(lines[i], how)
        if not found:
            keep.append(lines[i])
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not _ends(lines[j], how):
            j += 1
        note = keep.pop() if keep and keep[-1].startswith(NOTE) else ""
        groups[found] = (note, _hosts(lines[i + 1 : j], how, found))
        while keep and not keep[-1].strip():
            keep.pop()
        i = j
    rest = "\n".join(keep).rstrip("\n")
    return (rest + "\n" if rest else ""), groups


def _header(line: str, how: str) -> str:
    pattern = r"\[(hw_[0-9a-f]{12})\]\s*" if how == "ini" else r"(hw_[0-9a-f]{12}):\s*"
    found = re.fullmatch(pattern, line)
    return found.group(1) if found else ""


def _ends(line: str, how: str) -> bool:
    """LINE begins what follows a group: a section or a comment (INI), a key or comment at the margin (YAML)."""
    if how == "ini":
        return line.lstrip().startswith("[") or line.startswith(("#", ";"))
    return bool(line.strip()) and line[0] not in " \t"


def _hosts(lines: Sequence[str], how: str, group: str) -> list[str]:
    """The hosts of a group's block, as render writes them; anything else refused."""
    hosts = []
    for line in lines:
        bare = line.strip()
        if not bare or (how == "yaml" and bare == "hosts:"):
            continue
        name = re.fullmatch(r"(\S+)", bare) if how == "ini" else re.fullmatch(r" {4}(\S+|\"[^\"]*\"):\s*", line)
        if not name:
            raise CannotGroup(f"group {group} holds a line tune did not write ({bare!r}); move it out of the group's block")
        hosts.append(json.loads(name.group(1)) if name.group(1).startswith('"') else name.group(1))
    return hosts


def render(groups: Mapping[str, tuple[str, Sequence[str]]], how: str) -> str:
    out = []
    for name, (note, hosts) in groups.items():
        if how == "ini":
            out.append("\n".join(["", note, f"[{name}]", *hosts]))
        else:
            out.append("\n".join(["", note, f"{name}:", "  hosts:", *(f"    {_yaml_key(h)}:" for h in hosts)]))
    return "\n".join(out) + "\n" if out else ""


def _yaml_key(host: str) -> str:
    return host if re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*", host) else json.dumps(host)


# ---------------------------------------------------------------- Ansible's reading


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Ansible's inventory warnings held back: a text that does not parse is this module's to say."""
    from ansible.inventory import manager

    display = manager.display
    display.warning = display.error_as_warning = lambda *_a, **_k: None
    try:
        yield
    finally:
        del display.warning, display.error_as_warning


def inventory_of(sources: Sequence[Path]) -> Any:
    """SOURCES as Ansible's inventory; CannotGroup where Ansible refuses them (a setting such as
    INVENTORY_ANY_UNPARSED_IS_FAILED makes an unreadable source an error, not a warning)."""
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    try:
        with _quiet():
            return InventoryManager(loader=DataLoader(), sources=[str(s) for s in sources])
    except AnsibleError as exc:
        raise CannotGroup(f"Ansible does not read {', '.join(map(str, sources))}: {str(exc).splitlines()[0]}") from None


def _parsed(text: str, like: Path) -> Any:
    """TEXT as Ansible reads it from a file named like LIKE, in its directory."""
    fd, tmp = tempfile.mkstemp(dir=like.parent, prefix=".provisioner-", suffix=like.suffix)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return inventory_of([Path(tmp)])
    finally:
        Path(tmp).unlink(missing_ok=True)


def _defined(inventory: Path, how: str, rest: str) -> set[str]:
    """The hosts the inventory defines without the classes' groups."""
    if how == "dir":
        from ansible.inventory.manager import IGNORED

        sources = [
            p
            for p in sorted(inventory.iterdir())
            if p.name not in (CLASSES_FILE, "group_vars", "host_vars") and not IGNORED.search(os.fsencode(p.name))
        ]
        return set(inventory_of(sources).hosts)
    return set(_parsed(rest, edited_file(inventory)).hosts)


def regroup(
    inventory: Path, placement: Mapping[str, str], write: tuple[str, Sequence[str], str] | None = None
) -> tuple[bool, list[str]]:
    """The classes' groups in the inventory after a run: PLACEMENT maps each host the run reached to
    the group of its class now, and a reached host leaves every other class's group (its hardware
    changed); hosts the rest of the inventory no longer defines leave every group; WRITE, (group,
    members, note), is written with its members. Returns whether the file changed, and the hosts
    of WRITE's group from an earlier write that this run did not reach (--limit): they get its
    values too. Raises CannotGroup when the inventory cannot take a group by a file edit, or when
    Ansible would not read the edited file with the group."""
    how = kind(inventory)
    if how == "other":
        raise CannotGroup(
            f"{inventory} takes no group from a file edit (a script, a plugin's configuration, TOML, JSON or a vault)"
        )
    path = edited_file(inventory)
    text = path.read_bytes().decode("utf-8") if path.exists() else ""  # line endings as they are
    style = "yaml" if how == "dir" else how
    rest, groups = split(text, style)
    if write is None and not groups:
        return False, []
    if how == "dir":
        rest = ""  # the file is the product's own
    defined = _defined(inventory, how, rest)

    def stays(host: str, group: str) -> bool:
        return host in defined and placement.get(host, group) == group

    kept: dict[str, tuple[str, list[str]]] = {}
    for name, (old_note, hosts) in groups.items():
        left = [h for h in hosts if stays(h, name)]
        if left and (write is None or name != write[0]):
            kept[name] = (old_note, left)
    earlier: list[str] = []
    if write is not None:
        group, members, note = write
        earlier = [h for h in groups.get(group, ("", []))[1] if h not in placement and h in defined]
        kept[group] = (note, [*members, *earlier])
    edited = rest + render(kept, style)
    if edited == text:
        return False, earlier
    if how != "dir":
        check = _parsed(edited, path)
        for name, (_note, hosts) in kept.items():
            got = check.groups.get(name)
            if got is None or {h.name for h in got.get_hosts()} != set(hosts):
                raise CannotGroup(f"Ansible does not read group {name} from {path} edited as {how}")
    from provisioner import paths

    path.parent.mkdir(parents=True, exist_ok=True)
    paths.replace_file(path, edited.encode("utf-8"))  # its mode and owner kept
    return True, earlier


def read_vars(inventory: Path, hosts: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each host's variables as Ansible gives them from the inventory, its group_vars and host_vars.
    Raises Ansible's error where it cannot read them (a vaulted file: no vault password here)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    manager = inventory_of([inventory])
    variables = VariableManager(loader=DataLoader(), inventory=manager)
    out = {}
    for host in hosts:
        found = manager.get_host(host)
        if found is not None:
            out[host] = variables.get_vars(host=found)
    return out
