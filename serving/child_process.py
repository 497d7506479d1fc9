"""What every child process of a server with front ends sets up first (serving/frontends.py starts them): logging as
the parent's, a name in ps and top, and a signal when the parent dies."""

from __future__ import annotations

import ctypes
import logging
import signal
import sys

LOG_FORMAT = "%(asctime)s %(processName)s %(name)s: %(message)s"


def child_process_setup(log_levels: dict[str, int], short_name: str,
                        parent_death: signal.Signals | None = None) -> None:
    """Logging as the parent's (levels of the root and ``bertzoo`` loggers, the process's name on each line); on
    Linux, ``short_name`` as the process's name in ps and top, and ``parent_death`` sent to this process when the
    parent dies."""
    logging.basicConfig(format=LOG_FORMAT, datefmt="%H:%M:%S", stream=sys.stderr)
    for name, level in log_levels.items():
        logging.getLogger(name or None).setLevel(level)
    if sys.platform == "linux":
        PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(short_name.encode()[:15]))
        if parent_death is not None:
            libc.prctl(PR_SET_PDEATHSIG, int(parent_death))
