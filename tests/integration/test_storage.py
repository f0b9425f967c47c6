"""The storage role end to end on lab servers with loop devices bound in as drives (marked lab).

btrfs RAID0 end to end (check mode first, create, verify's storage checks, write + checksum,
remount from fstab, re-run with no change, undo keeping the data and removing the role's files,
adoption), a drive holding data that is not listed or listed without storage_wipe_devices
(refused, data unchanged, on one host of a fleet of two, the other stopped before any change
too), then wiping that drive when allowed, XFS on one drive, the mdadm backend on this kernel
without an md driver (skipped with the reason, the planned commands and mdadm.conf line
rendered), and the plan's proposal, built only when confirmed and then run again with no change. The module's decisions and the role's
templates are tested without a lab in tests/unit/test_storage_module.py.

Each test has a server of its own, except two pairs whose runs follow each other on one server:
a module fixture runs them all (the refusal on a fleet of two servers, then the wiping on one of
them; the proposal, then its second run), reads the hosts after each and takes the servers down,
and each test of the pair asserts its part.

A storage refusal ends `provisioner up` with exit code 1, not 2: 2 means refused on the control
node before any host was touched (the plan role), while the refusal needs the target's drives
inspected, a task on the host (it still comes before any change, on every host).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from provisioner import lab

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SEP = "\u2014"  # the em dash of the refusal line


# --------------------------------------------------------------------------
# lab servers with loop devices as drives
# --------------------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextmanager
def _loops(directory: Path) -> Iterator[Callable[..., str]]:
    """make(size='1G', ext4_file=None) -> /dev/loopN backed by a sparse file in DIRECTORY.

    ext4_file=(name, bytes): the image gets an ext4 filesystem labelled 'precious' holding that file
    (mkfs.ext4 -d, no mount). On exit each loop device that still points at its image is detached,
    then the images are deleted."""
    made: list[tuple[str, Path]] = []

    def make(size: str = "1G", ext4_file: tuple[str, bytes] | None = None) -> str:
        image = directory / f"drive{len(made)}.img"
        subprocess.run(["truncate", "--size", size, str(image)], check=True)
        if ext4_file is not None:
            src = directory / f"content{len(made)}"
            src.mkdir()
            (src / ext4_file[0]).write_bytes(ext4_file[1])
            subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "precious", "-d", str(src), str(image)], check=True)
        loop = subprocess.run(
            ["losetup", "--find", "--show", str(image)], check=True, capture_output=True, text=True
        ).stdout.strip()
        made.append((loop, image))
        return loop

    try:
        yield make
    finally:
        for loop, image in reversed(made):
            back = subprocess.run(
                ["losetup", "--noheadings", "--output", "BACK-FILE", loop], capture_output=True, text=True
            ).stdout.strip()
            if back == str(image):
                subprocess.run(["losetup", "--detach", loop], check=False)
            image.unlink(missing_ok=True)


@pytest.fixture
def loop_drives(tmp_path):
    """Factory for loop devices as drives (_loops), detached and deleted after the test."""
    with _loops(tmp_path) as make:
        yield make


@pytest.fixture
def storage_lab(loop_drives, fresh_lab_server):
    """(loop_drives, fresh_lab_server): the loops are set up first, so torn down after the servers."""
    return loop_drives, fresh_lab_server


@contextmanager
def story_lab(directory: Path) -> Iterator[tuple[Callable[..., str], Callable[..., lab.LabServer]]]:
    """storage_lab for a module fixture, whose runs two tests then read: the servers are torn down on
    exit, then the loops, so none of them outlives the fixture's story."""
    with _loops(directory) as drives, ExitStack() as servers:

        def make_server(name: str, devices: Sequence[str] = ()) -> lab.LabServer:
            servers.callback(lab.down, name)
            return lab.up(name, devices=devices)

        yield drives, make_server


