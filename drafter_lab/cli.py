"""`drafter-lab` entry point: parses arguments and calls library functions, nothing more.

Each area registers its own subcommands (`<area>/commands.py: register(subparsers)`), so the
parsers live next to the code they drive.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from drafter_lab import __version__
from drafter_lab.errors import LabError

AREAS = (
    "drafter_lab.targets.commands",
    "drafter_lab.data.commands",
    "drafter_lab.train.commands",
    "drafter_lab.drafter.commands",
    "drafter_lab.spec.commands",
    "drafter_lab.experiments.commands",
    "drafter_lab.kernels.commands",
)


# Destinations of the options and arguments that name a file or directory. An empty one would be
# Path("") (the current directory: `train --out ''` wrote there) or read as not given (an empty
# --run-dir started a new run), so argparse refuses it, naming the option.
PATH_DESTS = frozenset({
    "a", "b", "baseline", "cache", "cache_dir", "config", "conversations", "data", "draft_config", "drafter",
    "hidden_states", "init_from", "inputs", "json", "markdown", "out", "pilot_config", "pilot_dir", "plot",
    "prompts", "run", "run_dir", "runs", "source_target", "stop_if_behind", "target", "tokenizer", "val_data", "vocab",
})


def nonempty_path(text: str) -> str:
    """argparse type of every PATH_DESTS option that has none of its own."""
    if not text:
        raise argparse.ArgumentTypeError("empty: name a file or directory")
    return text


def _refuse_empty_paths(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _refuse_empty_paths(sub)
        elif action.dest in PATH_DESTS and action.type is None and action.nargs != 0:
            action.type = nonempty_path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drafter-lab", description="Train, transfer, probe and measure EAGLE-3 drafters."
    )
    parser.add_argument("--version", action="version", version=f"drafter-lab {__version__}")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="let model directories run their own code (config.json's auto_map: Kimi K2's model and "
                             "tokenizer), as SGLang's and vLLM's flag of that name")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in AREAS:
        importlib.import_module(name).register(sub)
    _refuse_empty_paths(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    code = _run(argv)
    joined = sys.modules.get("drafter_lab.train.distributed")  # imported by the commands that can join a group
    if joined is not None:
        joined.end_process(code)
    return code


def _pipe_closed(console) -> None:
    """rich's Console answers a closed stdout with exit status 1 (`reproduce`'s "metrics differ"); raised
    instead, it ends the command as a print's BrokenPipeError does."""
    raise BrokenPipeError


def _run(argv: list[str] | None) -> int:
    from rich.console import Console

    Console.on_broken_pipe = _pipe_closed  # `drafter-lab watch ... | head -1`
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.trust_remote_code:
        from drafter_lab.targets.hf import REMOTE_CODE_ENV

        os.environ[REMOTE_CODE_ENV] = "1"  # where every loader, and the processes the lab starts, read it
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, not at exit: a closed pipe is answered below
        return code
    except LabError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `drafter-lab costmodel | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's own flush fails quietly
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    raise SystemExit(main())
