"""pyproject.toml: what `pip install .` installs, the commands it creates, and what the README says of it."""
import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT, SETUPTOOLS = PYPROJECT["project"], PYPROJECT["tool"]["setuptools"]
README = (ROOT / "README.md").read_text()


def _requirements(lines):
    return {Requirement(line).name: Requirement(line) for line in lines}


def test_runtime_dependencies_are_declared_and_the_installed_versions_satisfy_them():
    required = _requirements(PROJECT["dependencies"])
    assert set(required) == {"tensorflow", "tf-keras", "tf-slim", "keras", "numpy", "threadpoolctl",
                             "tensorflow-estimator"}
    for name, requirement in required.items():
        installed = importlib.metadata.version(name)
        assert requirement.specifier.contains(installed, prereleases=True), name
        if name in ("tensorflow", "tf-keras", "keras"):  # private APIs used: the tested minor version only
            major, minor = map(int, installed.split(".")[:2])
            assert not requirement.specifier.contains(f"{major}.{minor + 1}.0"), name


def test_extras_for_plot_tensorboard_tests_and_gpu():
    extras = {name: _requirements(lines) for name, lines in PROJECT["optional-dependencies"].items()}
    assert {name: set(reqs) for name, reqs in extras.items()} == {
        "plot": {"matplotlib"}, "tensorboard": {"tensorboard"}, "test": {"pytest", "pytest-xdist", "ruff", "mypy"},
        "gpu": {"tensorflow"}}
    assert extras["gpu"]["tensorflow"].extras == {"and-cuda"}
    assert (ROOT / "requirements.txt").read_text().splitlines()[-1] == "-e .[test,plot]"
    # Every extra a user document names exists.
    named = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for group in re.findall(r"\.\[([\w,-]+)\]", doc.read_text()):
            named.update(group.split(","))
    assert named and named <= set(extras), named - set(extras)


def test_every_command_points_at_a_main_that_takes_argv():
    for command, target in PROJECT["scripts"].items():
        module, function = target.split(":")
        tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
        mains = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function]
        assert mains and [a.arg for a in mains[0].args.args] == ["argv"], command
        assert f"`{command}`" in README


def test_readme_states_the_python_versions_pyproject_allows():
    allowed = SpecifierSet(PROJECT["requires-python"])
    versions = [f"3.{minor}" for minor in range(6, 20) if f"3.{minor}.0" in allowed]
    assert f"Python {versions[0]} to {versions[-1]}" in README
    assert allowed.contains(".".join(map(str, sys.version_info[:3])))


def test_plot_without_matplotlib_says_how_to_get_it(monkeypatch, tmp_path):
    from compare import report
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    with pytest.raises(ModuleNotFoundError, match=re.escape("--plot needs matplotlib")):
        report.write_plot(str(tmp_path / "plot.png"), [])


def test_installed_package_serves_tf1_layers_from_any_folder(tmp_path):
    """`pip install .` (here into a folder of its own) gives a user's program the shim: tf-slim's
    in-place batch norm and tf.compat.v1.layers build, run from a folder outside the checkout."""
    source, site = tmp_path / "source", tmp_path / "site"  # pip builds in the source tree: a copy
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in {name.split(".")[0] for name in SETUPTOOLS["packages"]}:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(source)], check=True, capture_output=True)
    program = tmp_path / "user_program.py"
    program.write_text(textwrap.dedent("""
        from legacy import slim_compat  # noqa: F401  (before tf_slim)
        import numpy as np
        import tensorflow.compat.v1 as tf
        import tf_slim as slim
        with tf.Graph().as_default():
            x = tf.constant(np.ones((4, 3), np.float32))
            y = slim.batch_norm(x, is_training=True, updates_collections=None)
            z = tf.layers.dense(y, 2)
            with tf.Session() as sess:
                sess.run(tf.global_variables_initializer())
                print("shape", sess.run(z).shape, "from", slim_compat.__file__)
    """))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    done = subprocess.run([sys.executable, str(program)], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"shape (4, 2) from {site}" in done.stdout


def test_every_package_folder_is_installed():
    """`pip install .` installs the packages [tool.setuptools] lists, and only those: a folder with an
    __init__.py that the list lacks (a subpackage such as legacy/run_tf1/) would be missing."""
    listed = set(SETUPTOOLS["packages"])
    found = {".".join(init.parent.relative_to(ROOT).parts) for top in {name.split(".")[0] for name in listed}
             for init in (ROOT / top).rglob("__init__.py")}
    assert found == listed