def ext4_file_sha(loop: str, name: str) -> str:
    """Checksum of a file on an ext4 drive, read with debugfs (read-only, no mount)."""
    out = subprocess.run(["debugfs", "-R", f"cat /{name}", loop], check=True, capture_output=True).stdout
    return _sha256(out)


def blank_and_precious(storage_lab, name: str, size: int = 1 << 20) -> tuple:
    """Lab server NAME with a blank drive and a 512M drive holding an ext4 filesystem (label precious)
    with SIZE random bytes in precious.bin: (the server, the blank drive, the precious one, the bytes' sha256)."""
    drives, make_server = storage_lab
    payload = os.urandom(size)
    blank, precious = drives(), drives("512M", ext4_file=("precious.bin", payload))
    return make_server(name, devices=[blank, precious]), blank, precious, _sha256(payload)


def ssh(server, command: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ssh", "-F", str(server.ssh_config), server.name, command], capture_output=True, text=True,
                       timeout=120)
    if check:
        assert r.returncode == 0, f"{command}: {r.stdout}{r.stderr}"
    return r


# The play the storage playbook starts with: the storage role reads the plan.
PLAN = """
- name: Plan
  hosts: all
  gather_facts: true
  gather_subset: [min]
  roles:
    - role: plan
"""

# Role common installs the base packages (most of a run's time); tests that are not about the
# ML group's ownership only create the group.
PLAYBOOK_NO_COMMON = PLAN + """- name: Storage
  hosts: all
  gather_facts: false
  pre_tasks:
    - name: Create the ML group (role common's job)
      ansible.builtin.group:
        name: ml
        state: present
  roles:
    - role: storage
"""

UNDO = """
- name: Undo storage
  hosts: all
  gather_facts: false
  tasks:
    - name: Undo storage
      ansible.builtin.include_role:
        name: storage
        tasks_from: undo
"""


class Run:
    def __init__(self, proc: subprocess.CompletedProcess):
        self.rc = proc.returncode
        self.stdout, self.stderr = proc.stdout, proc.stderr
        try:
            self.data = json.loads(proc.stdout[proc.stdout.index("{"):])
        except ValueError:
            self.data = {"plays": [], "stats": {}}

    def results(self, role: str | None = None):
        for play in self.data.get("plays", []):
            for task in play.get("tasks", []):
                name = task["task"]["name"]
                for result in task.get("hosts", {}).values():
                    if role is None or task["task"].get("role", {}).get("name") == role or name.startswith(f"{role} :"):
                        yield name, result

    def changed(self, role: str | None = None) -> list[str]:
        return [name for name, r in self.results(role) if r.get("changed")]

    def failures(self) -> list[str]:
        return [str(r.get("msg")) for _, r in self.results() if r.get("failed") and not r.get("skipped")]

    def messages(self) -> list[str]:
        out: list[str] = []
        for _, r in self.results():
            msg = r.get("msg")
            out += msg if isinstance(msg, list) else [str(msg)] if msg else []
        return out


def play(server, tmp_path: Path, extra: dict, *, check: bool = False, playbook: str = PLAYBOOK_NO_COMMON) -> Run:
    book = tmp_path / f"play-{abs(hash(playbook))}.yml"
    book.write_text(playbook)
    varfile = tmp_path / "extra.json"
    varfile.write_text(json.dumps(extra))
    cmd = [str(VENV_BIN / "ansible-playbook"), "-i", str(server.inventory), str(book), "-e", f"@{varfile}"]
    if check:
        cmd += ["--check", "--diff"]
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
           "ANSIBLE_LIBRARY": str(REPO / "plugins" / "modules"), "ANSIBLE_MODULE_UTILS": str(REPO / "plugins" / "module_utils"),
           "ANSIBLE_ACTION_PLUGINS": str(REPO / "plugins" / "action"), "ANSIBLE_FILTER_PLUGINS": str(REPO / "plugins" / "filter"),
           "ANSIBLE_PIPELINING": "True", "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_DEPRECATION_WARNINGS": "False"}
    return Run(subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env))


