"""The trajectory viewer, ``search-r1-inspect`` (docs/design.md, "Trajectory viewer"): what the agent did in a run
or an evaluation, as one self-contained HTML page or in the terminal, and two runs or steps compared on the same
questions. ``records`` reads the files, ``compare`` matches questions and bootstraps the EM difference, ``page``
and ``terminal`` show them, ``cli`` is the command; ``view(run_dir, out)`` writes a run's page from Python."""

from search_r1.inspect.cli import compare_paths, view

__all__ = ["compare_paths", "view"]
