"""Surviving lost workers and lost hosts: elastic restarts under torchrun, and two real network hosts.

- Elastic restart: under ``torchrun --max-restarts=1 --nnodes=1:2``, one worker is SIGKILLed in
  the middle of epoch 2; torchrun restarts the group, the run continues by itself from the
  epoch-1 checkpoint (zoo finds it by the torchrun invocation it was stamped with) and ends with
  the weights of an uninterrupted run.
- Two hosts: two Linux network namespaces joined by a veth pair (10.77.0.1, 10.77.0.2), one
  torchrun node in each, CPU ranks over gloo across the link. Both nodes end with identical
  weights and only rank 0's node has a run directory. Cutting the link mid-training makes both
  sides fail within the configured timeout instead of hanging. Skipped where namespaces cannot
  be created (not root, no ``ip``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from zoo_core.engine.distributed import find_free_port

from .support import run_script, script_environment, torchrun_command, write_class_folders

pytestmark = pytest.mark.timeout(420)

SCRIPT = '''
import hashlib, json, os, sys
import torch
from zoo_core import LibreYOLO, register_plugin
from tests import doubles

register_plugin(doubles, "engine-test-families")
if __name__ == "__main__":
    mode, data, out = sys.argv[1], sys.argv[2], sys.argv[3]
    options = {}
    if mode == "elastic":  # rank 1 dies in the middle of epoch 2 (steps 4-6), on the first attempt only
        options = {"fail_rank": 1, "fail_step": 5, "fail_how": "kill", "fail_first_attempt_only": True}
    settings = dict(data=data, device="cpu", epochs=3, batch=8, imgsz=32, workers=0, nbs=8, verbose=False,
                    plots=False, optimizer="SGD", lr0=0.05, name=mode, ddp_timeout=float(os.environ.get("ZOO_TEST_TIMEOUT", 600)))
    if mode == "cut":
        settings.update(epochs=200)
    model = LibreYOLO("tinynet-s", options=options)
    result = model.train(**settings)
    model_weights = model.model.state_dict()  # every rank holds rank 0's best weights (sent when not on its disk)
    digest = hashlib.sha256(b"".join(tensor.numpy().tobytes() for tensor in model_weights.values())).hexdigest()
    with open(os.path.join(out, f"{mode}-rank{os.environ['RANK']}.json"), "w") as stream:
        json.dump({"digest": digest, "restarts": os.environ.get("TORCHELASTIC_RESTART_COUNT"), "run_dir": str(result.run_dir)}, stream)
'''


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(SCRIPT)
    write_class_folders(tmp_path / "data")
    (tmp_path / "out").mkdir()
    return tmp_path


def test_an_elastic_restart_resumes_by_itself_and_ends_like_an_uninterrupted_run(workspace):
    steady = run_script(workspace / "train.py", "steady", "data", "out", timeout=300,
                        launcher=torchrun_command("--nproc_per_node=2", f"--master_port={find_free_port()}"))
    assert steady.returncode == 0, steady.stdout + steady.stderr
    elastic = run_script(
        workspace / "train.py", "elastic", "data", "out", timeout=300,
        launcher=torchrun_command("--nnodes=1:2", "--nproc_per_node=2", "--max-restarts=1", "--rdzv-backend=c10d",
                                  f"--rdzv-endpoint=127.0.0.1:{find_free_port()}", "--rdzv-id=zoo-elastic-test",
                                  "--rdzv-conf=last_call_timeout=1"),
    )
    assert elastic.returncode == 0, elastic.stdout + elastic.stderr
    reports = [json.loads((workspace / "out" / f"elastic-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [report["restarts"] for report in reports] == ["1", "1"]  # the group was restarted once...
    assert {report["run_dir"] for report in reports} == {"runs/classify/elastic"}  # ...and continued its own run
    expected = torch.load(workspace / "runs/classify/steady/weights/last.pt", weights_only=True)["train_model"]
    actual = torch.load(workspace / "runs/classify/elastic/weights/last.pt", weights_only=True)
    assert actual["epoch"] == 2
    for key, value in expected.items():
        assert torch.allclose(value.float(), actual["train_model"][key].float(), atol=1e-6), key


# --------------------------------------------------------------------------- two hosts
class Namespaces:
    """Two network namespaces joined by a veth pair: host A 10.77.0.1, host B 10.77.0.2."""

    def __init__(self) -> None:
        suffix = f"{os.getpid() % 100000}"
        self.names = (f"zoo-a{suffix}", f"zoo-b{suffix}")
        self.links = (f"zva{suffix}", f"zvb{suffix}")
        self.addresses = ("10.77.0.1", "10.77.0.2")

    def __enter__(self) -> "Namespaces":
        ip = ["ip"]
        commands = [
            [*ip, "netns", "add", self.names[0]], [*ip, "netns", "add", self.names[1]],
            [*ip, "link", "add", self.links[0], "type", "veth", "peer", "name", self.links[1]],
        ]
        for index in (0, 1):
            namespace, link, address = self.names[index], self.links[index], self.addresses[index]
            commands += [
                [*ip, "link", "set", link, "netns", namespace],
                [*ip, "-n", namespace, "addr", "add", f"{address}/24", "dev", link],
                [*ip, "-n", namespace, "link", "set", link, "up"],
                [*ip, "-n", namespace, "link", "set", "lo", "up"],
            ]
        try:
            for command in commands:
                subprocess.run(command, check=True, capture_output=True, text=True, timeout=30)
        except Exception:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for namespace in self.names:  # deleting a namespace deletes its end of the veth pair, and the pair
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)

    def command(self, host: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.names[host], *argv]

    def cut(self) -> None:
        subprocess.run(["ip", "-n", self.names[0], "link", "set", self.links[0], "down"], check=True, timeout=30)


def namespaces_or_skip() -> Namespaces:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("two network namespaces need root and iproute2's `ip`")
    probe = subprocess.run(["ip", "netns", "add", f"zoo-probe{os.getpid()}"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"this machine refuses network namespaces: {probe.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", f"zoo-probe{os.getpid()}"], capture_output=True)
    return Namespaces()


def start_nodes(network: Namespaces, workspace: Path, mode: str, extra_env: dict[str, str]) -> list[subprocess.Popen]:
    port = 29000 + os.getpid() % 1000
    processes = []
    for node in (0, 1):
        folder = workspace / f"node{node}"
        folder.mkdir(exist_ok=True)
        (folder / "out").mkdir(exist_ok=True)
        env = {**script_environment(), "GLOO_SOCKET_IFNAME": network.links[node], **extra_env}
        argv = [*torchrun_command("--nnodes=2", f"--node_rank={node}", "--nproc_per_node=1",
                                  f"--master_addr={network.addresses[0]}", f"--master_port={port}"),
                str(workspace / "train.py"), mode, str(workspace / "data"), "out"]
        processes.append(subprocess.Popen(network.command(node, argv), cwd=folder, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True, start_new_session=True))
    return processes


def finish(processes: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    results = []
    deadline = time.monotonic() + timeout
    try:
        for process in processes:
            output = process.communicate(timeout=max(deadline - time.monotonic(), 1))[0]
            results.append((process.returncode, output))
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, 9)
                process.wait()
    return results


def test_two_hosts_on_a_real_link_train_together_and_agree(workspace):
    with namespaces_or_skip() as network:
        results = finish(start_nodes(network, workspace, "hosts", {}), timeout=300)
    assert [code for code, _ in results] == [0, 0], "\n\n".join(output for _, output in results)
    reports = [json.loads((workspace / f"node{node}" / "out" / f"hosts-rank{node}.json").read_text()) for node in (0, 1)]
    assert reports[0]["digest"] == reports[1]["digest"]
    assert (workspace / "node0" / "runs" / "classify" / "hosts" / "weights" / "last.pt").is_file()
    assert not (workspace / "node1" / "runs").exists(), "a rank other than 0 wrote a run directory"


def test_a_cut_link_ends_both_hosts_with_an_error_within_the_timeout(workspace):
    timeout = 20
    with namespaces_or_skip() as network:
        processes = start_nodes(network, workspace, "cut", {"ZOO_TEST_TIMEOUT": str(timeout)})
        deadline = time.monotonic() + 200
        first_epoch = workspace / "node0" / "runs" / "classify" / "cut" / "weights" / "last.pt"
        while not first_epoch.exists():  # both hosts are training together
            assert time.monotonic() < deadline and all(process.poll() is None for process in processes), "training never started"
            time.sleep(0.2)
        cut_at = time.monotonic()
        network.cut()
        results = finish(processes, timeout=timeout * 6)
    elapsed = time.monotonic() - cut_at
    assert all(code != 0 for code, _ in results), "\n\n".join(output for _, output in results)
    assert elapsed < timeout * 6, f"the hosts took {elapsed:.0f} s to notice a dead link (timeout {timeout} s)"