def verify_storage(server, tmp_path: Path, options: dict) -> list[dict]:
    """`provisioner verify --tags storage` of SERVER, its checks judging by OPTIONS set as the host's
    inventory vars (a plain ansible-playbook run records no options on the host for verify to read)."""
    inventory = yaml.safe_load(server.inventory.read_text())
    inventory["all"]["children"]["lab"]["hosts"][server.name].update(options)
    path = tmp_path / "verify-inventory.yml"
    path.write_text(yaml.safe_dump(inventory))
    r = subprocess.run([str(VENV_BIN / "provisioner"), "verify", "-i", str(path), "--tags", "storage", "--json"],
                       capture_output=True, text=True, timeout=600)
    envelope = json.loads(r.stdout)
    assert envelope["exit_code"] == r.returncode, envelope
    return [c for c in envelope["data"]["hosts"][server.name] if c["role"] == "storage"]


def btrfs_vars(*loops: str, **extra) -> dict:
    return {"storage_devices": list(loops), "storage_allow_unstable_names": True, "storage_backend": "btrfs",
            "storage_level": "raid0", **extra}


@pytest.mark.lab
def test_btrfs_raid0_end_to_end(storage_lab, tmp_path):
    drives, make_server = storage_lab
    a, b = drives(), drives()
    server = make_server("pv-storage-e2e", devices=[a, b])
    ev = btrfs_vars(a, b)
    ra_before = ssh(server, f"blockdev --getra {a}").stdout.strip()

    # Check mode on role common (its packages, its user) is test_up.py's, on a fresh server.
    check = play(server, tmp_path, ev, check=True)
    assert check.rc == 0, check.failures() or check.stderr
    shown = "\n".join(check.messages())
    assert "would be created" in shown and "mkfs.btrfs --label data --uuid " in shown
    assert ssh(server, "findmnt /data", check=False).returncode != 0
    assert ssh(server, f"blkid -p {a}", check=False).returncode == 2, "check mode touched the drive"
    assert ssh(server, "test -e /etc/udev/rules.d/60-provisioner-storage.rules", check=False).returncode != 0

    # The ML group made as role common would (common's apt installs are no storage question).
    first = play(server, tmp_path, ev)
    assert first.rc == 0, first.failures() or first.stderr
    assert any(name.endswith("Create the data array and its filesystem (erases the drives in storage_wipe_devices)")
               for name in first.changed("storage"))
    uuid_ = ssh(server, f"blkid -p -s UUID -o value {a}").stdout.strip()
    fstab = ssh(server, "cat /etc/fstab").stdout
    assert f"UUID={uuid_} /data btrfs noatime,nofail,device={a},device={b} 0 0" in fstab
    rule = ssh(server, "cat /etc/udev/rules.d/60-provisioner-storage.rules").stdout
    assert rule.count('ATTR{queue/read_ahead_kb}="4096"') == 2
    assert ssh(server, f"blockdev --getra {a}").stdout.strip() == "8192"
    assert ssh(server, "stat -c '%U:%G %a' /data").stdout.split() == ["root:ml", "2775"]
    assert "Data, RAID0" in ssh(server, "btrfs filesystem df /data").stdout
    # What `provisioner verify` checks of role storage, every check passed or skipped with its reason.
    checks = verify_storage(server, tmp_path, ev)
    assert [c for c in checks if c["outcome"] == "failed" or (c["outcome"] == "skipped" and not c["message"])] == []
    outcomes = {c["check"]: c["outcome"] for c in checks}
    assert outcomes["test_btrfs_mount_names_every_member"] == outcomes["test_fstab_by_uuid_with_nofail"] == "passed"
    assert outcomes["test_no_pending_plan_once_built"] == "passed", outcomes

    written = ssh(server, "dd if=/dev/urandom of=/data/blob bs=1M count=32 status=none && sync && "
                          "sha256sum /data/blob").stdout.split()[0]
    ssh(server, "umount /data && mount /data")  # from /etc/fstab alone
    assert ssh(server, "sha256sum /data/blob").stdout.split()[0] == written

    second = play(server, tmp_path, ev)
    assert second.rc == 0, second.failures()
    assert second.changed("storage") == [], f"second run changed {second.changed('storage')}"

    undo = play(server, tmp_path, {}, playbook=UNDO)
    assert undo.rc == 0, undo.failures()
    assert ssh(server, "findmnt /data", check=False).returncode != 0
    assert " /data " not in ssh(server, "cat /etc/fstab").stdout
    left = ssh(server, "for f in /etc/udev/rules.d/60-provisioner-storage.rules /var/lib/provisioner/originals/storage.json "
                       "/var/lib/provisioner/storage-plan.txt; do test -e $f && echo $f; done; true").stdout.split()
    assert left == [], f"undo left {left}"
    assert ssh(server, f"blockdev --getra {a}").stdout.strip() == ra_before, "read-ahead not restored"
    assert ssh(server, f"blkid -p -s TYPE -o value {a}").stdout.strip() == "btrfs", "undo touched the filesystem"
    assert ssh(server, f"blkid -p -s UUID -o value {b}").stdout.strip() == uuid_, "undo touched the filesystem"
    again = play(server, tmp_path, {}, playbook=UNDO)
    assert again.rc == 0 and again.changed() == []

    adopted = play(server, tmp_path, ev)
    assert adopted.rc == 0, adopted.failures()
    assert any("storage: adopted - btrfs raid0" in m for m in adopted.messages())
    assert ssh(server, "sha256sum /data/blob").stdout.split()[0] == written


