"""The `provisioner` command: parse, call, print (what each command does: provisioner.commands).

Exit codes: 0 success; 1 a task or check failed on a host; 2 bad input, refused with no change
on any host; 3 a host was unreachable (network, SSH login or host key); 4 a problem on the
control node itself; 130 interrupted by SIGINT or SIGTERM (every process of the run ended first).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NamedTuple, NoReturn

import typer

from . import __version__, commands, options, render
from .errors import BadInput, Interrupted, ProvisionerError
from .result import Result, interrupted, refused
from .runs import ProgressCallback

app = typer.Typer(
    help="Turn bare-metal CPU servers into tuned machine-learning boxes, prove it, keep it so.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
lab_app = typer.Typer(help="Disposable Debian 12 servers on this machine, for trying and testing.", no_args_is_help=True)
app.add_typer(lab_app, name="lab")
serve_app = typer.Typer(help="The model server (role serving): its workers, and new model versions.", no_args_is_help=True)
app.add_typer(serve_app, name="serve")

Inventory = Annotated[
    Path | None, typer.Option("-i", "--inventory", help="Ansible inventory file or directory (default: this machine)")
]
Limit = Annotated[str | None, typer.Option("--limit", "-l", help="Only these hosts or groups (Ansible pattern).")]
Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
ExtraVars = Annotated[
    list[str] | None,
    typer.Option("-e", "--extra-vars", help="Set a role or plan option, KEY=VALUE (YAML value); repeatable."),
]
AcceptNew = Annotated[
    bool,
    typer.Option(
        "--accept-new-host-keys",
        help="Trust the SSH host key of a host seen for the first time (a changed key is still refused).",
    ),
]
ConnectTimeout = Annotated[
    int,
    typer.Option(
        "--connect-timeout",
        help="Seconds a host may take to answer before it is reported unreachable (an inventory's ansible_timeout wins).",
    ),
]


class Hosts(NamedTuple):
    """Which hosts a command runs on: --inventory and --limit."""

    inventory: Path | None
    limit: str | None


class Ssh(NamedTuple):
    """How a command reaches them: --accept-new-host-keys and --connect-timeout."""

    accept_new_host_keys: bool
    connect_timeout: int


def _reach(hosts: Hosts, ssh: Ssh) -> dict[str, Any]:
    """The keyword arguments every command run on the hosts takes from --limit and
    --accept-new-host-keys (--connect-timeout holds for the whole command: _finish)."""
    return {"limit": hosts.limit, "accept_new_host_keys": ssh.accept_new_host_keys}


_KEYWORD = inspect.Parameter.KEYWORD_ONLY
# The options each group stands for in a command's signature, in the order --help lists them.
_GROUPS: dict[str, tuple[inspect.Parameter, ...]] = {
    "hosts": (
        inspect.Parameter("inventory", _KEYWORD, default=None, annotation=Inventory),
        inspect.Parameter("limit", _KEYWORD, default=None, annotation=Limit),
    ),
    "ssh": (
        inspect.Parameter("accept_new_host_keys", _KEYWORD, default=False, annotation=AcceptNew),
        inspect.Parameter("connect_timeout", _KEYWORD, default=commands.DEFAULT_CONNECT_TIMEOUT, annotation=ConnectTimeout),
    ),
}


def _on_hosts(command: Callable[..., None]) -> Callable[..., None]:
    """A command run on an inventory's hosts: its parameter `hosts` (a Hosts) stands for --inventory
    and --limit, its parameter `ssh` (an Ssh, where it has one) for --accept-new-host-keys and
    --connect-timeout, each group in its parameter's place among the command's own options."""
    own = list(inspect.signature(command, eval_str=True).parameters.values())
    shown = [q for p in own for q in _GROUPS.get(p.name, (p.replace(kind=_KEYWORD),))]

    @functools.wraps(command)
    def run(**given: Any) -> None:
        grouped: dict[str, Hosts | Ssh] = {"hosts": Hosts(given.pop("inventory"), given.pop("limit"))}
        if "accept_new_host_keys" in given:
            grouped["ssh"] = Ssh(given.pop("accept_new_host_keys"), given.pop("connect_timeout"))
        command(**given, **grouped)

    run.__signature__ = inspect.Signature(shown, return_annotation=None)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in shown}
    return run


def _version(value: bool) -> None:
    if value:
        print(f"provisioner {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    """Discover, plan, apply, verify, report."""


def _finish(
    command: str,
    json: bool,
    call: Callable[[ProgressCallback | None], Result[Any]],
    show: Callable[[Any], None],
    *,
    progress: bool = False,
    ssh: Ssh | None = None,
) -> NoReturn:
    """The one way every command ends: call it, print its result (tables, or the JSON
    envelope with --json), its notes and errors, and exit with its code. An error raised
    before the command had anything to show leaves the same way, as a result without data.
    SIGINT or SIGTERM stops the command's run as a whole (commands.interruptible): the result
    then says so, exit code 130."""
    with commands.interruptible():
        try:
            if ssh is not None:
                commands.set_connect_timeout(ssh.connect_timeout)
            with render.live_progress(enabled=progress and not json and render.console.is_terminal) as on_progress:
                result = call(on_progress)
        except (ProvisionerError, Interrupted) as exc:
            result = refused(command, exc)
        result = interrupted(result, commands.interrupted_by())
    if json:
        render.print_json(result.envelope())
        render.notes((), result.errors)
    else:
        if result.value is not None:
            show(result.value)
        render.notes(result.messages, result.errors)
    raise typer.Exit(int(result.exit_code))


def _read(
    command: str, json: bool, hosts: Hosts, ssh: Ssh, call: Callable[..., Result[Any]], show: Callable[[Any], None]
) -> NoReturn:
    """A command that only reads each host (facts, status, serve status): CALL(inventory, limit=...,
    accept_new_host_keys=...) and SHOW its result."""
    _finish(
        command,
        json,
        lambda _: call(hosts.inventory, **_reach(hosts, ssh)),
        show,
        ssh=ssh,
    )


@app.command()
@_on_hosts
def facts(*, hosts: Hosts, json: Json = False, ssh: Ssh) -> None:
    """Discover each host's hardware: CPU, ISA, caches, memory, drives, virtualization, OS."""
    _read("facts", json, hosts, ssh, commands.facts, lambda outcome: render.fact_run(outcome, render.facts))


