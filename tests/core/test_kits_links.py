"""`fairfl provision-complete` changes nothing through a symbolic link: a linked `local/`, a linked policy file in
it or a linked `state/` is refused naming the link, and whatever the link leads to is left exactly as it was;
with --force a link is followed only where it stays inside the kit (or the provisioning folder, for `state/`)."""

import json
import os
import stat

import pytest

from fairfl import cli
from fairfl.deploy.kits import AUTHORIZATION, complete_kits

RESOURCES = {"format_version": 2, "components": [{"id": "resource_manager", "args": {"num_of_gpus": 1}}]}


def make_kit(tmp_path):
    """A provisioning folder (`state/` beside `prod_00/`) with one site kit, as `nvflare provision` lays it out."""
    kit = tmp_path / "ws" / "prod_00" / "site-1"
    (kit / "startup").mkdir(parents=True)
    (kit / "startup" / "fed_client.json").write_text("{}")
    (kit / "local").mkdir()
    (kit / "local" / "resources.json.default").write_text(json.dumps(RESOURCES))
    (tmp_path / "ws" / "state").mkdir()
    (tmp_path / "ws" / "state" / "cert.json").write_text("root CA key")
    return kit


def outside_folder(tmp_path):
    """Someone's own files outside the kits, readable by all: their modes and contents must not change."""
    outside = tmp_path / "thesis"
    outside.mkdir()
    for name in ("resources.json", "authorization.json", "chapter1.tex"):
        (outside / name).write_text(f"{name}: keep")
        os.chmod(outside / name, 0o644)
    os.chmod(outside, 0o755)
    return outside


def snapshot(folder) -> dict:
    """{path: (mode, contents or None)} of a folder and everything in it."""
    return {
        str(p): (stat.S_IMODE(os.lstat(p).st_mode), p.read_bytes() if p.is_file() else None)
        for p in [folder, *sorted(folder.rglob("*"))]
    }


def test_a_kit_whose_local_folder_links_outside_is_refused_and_nothing_outside_changes(tmp_path, capsys):
    kit = make_kit(tmp_path)
    outside = outside_folder(tmp_path)
    (kit / "local" / "resources.json.default").rename(outside / "resources.json.default")
    (kit / "local").rmdir()
    (kit / "local").symlink_to(outside)
    before = snapshot(outside)
    prod = str(kit.parent)
    with pytest.raises(ValueError, match=f"{kit / 'local'} is a symbolic link .to {outside}.") as err:
        complete_kits(prod)
    assert "--force" in str(err.value)
    assert cli.main(["provision-complete", prod]) == 1
    printed = capsys.readouterr().err
    assert f"{kit / 'local'} is a symbolic link" in printed and "Traceback" not in printed
    assert cli.main(["provision-complete", prod, "--force"]) == 1  # outside the kit: refused even then
    assert f"{kit / 'local'} is a symbolic link to {outside}, outside {kit}" in capsys.readouterr().err
    assert snapshot(outside) == before
    # the keys are locked all the same (first, whatever is refused after)
    assert stat.S_IMODE(os.stat(kit / "startup").st_mode) == 0o700


@pytest.mark.parametrize("name", ["authorization.json", "resources.json", "resources.json.default"])
def test_a_linked_policy_file_in_local_is_refused_even_with_force_and_its_target_is_untouched(tmp_path, name):
    kit = make_kit(tmp_path)
    outside = outside_folder(tmp_path)
    link = kit / "local" / name
    if name == "resources.json.default":
        (outside / name).write_text(json.dumps(RESOURCES))
        link.unlink()
    link.symlink_to(outside / name)
    before = snapshot(outside)
    for force in (False, True):
        with pytest.raises(ValueError, match=f"{link} is a symbolic link"):
            complete_kits(str(kit.parent), force=force)
    assert snapshot(outside) == before
    policy = kit / "local" / "authorization.json"
    assert policy.is_symlink() or not policy.exists()  # nothing written beside the link either


def test_a_linked_state_folder_is_refused_and_its_target_keeps_its_modes(tmp_path, capsys):
    kit = make_kit(tmp_path)
    outside = outside_folder(tmp_path)
    state = tmp_path / "ws" / "state"
    (state / "cert.json").unlink()
    state.rmdir()
    state.symlink_to(outside)
    before = snapshot(outside)
    for force in ([], ["--force"]):
        assert cli.main(["provision-complete", str(kit.parent), *force]) == 1
        assert f"{state} is a symbolic link" in capsys.readouterr().err
    assert snapshot(outside) == before
    assert not (kit / "local" / "authorization.json").exists()  # refused before anything was written


def test_with_force_a_link_that_stays_inside_the_kit_is_followed(tmp_path):
    kit = make_kit(tmp_path)
    (kit / "local").rename(kit / "local.site")
    (kit / "local").symlink_to("local.site")
    with pytest.raises(ValueError, match="symbolic link"):
        complete_kits(str(kit.parent))
    assert complete_kits(str(kit.parent), force=True) == {str(kit): "client"}
    assert json.loads((kit / "local.site" / "authorization.json").read_text()) == AUTHORIZATION
    assert json.loads((kit / "local.site" / "resources.json").read_text())["class_list_enforcement_mode"] == "enforce"
    assert (kit / "local").is_symlink()
    # the provisioning state/ linked to a folder beside it inside the provisioning folder: locked through the link
    state = tmp_path / "ws" / "state"
    state.rename(tmp_path / "ws" / "state.real")
    state.symlink_to("state.real")
    complete_kits(str(kit.parent), force=True)
    assert stat.S_IMODE(os.stat(tmp_path / "ws" / "state.real" / "cert.json").st_mode) == 0o600