@pytest.mark.lab
def test_a_drive_with_data_that_is_not_listed_is_untouched(storage_lab, tmp_path):
    server, blank, precious, written = blank_and_precious(storage_lab, "pv-storage-unlisted")
    before = ext4_file_sha(precious, "precious.bin")
    assert before == written

    # A run with no drives listed does nothing: the proposal's unconfirmed run below.
    one = play(server, tmp_path, btrfs_vars(blank, storage_level="single"))
    assert one.rc == 0, one.failures()
    assert ssh(server, "findmnt -n -o FSTYPE /data").stdout.strip() == "btrfs"
    assert ext4_file_sha(precious, "precious.bin") == before
    assert ssh(server, f"blkid -p -s LABEL -o value {precious}").stdout.strip() == "precious"


def fleet_inventory(path: Path, servers: Sequence[tuple[lab.LabServer, list[str]]]) -> object:
    """An inventory of several lab servers, each with its own storage_devices: [(server, devices)]."""
    hosts = {}
    for server, devices in servers:
        hostvars = yaml.safe_load(server.inventory.read_text())["all"]["children"]["lab"]["hosts"][server.name]
        hosts[server.name] = {**hostvars, "storage_devices": devices}
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return SimpleNamespace(inventory=path)


@pytest.fixture(scope="module")
def refused_then_wiped(lab_requirements, tmp_path_factory) -> SimpleNamespace:
    """A fleet of two servers: one with a blank drive and a 512M one holding an ext4 filesystem with
    data, both listed for btrfs, the other with two blank drives. Refused (check mode, then for real)
    without storage_wipe_devices, the hosts read then, and a run on the first server alone with the
    ext4 drive in storage_wipe_devices."""
    tmp = tmp_path_factory.mktemp("refused-then-wiped")
    with story_lab(tmp) as storage_lab:
        drives, make_server = storage_lab
        server, blank, precious, _ = blank_and_precious(storage_lab, "pv-storage-refuse")
        blank_a, blank_b = drives(), drives()
        other = make_server("pv-storage-refuse-ok", devices=[blank_a, blank_b])
        story = SimpleNamespace(blank=blank, precious=precious, before=ext4_file_sha(precious, "precious.bin"))
        fleet = fleet_inventory(tmp / "fleet.yml", [(server, [blank, precious]), (other, [blank_a, blank_b])])
        ev = {"storage_allow_unstable_names": True, "storage_backend": "btrfs", "storage_level": "raid0"}
        story.refused = [play(fleet, tmp, ev, check=check) for check in (True, False)]
        story.btrfs_progs = [ssh(s, "dpkg -s btrfs-progs", check=False).returncode for s in (server, other)]
        story.originals = ssh(server, "ls /var/lib/provisioner/originals/storage.json", check=False).returncode
        story.fstab = ssh(server, "cat /etc/fstab").stdout
        story.after = ext4_file_sha(precious, "precious.bin")
        # blkid -p exits 2 on a blank drive, and on a missing one too: the drive is tested first.
        story.blank_type = ssh(server, f"test -b {blank} && blkid -p {blank}", check=False).returncode
        story.other_blank_type = ssh(other, f"test -b {blank_a} && blkid -p {blank_a}", check=False).returncode

        story.wiped = play(server, tmp, btrfs_vars(blank, precious, storage_wipe_devices=[precious]))
        story.wiped_type = ssh(server, f"blkid -p -s TYPE -o value {precious}", check=False).stdout.strip()
        story.wiped_df = ssh(server, "btrfs filesystem df /data", check=False).stdout
    return story


