"""An entry point's command run in the test process: ``in_process("search_r1.infer", *args)`` is ``python -m
search_r1.infer args`` minus the new interpreter; ``main_ppo_in_process(*args)`` the trainer's.

For the trainer's launches whose process is not what the test is about: refusals (exit status 2 and a message), a
short run that must finish or stop with a given status, the rerun of a finished run, a validation. A subprocess
spends ~6 s of CPU importing torch, transformers and the trainer before it reads its first argument, more than
such a run costs, while this process has them imported already. What the command does is the same: ``main(argv)``
is the whole of ``python -m MODULE`` (``sys.exit(main())``), its exit status is ``main``'s return value (or the
code of the ``SystemExit`` argparse raises), and what it prints to stdout and stderr, and logs, is returned as
the subprocess's would be (an exception escaping ``main``, which would be a traceback and exit status 1, fails
the test). The process-wide settings ``main`` makes for a run (logging levels and environment defaults, torch's
seed and thread count) are put back afterwards; the trainer's workers run here on the local backend, as the
in-process trainer tests' do (one torch.distributed group of this process alone), or with ``ray_address`` on the
test run's Ray instance, this process the driver. Launches that must be a real
process stay subprocesses: a run resumed after a kill or compared with an uninterrupted one (a fresh process is
the point), runs that are killed or read while they run, a Ray address that never answers (its
join thread is abandoned, not stopped), runs whose environment must differ at interpreter start (thread counts,
a shadowed package), entry points that install their own log handlers (the retrieval service and index builder),
the command lines themselves (launchers, --help, console scripts), and one refusal per entry point that checks
the exit status of the process itself.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import subprocess

import torch


@contextlib.contextmanager
def _process_settings_restored():
    env = dict(os.environ)
    levels = {name: logging.getLogger(name).level for name in logging.root.manager.loggerDict}
    root_level, root_handlers = logging.getLogger().level, list(logging.getLogger().handlers)
    import transformers

    verbosity = transformers.logging.get_verbosity()
    progress = transformers.utils.logging.is_progress_bar_enabled()
    rng, threads = torch.get_rng_state(), torch.get_num_threads()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(env)
        for name in logging.root.manager.loggerDict:
            if name in levels:
                logging.getLogger(name).setLevel(levels[name])
        logging.getLogger().setLevel(root_level)
        for added in [h for h in logging.getLogger().handlers if h not in root_handlers]:  # logging.basicConfig's
            logging.getLogger().removeHandler(added)
        transformers.logging.set_verbosity(verbosity)
        (transformers.logging.enable_progress_bar if progress else transformers.logging.disable_progress_bar)()
        torch.set_rng_state(rng)
        torch.set_num_threads(threads)


def in_process(module: str, *args: object, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """``MODULE.main(args)`` here -> a CompletedProcess (args, returncode, stdout, stderr) as
    ``subprocess.run([python, "-m", MODULE, *args], capture_output=True, text=True)`` gives. ``env``: variables
    set (None: removed) for the call, as a subprocess's environment would have them."""
    main = importlib.import_module(module).main
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)  # what the command's console shows of the logs goes to its stderr
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    with _process_settings_restored(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        for key, value in (env or {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        root.addHandler(handler)
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's usage errors and --help
            code = exit_.code if isinstance(exit_.code, int) else 1 if exit_.code else 0
        finally:
            root.removeHandler(handler)
    return subprocess.CompletedProcess(["python", "-m", module, *argv], code, out.getvalue(), err.getvalue())


def main_ppo_in_process(*args: object, env: dict[str, str | None] | None = None,
                        ray_address: str | None = None) -> subprocess.CompletedProcess:
    """``python -m verl.trainer.main_ppo args``, in this process. ``ray_address``: a trainer.backend=ray run's
    driver is this process, joined to that Ray instance (``RAY_ADDRESS``) and disconnected afterwards unless it was
    connected before; the run's worker processes end with it (``PPOTrainer.shutdown``)."""
    if ray_address is None:
        return in_process("verl.trainer.main_ppo", *args, env=env)
    import ray

    connected = ray.is_initialized()
    try:
        return in_process("verl.trainer.main_ppo", *args, env={**(env or {}), "RAY_ADDRESS": ray_address})
    finally:
        if not connected and ray.is_initialized():
            ray.shutdown()
