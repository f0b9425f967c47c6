from provisioner.verify import roles_for_tags, site_roles


def test_site_roles_in_order():
    roles = site_roles()
    assert roles[:2] == ("plan", "common")
    assert {"cpu_tuning", "hugepages", "thread_env", "allocator"} <= set(roles)


def test_tags_select_roles_and_phases():
    assert roles_for_tags(["plan", "common"]) == ("plan", "common")
    assert roles_for_tags(["common_install"]) == ("common",)
    assert roles_for_tags([], ["allocator"]) == tuple(r for r in site_roles() if r != "allocator")
    assert roles_for_tags(["all"]) == site_roles()


def test_each_part_of_a_limit_is_its_own_ansible_host_spec(tmp_path):
    """testinfra splits --hosts at commas: `ansible://a,b` would send b to the local backend."""
    import testinfra

    from provisioner import engine
    from provisioner.verify import hostspecs

    engine.ensure_tools_on_path()  # testinfra runs ansible-inventory, as verify does

    assert hostspecs(None) == "ansible://all"
    assert hostspecs("a,b") == hostspecs("a:b") == "ansible://a,ansible://b"
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    a: {ansible_connection: local}\n    b: {ansible_connection: local}\n    c: {}\n")
    hosts = testinfra.get_hosts(hostspecs("a,b").split(","), ansible_inventory=str(inventory))
    assert sorted(h.backend.get_hostname() for h in hosts) == ["a", "b"]
    assert {h.backend.NAME for h in hosts} == {"ansible"}


def test_verify_refuses_tags_that_leave_no_role(tmp_path):
    import pytest

    from provisioner import commands
    from provisioner.errors import BadInput

    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    a: {ansible_connection: local}\n")
    with pytest.raises(BadInput, match="unknown tag"):
        commands.verify(inventory, tags=["nosuchrole"])
    with pytest.raises(BadInput, match="leave no role to check"):
        commands.verify(inventory, skip_tags=list(site_roles()))