@pytest.mark.lab
def test_a_listed_drive_with_data_is_refused_without_wiping_allowed(refused_then_wiped):
    story = refused_then_wiped
    for r in story.refused:  # check mode, then for real
        assert r.rc != 0
        failures = r.failures()
        assert len(failures) == 1 and "\n" not in failures[0], failures
        assert failures[0].startswith(f"storage: refusing {story.precious}: holds an ext4 filesystem (label precious, UUID ")
        assert failures[0].endswith(f"{SEP} add it to storage_wipe_devices to allow wiping it")
        assert r.changed("storage") == [], "the storage role changed something before refusing"
    assert story.btrfs_progs == [1, 1], "packages installed before the refusal"
    assert story.originals != 0
    assert " /data " not in story.fstab
    assert story.after == story.before
    assert story.blank_type == 2, "the blank drive was touched"
    # The refusal on one host stops every host of the run before any change: the other built no array.
    assert story.other_blank_type == 2, "the other host built its array"


@pytest.mark.lab
def test_wiping_allowed_replaces_the_old_filesystem(refused_then_wiped):
    story = refused_then_wiped
    old, r = story.precious, story.wiped
    assert r.rc == 0, r.failures()
    assert any(f"wipefs --all {old}" in name or f"wipefs --all {old}" in json.dumps(res)
               for name, res in r.results("storage") if res.get("changed"))
    assert story.wiped_type == "btrfs"
    assert "Data, RAID0" in story.wiped_df


@pytest.mark.lab
def test_refusal_exit_code_through_provisioner_up(storage_lab, tmp_path):
    server, blank, precious, written = blank_and_precious(storage_lab, "pv-storage-cli", 1 << 16)
    r = subprocess.run(
        [str(VENV_BIN / "provisioner"), "up", "-i", str(server.inventory), "--tags", "plan,common,storage",
         "--no-verify", "--json", "-e", f"storage_devices=[{blank},{precious}]", "-e", "storage_allow_unstable_names=true",
         "-e", "storage_backend=btrfs"],
        capture_output=True, text=True, timeout=900)
    # site.yml runs every role's preflight before any role changes anything: bad input, 2.
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"storage: refusing {precious}: holds an ext4 filesystem" in r.stdout
    assert ext4_file_sha(precious, "precious.bin") == written
    assert ssh(server, "id ml", check=False).returncode != 0, "common changed the host before the refusal"


