"""A plugin whose source changed is run again in a process that loaded it before (a warm
actor of `raymtl up` serving the next command); an unchanged one is not."""

from __future__ import annotations

import pytest

from raymtl.algorithms.registry import get_algorithm
from raymtl.plugins import load_plugin

PLUGIN = """
from raymtl.algorithms.fedavg import FedAvg
from raymtl.extend import register_algorithm

@register_algorithm
class Reloaded{tag}(FedAvg):
    name = "reloaded_{tag}"
    summary = "version {version}"
"""


@pytest.mark.parametrize("as_package", [False, True])
def test_a_changed_plugin_is_run_again_and_an_unchanged_one_is_not(
    tmp_path, monkeypatch, as_package
):
    tag = "package" if as_package else "file"
    if as_package:
        folder = tmp_path / "reload_pkg_plugin"
        folder.mkdir()
        source = folder / "impl.py"
        (folder / "__init__.py").write_text("from reload_pkg_plugin import impl  # noqa\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        entry = "reload_pkg_plugin"  # a module name: its package's files are hashed
    else:
        source = tmp_path / "reload_file_plugin.py"
        entry = str(source)
    source.write_text(PLUGIN.format(tag=tag, version=1))
    first = load_plugin(entry)
    assert get_algorithm(f"reloaded_{tag}").summary == "version 1"
    assert load_plugin(entry) is first  # unchanged: not run again

    source.write_text(PLUGIN.format(tag=tag, version=2))
    second = load_plugin(entry)
    assert second is not first
    assert get_algorithm(f"reloaded_{tag}").summary == "version 2"  # replaced, not refused
    assert load_plugin(entry) is second
