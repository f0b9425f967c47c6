"""The `provisioner` command: parse, call, print.

Exit codes: 0 success; 1 a task or check failed on a host; 2 bad input, refused before
any host was touched; 3 a host was unreachable (network, SSH login or host key);
4 a problem on the control node itself.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from . import __version__, engine, options, render
from .errors import ExitCode, ProvisionerError

app = typer.Typer(
    help="Turn bare-metal CPU servers into tuned machine-learning boxes, prove it, keep it so.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
lab_app = typer.Typer(help="Disposable Debian 12 servers on this machine, for trying and testing.", no_args_is_help=True)
app.add_typer(lab_app, name="lab")

Inventory = Annotated[
    Path | None, typer.Option("-i", "--inventory", help="Ansible inventory file or directory [default: this machine]")
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


def _version(value: bool) -> None:
    if value:
        print(f"provisioner {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    """Discover, plan, apply, verify, report."""


def _fail(exc: ProvisionerError) -> typer.Exit:
    render.error(str(exc))
    return typer.Exit(int(exc.exit_code))


def _show_facts(
    fact: str,
    show: Callable[[dict[str, Any]], None],
    inventory: Path | None,
    limit: str | None,
    extra: list[str] | None,
    json: bool,
    accept_new: bool,
) -> None:
    """Run the read-only facts playbook and print one fact of every host."""
    try:
        inv = engine.resolve_inventory(inventory)
        result = engine.run_playbook(
            "facts.yml", inv, limit=limit, extravars=options.parse_extra_vars(extra or []), accept_new_host_keys=accept_new
        )
    except ProvisionerError as exc:
        raise _fail(exc) from exc
    if result.exit_code != ExitCode.OK:
        render.run_summary(result)
        raise typer.Exit(int(result.exit_code))
    data = {h: f.get(fact, {}) for h, f in result.facts.items()}
    render.print_json(data) if json else show(data)


@app.command()
def facts(inventory: Inventory = None, limit: Limit = None, json: Json = False, accept_new_host_keys: AcceptNew = False) -> None:
    """Discover each host's hardware: CPU, ISA, caches, memory, drives, virtualization, OS."""
    _show_facts("provisioner_hardware", render.facts, inventory, limit, None, json, accept_new_host_keys)


@app.command()
def plan(
    inventory: Inventory = None,
    limit: Limit = None,
    extra_vars: ExtraVars = None,
    json: Json = False,
    accept_new_host_keys: AcceptNew = False,
) -> None:
    """Derive the tuning plan from each host's hardware, each setting with its reason."""
    _show_facts("provisioner_plan", render.plan, inventory, limit, extra_vars, json, accept_new_host_keys)


@app.command()
def up(
    inventory: Inventory = None,
    limit: Limit = None,
    tags: Annotated[
        list[str] | None, typer.Option("--tags", "-t", help="Only roles/phases with these tags; repeatable.")
    ] = None,
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
    verbose: Annotated[int, typer.Option("-v", "--verbose", count=True, help="More Ansible output in the run log.")] = 0,
    accept_new_host_keys: AcceptNew = False,
) -> None:
    """Provision: discover, plan, apply the roles, verify, then prove it with the smoke test. Re-running changes nothing."""
    from . import reboot as reboots

    try:
        inv = engine.resolve_inventory(inventory)
        extravars = options.parse_extra_vars(extra_vars or [])
        with render.live_progress(enabled=not json and render.console.is_terminal) as progress:
            result = engine.run_playbook(
                "site.yml",
                inv,
                limit=limit,
                tags=_split(tags),
                skip_tags=_split(skip_tags),
                check=check,
                extravars=extravars,
                verbosity=verbose,
                accept_new_host_keys=accept_new_host_keys,
                on_progress=progress,
            )
        decision = reboots.decide(result.facts, result.hostvars, allow_reboot=reboot and not check)
        rebooted = None
        if decision.reboot and result.exit_code == ExitCode.OK:
            rebooted = engine.run_playbook(
                "reboot.yml", inv, limit=",".join(decision.reboot), accept_new_host_keys=accept_new_host_keys
            )
        verified = None
        failed = result.exit_code != ExitCode.OK or (rebooted is not None and rebooted.exit_code != ExitCode.OK)
        if verify_after and not check and not failed:
            from .verify import roles_for_tags, verify

            verified = verify(inv, limit=limit, roles=roles_for_tags(_split(tags), _split(skip_tags)))
            failed = verified.exit_code != ExitCode.OK
        smoked = None
        if smoke_after and not check and not failed and not tags and not skip_tags:
            from .smoke import measure

            with render.live_progress(enabled=not json and render.console.is_terminal) as progress:
                smoked = measure(
                    inv, limit=limit, extravars=extravars, accept_new_host_keys=accept_new_host_keys, on_progress=progress
                )
    except ProvisionerError as exc:
        raise _fail(exc) from exc
    code = next(
        (ExitCode(r.exit_code) for r in (result, rebooted, verified, smoked) if r is not None and r.exit_code != ExitCode.OK),
        ExitCode.OK,
    )
    if json:
        out: dict[str, Any] = result.to_dict()
        out["plan"] = {h: f.get("provisioner_plan") for h, f in result.facts.items()}
        out["reboot"] = decision.to_dict()
        out["rebooted"] = rebooted.to_dict() if rebooted else None
        out["verify"] = verified.to_dict() if verified else None
        out["smoke"] = smoked.to_dict() if smoked else None
        out["exit_code"] = int(code)
        render.print_json(out)
    else:
        if check or verbose:
            render.changes(result)
        render.run_summary(result)
        if rebooted is not None:
            render.run_summary(rebooted)
        render.reboots(decision, allowed=reboot)
        if verified is not None:
            render.verify_summary(verified)
        if smoked is not None:
            render.smoke_run(smoked)
    raise typer.Exit(int(code))