@pytest.mark.lab
def test_xfs_on_one_drive_end_to_end(storage_lab, tmp_path):
    drives, make_server = storage_lab
    one = drives()
    server = make_server("pv-storage-xfs", devices=[one])
    ev = {"storage_devices": [one], "storage_allow_unstable_names": True, "storage_backend": "mdadm",
          "storage_level": "single"}
    planned = play(server, tmp_path, {**ev, "storage_apply": False})
    assert planned.rc == 0, planned.failures()
    plan = ssh(server, "cat /var/lib/provisioner/storage-plan.txt").stdout
    assert plan.splitlines()[0].endswith("not applied: storage_apply is false")
    assert "mkfs.xfs -L data -m uuid=" in plan and plan.count(one) >= 2
    assert ssh(server, f"blkid -p {one}", check=False).returncode == 2, "storage_apply: false touched the drive"
    assert ssh(server, "dpkg -s xfsprogs", check=False).returncode != 0
    first = play(server, tmp_path, ev)
    assert first.rc == 0, first.failures()
    assert ssh(server, "findmnt -n -o FSTYPE,OPTIONS /data").stdout.split()[0] == "xfs"
    uuid_ = ssh(server, f"blkid -p -s UUID -o value {one}").stdout.strip()
    assert f"UUID={uuid_} /data xfs noatime,nofail 0 0" in ssh(server, "cat /etc/fstab").stdout
    assert ssh(server, "test -e /var/lib/provisioner/storage-plan.txt", check=False).returncode != 0
    second = play(server, tmp_path, ev)
    assert second.rc == 0 and second.changed("storage") == [], second.changed("storage")


@pytest.mark.lab
def test_mdadm_without_md_driver_is_skipped_with_the_plan_rendered(storage_lab, tmp_path):
    if Path("/proc/mdstat").exists():
        pytest.skip("this kernel has an md driver: the skip path is not reachable here")
    drives, make_server = storage_lab
    a, b = drives(), drives()
    server = make_server("pv-storage-md", devices=[a, b])
    ev = {"storage_devices": [a, b], "storage_allow_unstable_names": True, "storage_backend": "mdadm",
          "storage_level": "raid0"}
    first = play(server, tmp_path, ev)
    assert first.rc == 0, first.failures()
    assert any("no md driver in this kernel (/proc/mdstat absent)" in m and "skipped creating /dev/md/data" in m
               for m in first.messages())
    plan = ssh(server, "cat /var/lib/provisioner/storage-plan.txt").stdout
    create = [ln.strip() for ln in plan.splitlines() if ln.strip().startswith("mdadm --create")]
    assert len(create) == 1
    argv = create[0].split()
    assert argv[:9] == ["mdadm", "--create", "/dev/md/data", "--run", "--metadata=1.2", "--level=raid0",
                        "--raid-devices=2", "--chunk=512", "--name=data"]
    assert argv[9] == f"--homehost={server.name}" and argv[-2:] == [a, b]
    md_uuid = argv[10].split("=", 1)[1]
    assert len(md_uuid.split(":")) == 4
    assert f"ARRAY /dev/md/data metadata=1.2 UUID={md_uuid}" in plan
    mkfs = [ln.strip() for ln in plan.splitlines() if ln.strip().startswith("mkfs.xfs")]
    assert len(mkfs) == 1 and mkfs[0].endswith("-d su=512k,sw=2 /dev/md/data")
    assert "skipped: no md driver in this kernel (/proc/mdstat absent)" in plan.splitlines()[0]
    # nothing was created, mounted or persisted
    assert ssh(server, f"blkid -p {a}", check=False).returncode == 2
    assert ssh(server, "findmnt /data", check=False).returncode != 0
    assert " /data " not in ssh(server, "cat /etc/fstab").stdout
    assert ssh(server, "grep -s '^ARRAY' /etc/mdadm/mdadm.conf", check=False).returncode != 0
    assert ssh(server, "test -e /etc/udev/rules.d/60-provisioner-storage.rules", check=False).returncode != 0
    second = play(server, tmp_path, ev)
    assert second.rc == 0 and second.changed("storage") == [], second.changed("storage")
    # The refusal of a drive holding data is one rule for every backend (the drive inspection the
    # module shares): proven for real above on btrfs, per backend in tests/unit/test_storage_module.py.


