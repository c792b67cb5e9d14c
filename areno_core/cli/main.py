"""The ``areno`` command."""

from __future__ import annotations

import logging
import os
import sys

# torch's OpenMP threads spin while they wait for work. When the cores are shared (a laptop,
# a CI box, a rollout server beside the trainer) the spinning threads steal the CPU the
# working ones need and small models train many times slower. Passive waiting costs little
# on an idle machine; users can still set OMP_WAIT_POLICY themselves. It must be set before
# torch is first imported, which the CLI does lazily.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# transformers' and the hub's per-file progress bars would interleave with areno's own. The
# variable (read when transformers is first imported) keeps them off without importing it here,
# so that a command's options are checked before torch and transformers are loaded; processes
# the run starts (the rollout worker) inherit it.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import click
from rich.console import Console
from rich.markup import escape

from areno_core import __version__
from areno_core.cli.eval_cmd import eval_command
from areno_core.cli.plan import plan
from areno_core.cli.plugins_cmd import plugins
from areno_core.cli.serve_cmd import serve
from areno_core.cli.train import train
from areno_core.errors import ArenoError
from areno_core.models.kernel_caches import bound_kernel_caches

# bfloat16 products on a CPU keep a kernel per shape in two caches of 1,024 entries, which
# fill with kernels areno's varying shapes never reuse (areno_core.models.kernel_caches). The
# capacities are read when torch builds its first such kernel, long after this; the rollout
# worker inherits them.
bound_kernel_caches()

err_console = Console(stderr=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="areno")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """areno: post-train language models with SFT, DPO, GRPO, GSPO, RLOO, PPO and agents."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    from rich.logging import RichHandler  # only when logging is set up

    logging.basicConfig(
        level=level,
        format="%(message)s",
        handlers=[RichHandler(console=err_console, show_path=False)],
        force=True,
    )
    # Library loggers live under "areno"; keep third-party noise at WARNING. A worker of a
    # distributed run other than rank 0 reports errors only: rank 0 speaks for the run.
    worker = os.environ.get("RANK", "0") != "0" and "LOCAL_RANK" in os.environ
    logging.getLogger("areno").setLevel(logging.ERROR if worker else min(level, logging.INFO))


def _register_commands() -> None:
    cli.add_command(train)
    cli.add_command(eval_command)
    cli.add_command(serve)
    cli.add_command(plugins)
    cli.add_command(plan)


_register_commands()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: user errors print one clear line, no traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cli.main(args=args, prog_name="areno", standalone_mode=False, obj={"argv": args})
    except click.exceptions.Abort:
        err_console.print("Aborted.")
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except ArenoError as exc:
        # escape: a message may hold brackets, e.g. pip install 'areno-core[lora]'
        err_console.print(
            f"[bold red]Error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True
        )
        _report_to_launcher(exc)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("Interrupted.")
        sys.exit(130)
    except Exception as exc:
        # A worker's traceback first: the launcher may stop this process at any moment now.
        logged = _log_worker_traceback(exc)
        _report_to_launcher(exc)
        if logged:
            sys.exit(1)  # the launcher prints the run's one error line, naming the log
        raise


def _log_worker_traceback(exc: BaseException) -> bool:
    """A worker started by ``areno train --world-size N`` keeps its traceback in the run's log
    directory rather than printing it; True when it did."""
    if "LOCAL_RANK" not in os.environ:
        return False
    # torch.distributed's launcher: only in a worker process that failed
    from areno_core.train.distributed import log_worker_traceback

    return log_worker_traceback(exc) is not None


def _report_to_launcher(exc: BaseException) -> None:
    """A worker of a distributed run leaves its error where torch's launcher reports it."""
    if "TORCHELASTIC_ERROR_FILE" in os.environ:
        # torch.distributed's launcher: only in a worker process that failed
        from areno_core.train.distributed import record_worker_error

        record_worker_error(exc)


if __name__ == "__main__":
    main()
