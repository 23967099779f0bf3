"""Where a decode's time goes: its wall time split into named phases (prefill, draft, verify, ...).

The split must not change what it measures, so it never waits on the device: on CPU it reads the
host clock at each phase boundary; on CUDA it records an event there and reads them all once the
decode is over. An event interval is device-timeline time, idle gaps included, so each phase is
charged until its last kernel finishes, and host work the device waits on (an accept walk on the
host) is charged to the phase it happens in. Either way the phases add up to the decode's wall time.
"""

from __future__ import annotations

import time

import torch


class PhaseClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.start = self._now()
        self.marks: list[tuple[str, object]] = []

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))  # the decode's device, not the current one
        return event

    def mark(self, phase: str) -> None:
        """The time since the previous mark (or the start) was spent in `phase`."""
        self.marks.append((phase, self._now()))

    def elapsed(self) -> list[float]:
        """Seconds from the start to each mark, in order."""
        if not self.marks:
            return []
        if self.cuda:
            self.marks[-1][1].synchronize()
        return [self.start.elapsed_time(t) / 1e3 if self.cuda else t - self.start for _, t in self.marks]

    def seconds(self) -> dict[str, float]:
        """Total seconds per phase, in the order the phases first ran."""
        out: dict[str, float] = {}
        prev = 0.0
        for (phase, _), t in zip(self.marks, self.elapsed()):
            out[phase] = out.get(phase, 0.0) + t - prev
            prev = t
        return out


def add(total: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    """Phase seconds of two decodes together."""
    return {k: total.get(k, 0.0) + more.get(k, 0.0) for k in {**total, **more}}


def per_pass_ms(result: dict, side: str) -> dict[str, float]:
    """An eval result's split for one decode ("spec" or "baseline") in ms per target pass (its
    prefill spread over them)."""
    passes = result["verify_passes" if side == "spec" else "decode_passes"]
    return {k: 1e3 * s / max(passes, 1) for k, s in result["phase_seconds"][side].items()}