@app.command()
@_on_hosts
def plan(*, hosts: Hosts, extra_vars: ExtraVars = None, json: Json = False, ssh: Ssh) -> None:
    """Derive the tuning plan from each host's hardware, each setting with its reason."""
    _finish(
        "plan",
        json,
        lambda _: commands.plan(hosts.inventory, extravars=options.parse_extra_vars(extra_vars or []), **_reach(hosts, ssh)),
        lambda outcome: render.fact_run(outcome, render.plan),
        ssh=ssh,
    )


@app.command()
@_on_hosts
def up(
    *,
    hosts: Hosts,
    tags: Annotated[list[str] | None, typer.Option("--tags", "-t", help="Only roles/phases with these tags; repeatable.")] = None,
    skip_tags: Annotated[
        list[str] | None, typer.Option("--skip-tags", help="Skip roles/phases with these tags; repeatable.")
    ] = None,
    check: Annotated[bool, typer.Option("--check", help="Show what would change, with diffs; change nothing.")] = False,
    extra_vars: ExtraVars = None,
    reboot: Annotated[
        bool,
        typer.Option("--reboot", help="Reboot hosts whose tuning needs it, once each, then verify (never this machine)."),
    ] = False,
    verify_after: Annotated[bool, typer.Option("--verify/--no-verify", help="Run the testinfra checks after applying.")] = True,
    smoke_after: Annotated[
        bool,
        typer.Option(
            "--smoke/--no-smoke", help="Last step of a full run (no --tags): the quick workload smoke test (provisioner smoke)."
        ),
    ] = True,
    json: Json = False,
    verbose: Annotated[
        int, typer.Option("-v", "--verbose", count=True, help="More Ansible output in the run log; every change and check.")
    ] = 0,
    ssh: Ssh,
    batch: Annotated[
        str | None,
        typer.Option(
            "--batch",
            help="Roll over the fleet: each role's play runs on N hosts (or P% of them) at a time, batch after batch.",
        ),
    ] = None,
    max_fail: Annotated[
        str | None,
        typer.Option(
            "--max-fail",
            help="With --batch: stop the roll when more than P% of a batch failed (0%: at the first failure).",
        ),
    ] = None,
) -> None:
    """Provision: discover, plan, apply the roles, verify, then prove it with the smoke test. Re-running changes nothing."""
    _finish(
        "up",
        json,
        lambda on_progress: commands.up(
            hosts.inventory,
            tags=_split(tags),
            skip_tags=_split(skip_tags),
            check=check,
            extravars=options.parse_extra_vars(extra_vars or []),
            reboot=reboot,
            verify_after=verify_after,
            smoke_after=smoke_after,
            verbosity=verbose,
            on_progress=on_progress,
            batch=batch,
            max_fail=max_fail,
            **_reach(hosts, ssh),
        ),
        lambda outcome: render.up(outcome, verbose=bool(verbose)),
        progress=True,
        ssh=ssh,
    )