@pytest.fixture(scope="module")
def proposal(lab_requirements, tmp_path_factory) -> SimpleNamespace:
    """One server with two blank drives: the plan's proposal (btrfs at /scratch) run unconfirmed,
    confirmed on kernel names, confirmed with those allowed, and that confirmed run a second time."""
    tmp = tmp_path_factory.mktemp("proposal")
    with story_lab(tmp) as (drives, make_server):
        a, b = drives(), drives()
        server = make_server("pv-storage-proposal", devices=[a, b])
        plan_vars = {"plan_storage_devices": [a, b], "plan_storage_backend": "btrfs", "plan_data_mountpoint": "/scratch"}
        confirmed = {**plan_vars, "storage_use_plan_proposal": True, "storage_allow_unstable_names": True}
        story = SimpleNamespace(a=a)

        story.proposed = play(server, tmp, plan_vars)
        story.a_after_proposed = ssh(server, f"blkid -p {a}", check=False).returncode
        story.originals_after_proposed = ssh(server, "ls /var/lib/provisioner/originals/storage.json", check=False).returncode
        story.unstable = play(server, tmp, {**plan_vars, "storage_use_plan_proposal": True})

        story.confirmed = play(server, tmp, confirmed)
        story.fstype = ssh(server, "findmnt -n -o FSTYPE /scratch", check=False).stdout.strip()
        story.df = ssh(server, "btrfs filesystem df /scratch", check=False).stdout
        story.uuid = ssh(server, "findmnt -n -o UUID /scratch", check=False).stdout.strip()
        story.fstab = ssh(server, "cat /etc/fstab").stdout

        story.second = play(server, tmp, confirmed)
        story.uuid_after_second = ssh(server, "findmnt -n -o UUID /scratch", check=False).stdout.strip()
        story.fstab_after_second = ssh(server, "cat /etc/fstab").stdout
    return story


@pytest.mark.lab
def test_the_plan_proposal_is_built_only_when_confirmed(proposal):
    story = proposal
    assert story.proposed.rc == 0, story.proposed.failures()
    assert any("storage: nothing to do" in m for m in story.proposed.messages()), "built without the user's confirmation"
    assert story.proposed.changed("storage") == []
    assert story.a_after_proposed == 2
    assert story.originals_after_proposed != 0, "a run with nothing to do recorded originals"

    # Loop devices have no by-id link: the plan proposes their kernel names, refused unless allowed.
    assert story.unstable.rc != 0
    assert story.unstable.failures()[0].startswith(f"storage: {story.a} is a kernel name, which can change across reboots")

    assert story.confirmed.rc == 0, story.confirmed.failures()
    assert story.fstype == "btrfs"
    assert "Data, RAID0" in story.df


@pytest.mark.lab
def test_the_confirmed_proposal_run_twice_changes_nothing(proposal):
    """The second run of a confirmed proposal: the plan recognises the btrfs it built at /scratch as its
    own (one member is the mount's source, the other carries the same filesystem UUID) and proposes it
    again, marked existing, instead of refusing /dev/loopN as "mounted at /scratch"; the role adopts it."""
    story = proposal
    assert story.confirmed.rc == 0, story.confirmed.failures()
    assert story.fstype == "btrfs" and story.uuid
    assert story.second.rc == 0, story.second.failures()
    assert story.second.changed() == [], story.second.changed()
    assert story.uuid_after_second == story.uuid
    assert story.fstab_after_second == story.fstab
