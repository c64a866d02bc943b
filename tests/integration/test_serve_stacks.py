"""The test harness's own diagnosis (tests/support/serve.py): a wait on a real ``ourios
serve`` that times out names every thread's stack in the node and in its workers, so a
start that never becomes ready says where it stopped (once in CI it left only a tail)."""

from __future__ import annotations

from pathlib import Path

from tests.support.serve import ServeProcess


def test_a_timed_out_wait_names_the_stacks_of_the_node_and_its_workers(tmp_path: Path) -> None:
    with ServeProcess(tmp_path / "data", {"OURIOS_SERVER_WORKERS": "1"}) as node:
        stuck = node.stuck()
        assert node.proc is not None
        # the tail, then one dump a process: the core's threads and the worker's
        assert '"event":"server.listening"' in stuck, stuck
        assert f"== pid {node.proc.pid}" in stuck, stuck
        assert stuck.count("== pid ") == 2, stuck
        assert "ourios-turn" in stuck and "ourios-commit" in stuck, stuck
        assert "ourios-http" in stuck, stuck  # the worker's HTTP thread
    assert node.stacks() == "(no stacks: the process is not running)"