@app.command()
@_on_hosts
def undo(
    *,
    hosts: Hosts,
    check: Annotated[bool, typer.Option("--check", help="Show what would be restored; change nothing.")] = False,
    reboot: Annotated[
        bool,
        typer.Option(
            "--reboot", help="Reboot hosts whose restore needs it (the kernel command line), once each (never this machine)."
        ),
    ] = False,
    tags: Annotated[
        list[str] | None,
        typer.Option("--tags", "-t", help="Only the undo of roles with these tags (as up --tags); repeatable."),
    ] = None,
    skip_tags: Annotated[
        list[str] | None, typer.Option("--skip-tags", help="Leave the roles with these tags as they are.")
    ] = None,
    json: Json = False,
    ssh: Ssh,
) -> None:
    """Restore the values provisioner's tuning changed, as recorded on each host before its first change.

    Running it twice is harmless. Base packages and the ML user stay.
    """
    _finish(
        "undo",
        json,
        lambda on_progress: commands.undo(
            hosts.inventory,
            check=check,
            reboot=reboot,
            tags=_split(tags),
            skip_tags=_split(skip_tags),
            on_progress=on_progress,
            **_reach(hosts, ssh),
        ),
        render.undo,
        progress=True,
        ssh=ssh,
    )


@app.command()
@_on_hosts
def rollback(
    *,
    hosts: Hosts,
    to: Annotated[
        str | None,
        typer.Option("--to", help="The generation to return to (provisioner status lists them); default the previous one."),
    ] = None,
    json: Json = False,
    ssh: Ssh,
) -> None:
    """Switch the ML environment back to the previous generation (or --to GEN), in seconds.

    The services that ran from the generation it leaves (model server workers one at a time, the
    Ray node) restart; running jobs keep their generation. Every host is checked first.
    """
    _finish(
        "rollback",
        json,
        lambda progress: commands.rollback(hosts.inventory, to, on_progress=progress, **_reach(hosts, ssh)),
        render.run_summary,
        progress=True,
        ssh=ssh,
    )


@app.command()
@_on_hosts
def verify(
    *,
    hosts: Hosts,
    tags: Annotated[
        list[str] | None,
        typer.Option("--tags", "-t", help="Only the checks of roles with these tags (as up --tags); repeatable."),
    ] = None,
    skip_tags: Annotated[list[str] | None, typer.Option("--skip-tags", help="Skip the checks of roles with these tags.")] = None,
    json: Json = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="Every check, not one line per role.")] = False,
) -> None:
    """Check with testinfra that each host is as the roles promise: one line per host and role."""
    _finish(
        "verify",
        json,
        lambda _: commands.verify(hosts.inventory, limit=hosts.limit, tags=_split(tags), skip_tags=_split(skip_tags)),
        lambda result: render.verify_summary(result, verbose),
    )


@app.command()
@_on_hosts
def status(*, hosts: Hosts, json: Json = False, ssh: Ssh) -> None:
    """Show, per host, every setting the roles manage: expected, live, and ok / drifted / not applicable.

    Changes nothing and needs no smoke run. Exit code 1 when anything drifted (provisioner up
    repairs it), 2 for a host never provisioned.
    """
    _read("status", json, hosts, ssh, commands.status, render.status)


