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
