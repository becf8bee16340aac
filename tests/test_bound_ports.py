"""Servers under test take their ports when they bind them (DEVELOPERS.md): a port found free by one
process and bound later by another can be taken in between, by any test running beside it. Every
server the suite, the benchmarks and the local pipeline start binds port 0 and reports the port it
got (serving.port_file); tests/test_serving_server.py runs that path for real. Only TF_CONFIG, which
names every task's port before any task starts, still chooses ports ahead (trainer/)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO_ROOT

from serving.port_file import read_port_file, write_port_file

PORT_CHOOSER = "free_ports"  # common.ports: free now, maybe not when bound
# Where servers are started beside the code that talks to them.
SERVER_STARTERS = ("tests", "serving", "benchmarks", "tools", "pipeline/local.py", "pipeline/local_canary.py")


def functions_called(path: Path) -> set[str]:
    """The names of the functions `path` calls (`f(...)`, `module.f(...)`): a test of the TF_CONFIG
    launcher may stand in for the port chooser, but nothing here calls it."""
    calls = [node.func for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)]
    return {func.id if isinstance(func, ast.Name) else func.attr for func in calls
            if isinstance(func, (ast.Name, ast.Attribute))}


def test_no_server_is_given_a_port_chosen_before_it_binds():
    files = [path for start in SERVER_STARTERS for path in (
        sorted((REPO_ROOT / start).rglob("*.py")) if (REPO_ROOT / start).is_dir() else [REPO_ROOT / start])]
    assert len(files) > 40
    choosers = [path for path in files if PORT_CHOOSER in functions_called(path)]
    assert [str(path.relative_to(REPO_ROOT)) for path in choosers] == []


def test_the_check_sees_a_port_chosen_ahead(tmp_path):
    chooser = tmp_path / "chooser.py"
    chooser.write_text("from common import ports\nport = ports.free_ports(1)[0]\n")
    assert PORT_CHOOSER in functions_called(chooser)


def test_a_port_file_is_absent_until_written_whole(tmp_path):
    path = tmp_path / "server.ports"
    assert read_port_file(path) is None
    write_port_file(path, {"http": 41234, "grpc": 41235})
    assert read_port_file(path) == {"http": 41234, "grpc": 41235}
    assert [p.name for p in tmp_path.iterdir()] == ["server.ports"]  # nothing left beside it
