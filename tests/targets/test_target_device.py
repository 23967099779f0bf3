"""load_target's --device: a name torch does not parse, or a CUDA device this machine lacks, is one
line naming the device, before any model is loaded (not torch's assertion from inside `model.to`)."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target, resolve_device


@pytest.mark.parametrize(("device", "cuda_devices", "message"), [
    ("gpu", 1, "unknown device 'gpu': use auto, cpu, cuda or cuda:N"),
    ("cuda:x", 1, "unknown device 'cuda:x': use auto, cpu, cuda or cuda:N"),
    ("meta", 1, "unknown device 'meta': use auto, cpu, cuda or cuda:N"),
    ("cuda", 0, "device 'cuda': no CUDA device is visible"),
    ("cuda:1", 1, "device 'cuda:1': only 1 CUDA device(s) visible"),
])
def test_a_device_this_machine_lacks_is_one_line(random_llama, monkeypatch, device, cuda_devices, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_devices > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda_devices)
    with pytest.raises(LabError) as e:
        load_target(random_llama, device=device)
    assert str(e.value) == message


def test_devices_this_machine_has(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == resolve_device(torch.device("cpu")) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