@app.command()
@_on_hosts
def smoke(
    *,
    hosts: Hosts,
    full: Annotated[
        bool,
        typer.Option("--full/--quick", help="Workload sizes: quick (about 90 s on 2 cores) or full (the scale of real jobs)."),
    ] = False,
    baseline: Annotated[
        bool,
        typer.Option(
            "--baseline",
            help="Measure the machine as before provisioning: a stock pip stack in a throwaway venv, no thread settings.",
        ),
    ] = False,
    html: Annotated[
        Path | None,
        typer.Option("--html", help="Write the HTML report here (default: /var/lib/provisioner/smoke/report.html)."),
    ] = None,
    cluster: Annotated[
        bool,
        typer.Option(
            "--cluster",
            help="The distributed trials on the Ray cluster (role ray), driven from its head (every node vs the head "
            "alone), and the head's own checks (idle host, threads, THP, governor, data mount); only the hosts of "
            "ray_head and ray_workers take part, any other is left out and named.",
        ),
    ] = False,
    config_only: Annotated[
        bool,
        typer.Option(
            "--config-only",
            help="No workload, only the configuration checks (threads, THP, governor, data mount): seconds, no ML "
            "environment needed; nothing kept as the last run.",
        ),
    ] = False,
    extra_vars: ExtraVars = None,
    json: Json = False,
    ssh: Ssh,
) -> None:
    """Run the ML workloads on each host and hold every figure against the hardware's limit.

    Figures are kept per host: a later run more than 15% below the last one is flagged as a
    regression, and a --baseline run is shown next to the tuned figures (before -> after).
    """
    _finish(
        "smoke",
        json,
        lambda on_progress: commands.smoke(
            hosts.inventory,
            profile="full" if full else "quick",
            baseline=baseline,
            extravars={**options.parse_extra_vars(extra_vars or []), **({"smoke_cluster": True} if cluster else {})},
            on_progress=on_progress,
            html=html,
            config_only=config_only,
            **_reach(hosts, ssh),
        ),
        render.smoke_run,
        progress=True,
        ssh=ssh,
    )