@app.command()
def undo(
    inventory: Inventory = None,
    limit: Limit = None,
    check: Annotated[bool, typer.Option("--check", help="Show what would be restored; change nothing.")] = False,
    json: Json = False,
    accept_new_host_keys: AcceptNew = False,
) -> None:
    """Restore the values provisioner's tuning changed, as recorded on each host before its first change.

    Running it twice is harmless. Base packages and the ML user stay.
    """
    try:
        inv = engine.resolve_inventory(inventory)
        with render.live_progress(enabled=not json and render.console.is_terminal) as progress:
            result = engine.run_playbook(
                "undo.yml", inv, limit=limit, check=check, accept_new_host_keys=accept_new_host_keys, on_progress=progress
            )
    except ProvisionerError as exc:
        raise _fail(exc) from exc
    if json:
        render.print_json(result.to_dict())
    else:
        render.changes(result)
        render.run_summary(result)
    raise typer.Exit(int(result.exit_code))


@app.command()
def verify(inventory: Inventory = None, limit: Limit = None, json: Json = False) -> None:
    """Check with testinfra that each host is as the roles promise."""
    from .verify import verify as run_verify

    try:
        result = run_verify(engine.resolve_inventory(inventory), limit=limit)
    except ProvisionerError as exc:
        raise _fail(exc) from exc
    render.print_json(result.to_dict()) if json else render.verify_summary(result)
    if not result.checks:
        raise typer.Exit(int(ExitCode.BAD_INPUT))
    raise typer.Exit(int(result.exit_code))


@app.command()
def smoke(
    inventory: Inventory = None,
    limit: Limit = None,
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
        typer.Option("--html", help="Write the HTML report here [default: /var/lib/provisioner/smoke/report.html]."),
    ] = None,
    extra_vars: ExtraVars = None,
    json: Json = False,
    accept_new_host_keys: AcceptNew = False,
) -> None:
    """Run the ML workloads on each host and hold every figure against the hardware's limit.

    Figures are kept per host: a later run more than 15% below the last one is flagged as a
    regression, and a --baseline run is shown next to the tuned figures (before -> after).
    """
    from .smoke import measure

    try:
        inv = engine.resolve_inventory(inventory)
        with render.live_progress(enabled=not json and render.console.is_terminal) as progress:
            result = measure(
                inv,
                limit=limit,
                profile="full" if full else "quick",
                baseline=baseline,
                extravars=options.parse_extra_vars(extra_vars or []),
                accept_new_host_keys=accept_new_host_keys,
                on_progress=progress,
                html=html,
            )
    except ProvisionerError as exc:
        raise _fail(exc) from exc
    if json:
        render.print_json(result.to_dict())
    else:
        render.smoke_run(result)
    raise typer.Exit(result.exit_code)


@app.command()
def bundle(
    dest: Annotated[
        Path | None, typer.Argument(help="Wheelhouse directory [default: /var/cache/provisioner/wheelhouse]")
    ] = None,
    component: Annotated[
        list[str] | None,
        typer.Option("-c", "--component", help="core, gbdt, torch, hpo, distributed, serving, notebook, sklearnex; repeatable."),
    ] = None,
    glibc: Annotated[
        str | None, typer.Option("--glibc", help="Oldest glibc of the targets (manylinux tag) [default: the lock's].")
    ] = None,
    index_url: Annotated[str | None, typer.Option("--index-url", help="Package index to download from.")] = None,
    torch_index_url: Annotated[str | None, typer.Option("--torch-index-url", help="Index for the PyTorch CPU wheels.")] = None,
    json: Json = False,
) -> None:
    """Build a wheelhouse of the pinned ML stack for offline installs (mlstack_wheelhouse=DIR)."""
    from . import bundle as bundles

    try:
        result = bundles.build_wheelhouse(
            dest or bundles.default_wheelhouse(),
            component or ["core", "gbdt"],
            platforms=bundles.manylinux_platforms(glibc) if glibc else None,
            index_url=index_url,
            torch_index_url=torch_index_url,
        )
    except ProvisionerError as exc:
        raise _fail(exc) from exc
    if json:
        render.print_json(result.to_dict())
    else:
        render.bundle(result)


def _split(values: list[str] | None) -> list[str]:
    return [t.strip() for v in values or [] for t in v.split(",") if t.strip()]


@lab_app.command("up")
def lab_up(
    name: Annotated[str, typer.Argument(help="Server name: lowercase letters, digits, dashes.")],
    device: Annotated[
        list[str] | None, typer.Option("--device", help="Block device to pass into the server; repeatable.")
    ] = None,
    json: Json = False,
) -> None:
    """Boot a disposable Debian 12 server (systemd-nspawn) and print how to reach it."""
    from . import lab

    try:
        server = lab.up(name, devices=device or [])
    except ProvisionerError as exc:
        raise _fail(exc) from exc
    if json:
        render.print_json(server.to_dict())
        return
    render.lab_server(server)


@lab_app.command("down")
def lab_down(name: Annotated[str, typer.Argument(help="Server name.")]) -> None:
    """Stop a lab server and discard it with every change made inside it."""
    from . import lab

    try:
        removed = lab.down(name)
    except ProvisionerError as exc:
        raise _fail(exc) from exc
    render.console.print(Text(f"{name}: {'discarded' if removed else 'no such lab server'}"))


@lab_app.command("list")
def lab_list(json: Json = False) -> None:
    """List lab servers."""
    from . import lab

    servers = lab.list_servers()
    if json:
        render.print_json([s.to_dict() for s in servers])
    else:
        render.lab_servers(servers)


def main() -> None:
    app()
