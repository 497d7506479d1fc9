"""What `bertzoo train` prints at its end: where the run is, and the next commands, written so that they run as
printed in the shell the user is in (the README's set-up installs into ``.venv`` without activating it, where a bare
``bertzoo`` is "command not found")."""

from __future__ import annotations

import os
import shlex
import shutil
import sysconfig
from pathlib import Path

import click

# One input per task for the predict hint, in `bertzoo predict`'s argument order.
PREDICT_EXAMPLES = {
    "sentiment": '"a gorgeous, witty film"',
    "paraphrase": '"How do I learn to cook?" "What is the best way to learn cooking?"',
    "similarity": '"A man is playing a guitar." "A man plays the guitar."',
    "qa": '"Who wrote Hamlet?" "Hamlet is a tragedy written by William Shakespeare around 1600."',
}

# The variant the suggested export adds and the suggested serve names: serve's default is fp32, so an int8 export
# served without --variant would quietly serve the fp32 graph.
SUGGESTED_VARIANT = "int8"


def bertzoo_command(cwd: Path | None = None, path: str | None = None) -> str:
    """How to call this installation's ``bertzoo`` from ``cwd`` with ``path`` as PATH (default: the process's):
    ``bertzoo`` when that name finds this installation's script (an activated venv, or its bin folder on PATH), else
    the script's path: relative to ``cwd`` when it lies below it (``.venv/bin/bertzoo``), absolute otherwise."""
    script = Path(sysconfig.get_path("scripts")) / "bertzoo"
    if not script.is_file():
        return "bertzoo"  # not installed as a script here (e.g. a user-scheme install): nothing better to say
    found = shutil.which("bertzoo", path=os.environ.get("PATH", os.defpath) if path is None else path)
    if found is not None and Path(found).resolve() == script.resolve():
        return "bertzoo"
    cwd = Path.cwd() if cwd is None else cwd
    relative = os.path.relpath(script, cwd)
    # A relative path always has a slash here (.venv/bin/bertzoo), so the shell runs it instead of searching PATH.
    return shlex.quote(str(script) if relative.startswith("..") else relative)


def print_next_steps(run: str, task: str) -> None:
    """Where the run is, which checkpoint its users get, and the commands that use it (predict on a trained task;
    export and serve of the same variant)."""
    from bertzoo.trainer.checkpoint import resolve_checkpoint_pointer

    try:
        checkpoint, pointer = resolve_checkpoint_pointer(run)
    except FileNotFoundError:
        return  # nothing was saved (e.g. interrupted before the first checkpoint)
    artifact = shlex.quote(f"artifacts/{Path(run).name}")
    bertzoo, run_arg = bertzoo_command(), shlex.quote(run)
    click.echo(f"\nrun directory: {run}\ncheckpoint for predict, eval and export: {checkpoint} ({pointer or 'given'})"
               f"\nnext:\n  {bertzoo} predict {run_arg} --task {task} {PREDICT_EXAMPLES[task]}\n"
               f"  {bertzoo} export {run_arg} --out {artifact} --{SUGGESTED_VARIANT}\n"
               f"  {bertzoo} serve {artifact} --variant {SUGGESTED_VARIANT}")
