"""Engine behaviours that need a user's script as the parent process: E3, E20, E21, concurrent E15.

Each test writes a small script, runs it with the test environment's Python and inspects what
happened to it and to every process it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .support import alive, children_of, run_concurrently, run_script, script_environment, write_class_folders

pytestmark = pytest.mark.timeout(240)

PREAMBLE = """
import os, sys
from zoo_core import LibreYOLO, register_plugin
from zoo_core.engine.callbacks import Callback
from tests import doubles
register_plugin(doubles, "engine-test-families")
SETTINGS = dict(data="data", epochs=1, batch=8, imgsz=32, workers=0, nbs=8, verbose=False, plots=False)
"""


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    write_class_folders(tmp_path / "data")
    return tmp_path


def test_e3_a_script_without_the_main_guard_gets_the_fix_and_no_process_explosion(workspace):
    script = workspace / "unguarded.py"
    script.write_text(PREAMBLE + """
with open("started.txt", "a") as log:
    log.write(f"{os.getpid()}\\n")
LibreYOLO("tinynet-s").train(device="cpu,cpu", **SETTINGS)
""")
    result = run_script(script)
    assert result.returncode != 0
    assert "SpawnGuardError" in result.stderr
    assert 'if __name__ == "__main__":' in result.stderr and "without a" in result.stderr
    assert "exit code 1" not in result.stderr
    started = (workspace / "started.txt").read_text().split()
    assert len(started) <= 3  # the script itself and at most one import per worker, never more


def test_e20_a_callback_class_defined_under_the_guard_gets_the_pickling_error(workspace):
    script = workspace / "guarded_class.py"
    script.write_text(PREAMBLE + """
if __name__ == "__main__":
    class LocalLogger(Callback):
        def on_epoch_end(self, report):
            pass

    LibreYOLO("tinynet-s").train(device="cpu,cpu", callbacks=[LocalLogger()], **SETTINGS)
""")
    result = run_script(script)
    assert result.returncode != 0
    assert "UnpicklableArgumentError" in result.stderr
    assert "callbacks[0] could not be re-created in a training worker" in result.stderr
    assert "LocalLogger" in result.stderr and "SpawnGuardError" not in result.stderr
    assert "exit code 1" not in result.stderr
    assert not (workspace / "runs").exists()  # refused before training started


def test_e21_killing_the_calling_process_ends_its_workers(workspace):
    script = workspace / "long.py"
    script.write_text(PREAMBLE + """
class Started(Callback):
    def on_train_start(self, run_dir, config):
        open("training-started", "w").close()

if __name__ == "__main__":
    LibreYOLO("tinynet-s").train(device="cpu,cpu", callbacks=[Started()], **{**SETTINGS, "epochs": 10_000})
""")
    parent = subprocess.Popen([sys.executable, str(script)], cwd=workspace, env=script_environment(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not (workspace / "training-started").exists():
            assert parent.poll() is None, "the training script ended before it started training"
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        workers = children_of(parent.pid)
        assert len(workers) >= 2
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 15
        while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in workers if alive(pid)], "workers survived their parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_e15_two_trainings_started_at_once_both_finish(workspace):
    script = workspace / "together.py"
    script.write_text(PREAMBLE + """
if __name__ == "__main__":
    result = LibreYOLO("tinynet-s").train(device="cpu,cpu", name=sys.argv[1], **SETTINGS)
    print("finished", result.run_dir)
""")
    runs = run_concurrently([[sys.executable, str(script), name] for name in ("first", "second")], workspace,
                            script_environment(), timeout=200)
    outputs = [output for _, output in runs]
    assert [code for code, _ in runs] == [0, 0], "\n".join(outputs)
    assert "finished runs/classify/first" in outputs[0] and "finished runs/classify/second" in outputs[1]