@app.command()
@_on_hosts
def tune(
    *,
    hosts: Hosts,
    workloads: Annotated[
        str | None,
        typer.Option(
            "--workloads",
            help="Comma-separated workloads to tune (default: every one with a tune objective; parquet and tensorflow only when named).",
        ),
    ] = None,
    knobs: Annotated[
        str | None, typer.Option("--knobs", help="Comma-separated knobs to search (default: every knob of those workloads).")
    ] = None,
    budget: Annotated[str, typer.Option("--budget", help="Wall-clock time the search may take per host: 10m, 90s, 1h.")] = "10m",
    write: Annotated[
        bool,
        typer.Option(
            "--write",
            help="Put the kept values into the inventory as the plan's overrides (host_vars/HOST.yml; a class of several hosts: its group's group_vars).",
        ),
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Measure even when the host is busy.")] = False,
    html: Annotated[
        Path | None,
        typer.Option("--html", help="Write the HTML report here (default: /var/lib/provisioner/tune/report.html)."),
    ] = None,
    json: Json = False,
    ssh: Ssh,
) -> None:
    """Measure this box's best values of the plan's knobs on the team's workloads, and write them back.

    Every candidate is measured in interleaved pairs against the plan's rule as the ML user runs
    it; a value is kept only when it beats the rule by more than the noise. Hosts with the same
    hardware are measured once. Without --write nothing changes but the studies kept on the host.
    """
    _finish(
        "tune",
        json,
        lambda on_progress: commands.tune(
            hosts.inventory,
            workloads=_split([workloads] if workloads else None),
            knobs=_split([knobs] if knobs else None),
            budget=budget,
            write=write,
            force=force,
            html=html,
            on_progress=on_progress,
            **_reach(hosts, ssh),
        ),
        render.tune,
        progress=True,
        ssh=ssh,
    )


@app.command()
def bundle(
    dest: Annotated[Path | None, typer.Argument(help="Wheelhouse directory (default: /var/cache/provisioner/wheelhouse)")] = None,
    component: Annotated[
        list[str] | None,
        typer.Option(
            "-c",
            "--component",
            help="core, gbdt, torch, hpo, serving (the default), tensorflow, distributed, notebook, sklearnex; repeatable.",
        ),
    ] = None,
    glibc: Annotated[
        str | None, typer.Option("--glibc", help="Oldest glibc of the targets (manylinux tag; default: the lock's).")
    ] = None,
    index_url: Annotated[str | None, typer.Option("--index-url", help="Package index to download from.")] = None,
    extra_index_url: Annotated[
        list[str] | None, typer.Option("--extra-index-url", help="Another package index; repeatable.")
    ] = None,
    torch_index_url: Annotated[str | None, typer.Option("--torch-index-url", help="Index for the PyTorch CPU wheels.")] = None,
    lock: Annotated[Path | None, typer.Option("--lock", help="The lock file (default: requirements/mlstack.lock).")] = None,
    python_version: Annotated[
        str | None, typer.Option("--python-version", help="The targets' Python (default: 3.11, Debian 12's).")
    ] = None,
    update_lock: Annotated[
        bool,
        typer.Option("--update-lock", help="Resolve the lock's requirements again and rewrite the lock, instead of building."),
    ] = False,
    upgrade: Annotated[
        bool,
        typer.Option("--upgrade", help="With --update-lock: pin every package afresh (default: keep the existing pins)."),
    ] = False,
    json: Json = False,
) -> None:
    """Build a wheelhouse of the pinned ML stack for offline installs (mlstack_wheelhouse=DIR)."""
    _finish(
        "bundle",
        json,
        lambda _: commands.bundle(
            dest,
            component or [],
            update_lock=update_lock,
            upgrade=upgrade,
            lock=lock,
            python_version=python_version,
            glibc=glibc,
            index_url=index_url,
            extra_index_urls=extra_index_url or [],
            torch_index_url=torch_index_url,
        ),
        lambda outcome: render.lock_update(outcome) if update_lock else render.bundle(outcome),
    )


def _split(values: list[str] | None) -> list[str]:
    return [t.strip() for v in values or [] for t in v.split(",") if t.strip()]


@lab_app.command("up")
def lab_up(
    name: Annotated[str, typer.Argument(help="Server name: lowercase letters, digits, dashes.")],
    device: Annotated[
        list[str] | None, typer.Option("--device", help="Block device to pass into the server; repeatable.")
    ] = None,
    vm: Annotated[
        bool, typer.Option("--vm", help="A full virtual machine (qemu, its own kernel, grub) instead of a container.")
    ] = False,
    drives: Annotated[int, typer.Option("--drives", help="With --vm: this many virtual NVMe drives (serials DATA0...).")] = 0,
    drive_size: Annotated[str, typer.Option("--drive-size", help="With --vm: the size of each drive, e.g. 4G.")] = "4G",
    boot_timeout: Annotated[
        float, typer.Option("--boot-timeout", help="With --vm: seconds to wait for ssh before the VM is removed.")
    ] = 600.0,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="As a minimal install leaves a server: no python3-apt, no /etc/hosts, its host key in no known_hosts.",
        ),
    ] = False,
    cpu_weight: Annotated[
        int | None,
        typer.Option(
            "--cpu-weight",
            help="Run the server's processes in a cpu cgroup of their own with this weight, 1 to 10000 (100: as any "
            "other session here); e.g. 1000 for a server whose smoke test should measure as on a machine of its own.",
        ),
    ] = None,
    json: Json = False,
) -> None:
    """Boot a disposable Debian 12 server (systemd-nspawn, or qemu with --vm) and print how to reach it."""
    _finish(
        "lab up",
        json,
        lambda _: _lab_up(name, device or [], vm, drives, drive_size, boot_timeout, fresh, cpu_weight),
        render.lab_server,
    )


def _lab_up(
    name: str,
    devices: list[str],
    vm: bool,
    drives: int,
    drive_size: str,
    boot_timeout: float,
    fresh: bool = False,
    cpu_weight: int | None = None,
) -> Result[Any]:
    from .lab import cpu

    if cpu_weight is not None and (problem := cpu.weight_problem(cpu_weight)):
        raise BadInput(f"--cpu-weight {cpu_weight}: {problem}")
    if not vm:
        if drives or drive_size != "4G" or boot_timeout != 600.0:
            raise BadInput("--drives, --drive-size and --boot-timeout are for lab VMs: add --vm")
        return commands.lab_up(name, devices, fresh, cpu_weight)
    if cpu_weight is not None:
        raise BadInput("--cpu-weight is for container lab servers: leave out --vm")
    if fresh:
        raise BadInput("--fresh is for container lab servers: leave out --vm")
    if devices:
        raise BadInput("--device is for container lab servers: a lab VM gets virtual drives with --drives N")
    if boot_timeout <= 0:
        raise BadInput(f"--boot-timeout {boot_timeout:g}: give a positive number of seconds")
    from . import lab

    return Result("lab up", lab.up_vm(name, drives=drives, drive_size=drive_size, boot_timeout=boot_timeout))


