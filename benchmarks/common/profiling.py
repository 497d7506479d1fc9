"""A sampling profile of another process, taken with py-spy where it is installed: which functions hold its threads'
busy samples, so that a figure measured on a machine we hold for minutes (the GPU host) comes with where the time
went, without a second run. py-spy reads the process from outside (``--nonblocking``: it never stops it), costing the
sampled process nothing and a fraction of another core.

With ``gil=True`` only the samples of the thread holding the GIL count, so each role's share of all sampling instants
is the share of the time it held the GIL: an event loop and a model's worker thread that together hold it nearly all
the time are bound by the GIL, not by their cores (every socket call and every torch op lets it go and takes it back).

    profile = start_profile(pid, seconds, Path("engine.txt"))
    ...  # the measured load
    summary = finish_profile(profile, pid)   # None without py-spy; {"error": ...} when it could not sample
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

RATE_HZ = 250
# One frame of py-spy's raw (collapsed) output: "function (file:line)".
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>.*?)(?::\d+)?\)$")


@dataclass
class Profile:
    process: subprocess.Popen
    output: Path
    seconds: float
    gil: bool


def py_spy() -> str | None:
    """py-spy on PATH, or beside this Python (a virtual environment's bin/, not activated); None where neither."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def start_profile(pid: int, seconds: float, output: Path, gil: bool = False) -> Profile | None:
    """py-spy sampling ``pid`` (every thread, idle time left out; ``gil``: only the thread holding the GIL) for
    ``seconds`` into ``output`` (collapsed stacks, one per line, each rooted at its thread's id); None where py-spy is
    not installed."""
    executable = py_spy()
    if executable is None:
        return None
    duration = max(1, round(seconds))
    command = [executable, "record", "--pid", str(pid), "--duration", str(duration), "--rate", str(RATE_HZ),
               "--format", "raw", "--output", str(output), "--nonblocking", "--threads", *(["--gil"] if gil else [])]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return Profile(process, output, duration, gil)


def finish_profile(profile: Profile | None, main_thread: int, top: int = 12) -> dict | None:
    """Wait for the sampling to end and summarize it (:func:`summarize`); py-spy's last line where it failed (no
    permission to read the process, for one)."""
    if profile is None:
        return None
    try:
        _, errors = profile.process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        profile.process.kill()
        return {"error": "py-spy did not finish within 60 s"}
    if profile.process.returncode != 0 or not profile.output.exists():
        lines = [line for line in errors.splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"py-spy exited {profile.process.returncode}"}
    summary = summarize(profile.output.read_text(), main_thread, top)
    if profile.gil:  # one sample per instant at most (the GIL's holder): samples over instants = time held
        instants = profile.seconds * RATE_HZ
        for part in summary.values():
            part["gil_held_share"] = round(part["samples"] / instants, 3)
    return {"file": profile.output.name, "gil": profile.gil, **summary}


def frame_name(frame: str) -> str:
    """``function (file:line)`` -> ``function (file)``, the file shortened to its last two parts: one name however
    many lines of the function were sampled."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    return f"{match['function']} ({'/'.join(Path(match['file']).parts[-2:])})"


def summarize(collapsed: str, main_thread: int, top: int = 12) -> dict:
    """Per thread role ("main": ``main_thread``, e.g. an event loop; "other": every other thread), its busy samples and
    the ``top`` functions by samples spent in them ("self") and under them ("inclusive"), as shares of that role's
    samples."""
    roles: dict[str, dict[str, Counter]] = {}
    samples: Counter = Counter()
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        thread, *frames = stack.split(";")
        tid = re.search(r"\d+", thread)
        role = "main" if tid is not None and int(tid.group()) == main_thread else "other"
        count = int(count_text)
        samples[role] += count
        counters = roles.setdefault(role, {"self": Counter(), "inclusive": Counter()})
        names = [frame_name(frame) for frame in frames]
        if names:
            counters["self"][names[-1]] += count
        for name in set(names):
            counters["inclusive"][name] += count
    return {role: {"samples": samples[role],
                   **{kind: [[name, round(n / samples[role], 4)] for name, n in counter.most_common(top)]
                      for kind, counter in counters.items()}}
            for role, counters in sorted(roles.items())}


def profile_lines(summary: dict | None, top: int = 6) -> list[str]:
    """A summary as a few printable lines: per role, its busiest functions by self time."""
    if not summary:
        return []
    if "error" in summary:
        return [f"profile: not taken ({summary['error']})"]
    kind = "holding the GIL" if summary.get("gil") else "busy"
    return [f"profile ({kind}), {role} thread(s), {part['samples']} samples"
            + (f", GIL held {part['gil_held_share']:.0%} of the time" if "gil_held_share" in part else "")
            + ", self: " + "; ".join(f"{name} {share:.0%}" for name, share in part["self"][:top])
            for role, part in summary.items() if isinstance(part, dict)]
