"""The package declares ranges; constraints.txt pins what is tested; the ranges accept the pins.

No wheel is downloaded: the declared specifiers are checked with ``packaging`` against the
versions constraints.txt pins (the newest torch and transformers csdgen is tested with) and
against the versions installed here.
"""

import re
import tomllib
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
REQUIREMENTS = [Requirement(r) for r in PROJECT["dependencies"]] + [
    Requirement(r) for extra in PROJECT["optional-dependencies"].values() for r in extra]


def pins() -> dict[str, Version]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, ver = line.partition("==")
            assert ver, f"constraints.txt line {line!r} is not an exact pin"
            out[canonicalize_name(name)] = Version(ver)
    return out


def test_the_package_declares_ranges_not_exact_pins():
    for req in REQUIREMENTS:
        assert not any(s.operator in ("==", "===") for s in req.specifier), f"{req} is an exact pin: put it in constraints.txt"
        assert req.specifier, f"{req} has no range"
    assert "==" not in " ".join(PROJECT["requires-python"])


@pytest.mark.parametrize("req", REQUIREMENTS, ids=str)
def test_every_declared_dependency_is_pinned_and_its_range_accepts_the_pin(req):
    pinned = pins()
    name = canonicalize_name(req.name)
    assert name in pinned, f"{req.name} is declared but not pinned in constraints.txt"
    assert req.specifier.contains(pinned[name], prereleases=True), f"{req} does not accept the tested {pinned[name]}"


def test_newest_torch_and_transformers_tested_are_accepted_by_the_metadata():
    """The versions CI installs (constraints.txt) are the newest tested; the declared ranges take them."""
    declared = {canonicalize_name(r.name): r.specifier for r in REQUIREMENTS}
    pinned = pins()
    for name in ("torch", "transformers"):
        assert declared[name].contains(pinned[name]), (name, declared[name], pinned[name])
        here = Version(installed_version(name))  # e.g. 2.13.0+cpu: the local label does not matter
        assert declared[name].contains(here), (name, declared[name], here)
    assert SpecifierSet(PROJECT["requires-python"]).contains("3.11")


def test_ci_and_readme_install_with_the_constraints_file():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"pip install .*-c constraints\.txt", ci)
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    assert all("-c constraints.txt" in block for block in blocks[:2] if "pip install" in block)
    assert "pip install -c constraints.txt ." in blocks[0] and 'pip install -c constraints.txt -e ".[test]"' in blocks[1]


def test_the_package_ships_its_licence():
    """The metadata said Apache-2.0, and no licence text shipped (a new user's `pip show`)."""
    from importlib.metadata import distribution

    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    installed = distribution("csdgen")
    assert installed.metadata.get("License-Expression") == "Apache-2.0"
    assert "LICENSE" in installed.metadata.get_all("License-File", [])
    assert any(str(f).endswith("LICENSE") for f in installed.files or [])


def test_builtin_weights_stay_under_25_mb_and_ship_with_the_package():
    """Issue 19: the built-in model's files stay under 25 MB in all; package-data includes every one."""
    folder = ROOT / "csdgen" / "builtin" / "weights"
    files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".json"))
    assert {p.name for p in files} >= {"ar.safetensors", "vq.safetensors", "classifier.safetensors", "config.json",
                                       "metrics.json", "reference_features.safetensors"}
    assert sum(p.stat().st_size for p in files) < 25_000_000, [(p.name, p.stat().st_size) for p in files]
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["csdgen.builtin"]
    assert {"weights/*.safetensors", "weights/*.json"} <= set(data)


def test_the_builtin_models_third_party_notices_and_class_list_ship_with_the_package():
    """The shipped config.json holds emoji-datasource's names (MIT: its copyright and permission notice must go
    with them), and the built-in README's retraining recipe reads classes.json: neither was in the wheel."""
    folder = ROOT / "csdgen" / "builtin"
    notice = (folder / "LICENSE-emoji-datasource").read_text()
    assert "Copyright (c) 2013 Cal Henderson" in notice and "Permission is hereby granted, free of charge" in notice
    assert "LICENSE-emoji-datasource" in (folder / "README.md").read_text()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["csdgen.builtin"]
    assert {"LICENSE-emoji-datasource", "classes.json"} <= set(data)


#: the GPU machine's image (Python 3.12, torch 2.11 with CUDA 13, transformers 5.17), where csdgen is installed
#: with ``pip install --no-deps --no-build-isolation -e .``: its pins do not apply, its ranges must
GPU_IMAGE = {"torch": "2.11.0+cu130", "transformers": "5.17.0", "python": "3.12"}


def test_the_gpu_machine_image_versions_are_in_the_declared_ranges():
    declared = {canonicalize_name(r.name): r.specifier for r in REQUIREMENTS}
    for name in ("torch", "transformers"):
        assert declared[name].contains(Version(GPU_IMAGE[name])), (name, declared[name], GPU_IMAGE[name])
    assert SpecifierSet(PROJECT["requires-python"]).contains(GPU_IMAGE["python"])