@lab_app.command("down")
def lab_down(name: Annotated[str, typer.Argument(help="Server name.")], json: Json = False) -> None:
    """Stop a lab server and discard it with every change made inside it."""
    _finish("lab down", json, lambda _: commands.lab_down(name), render.lab_down)


@lab_app.command("drive")
def lab_drive(
    name: Annotated[str, typer.Argument(help="Lab VM name.")],
    index: Annotated[int, typer.Argument(help="The drive's number (0 for serial DATA0).")],
    remove: Annotated[bool, typer.Option("--remove", help="Pull the drive out of the running VM.")] = False,
    put_back: Annotated[bool, typer.Option("--return", help="Put the drive back: the same image and serial.")] = False,
    json: Json = False,
) -> None:
    """Take a lab VM's NVMe drive out while it runs, as a failed or pulled drive, or put it back."""
    _finish("lab drive", json, lambda _: _lab_drive(name, index, remove, put_back), _lab_drive_shown)


def _lab_drive(name: str, index: int, remove: bool, put_back: bool) -> Result[dict[str, Any]]:
    if remove == put_back:
        raise BadInput("lab drive: give exactly one of --remove and --return")
    from . import lab

    changed = lab.set_drive(name, index, present=put_back)
    return Result("lab drive", {"name": name, "drive": index, "present": put_back, "changed": changed})


def _lab_drive_shown(data: dict[str, Any]) -> None:
    where = "in" if data["present"] else "out"
    was = "" if data["changed"] else f" (it was {where} already)"
    render.console.print(f"lab VM {data['name']}: drive {data['drive']} is {where}{was}")


@lab_app.command("list")
def lab_list(json: Json = False) -> None:
    """List lab servers: kind (container or vm) and, for a VM, its accelerator (kvm or tcg)."""
    _finish("lab list", json, lambda _: commands.lab_list(), _lab_servers)


def _lab_servers(servers: list[Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title="lab servers")
    for col in ("name", "kind", "accel", "address", "state", "inventory"):
        table.add_column(col)
    for s in servers:
        address = s.address if s.port == 22 else f"{s.address}:{s.port}"
        state = "up" if s.alive else "dead (run lab down)"
        table.add_row(Text(s.name), s.kind, s.accel or "-", address, state, Text(str(s.inventory)))
    render.console.print(table)


@serve_app.command("status")
@_on_hosts
def serve_status(*, hosts: Hosts, json: Json = False, ssh: Ssh) -> None:
    """Per host and worker: unit state, CPU slice, threads, model versions, cache and requests/s.

    Changes nothing; requests/s are counted over one second from each worker's own metrics. Exit code 1 when a worker is not active, not answering or not ready; 2 where no model server is deployed.
    """
    _read("serve status", json, hosts, ssh, commands.serve_status, render.serve_status)


@serve_app.command("load")
@_on_hosts
def serve_load(
    model: Annotated[str, typer.Argument(help="NAME/VERSION of the model version to add, e.g. fraud/7.")],
    source: Annotated[Path, typer.Option("--from", help="Directory on this machine holding metadata.json and the model file.")],
    *,
    hosts: Hosts,
    json: Json = False,
    ssh: Ssh,
) -> None:
    """Add a model version to the registry and roll it in worker by worker, without dropping requests.

    The server's own check runs first: a corrupt model or a registry over the memory budget is
    refused, the version removed again, and the versions already serving keep serving.
    """
    _finish(
        "serve load",
        json,
        lambda progress: commands.serve_load(hosts.inventory, model, source, on_progress=progress, **_reach(hosts, ssh)),
        render.run_summary,
        progress=True,
        ssh=ssh,
    )


def blocking_stdio() -> None:
    """Make stdin, stdout and stderr blocking again. ssh makes the stdio it inherits non-blocking while
    it runs, and one that was killed leaves the terminal so; ansible then refuses every run
    ("Ansible requires blocking IO"), though nothing is wrong but that flag."""
    for fd in (0, 1, 2):
        try:
            if not os.get_blocking(fd):
                os.set_blocking(fd, True)
        except OSError:  # closed, or not a file
            pass


def main() -> None:
    blocking_stdio()
    app()
