"""The trainer's typed worker calls (``verl/single_controller/roles.py``, ``base.WorkerGroup``).

Guards against worker methods called by their name as a string (``execute_split("compute_log_prob", b)``: neither
an editor nor a reader could follow the call, and a misspelt or renamed method failed only inside a worker), a
proxy method that runs a worker method other than the one it is named after, or takes other arguments than it,
and a call meant for one role's workers sent to another's (refused before any rank runs it).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

from verl.protocol import Batch
from verl.single_controller import create_worker_group, roles
from verl.single_controller.base import Traffic

ROOT = Path(__file__).resolve().parents[3]
CALLS = ("execute_split", "execute_all", "execute_each", "execute_ranks")
# the proxy classes and the worker class whose ranks each drives
PROXIES = {roles.ActorGroup: roles.ActorRolloutWorker, roles.RefGroup: roles.RefWorker,
           roles.CriticGroup: roles.CriticWorker, roles.RolloutRanks: roles.RolloutWorker}


class Doubler:
    """A worker built like a real role (cfg, **kwargs)."""

    def __init__(self, cfg, **init_kwargs):
        pass

    def double(self, batch: Batch) -> Batch:
        return Batch({"y": batch["x"] * 2})


class Halver:
    def halve(self, batch: Batch) -> Batch:
        return Batch({"y": batch["x"] / 2})


def group_calls(function: ast.FunctionDef) -> list[ast.Call]:
    return [node for node in ast.walk(function) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr in CALLS]


def test_a_method_of_another_class_is_refused_before_any_rank_runs():
    group = create_worker_group(Doubler, None, "local", 1)
    batch = Batch({"x": torch.ones(4, 2)})
    with pytest.raises(TypeError, match="'Halver.halve' is not a method of Doubler"):
        group.execute_split(Halver.halve, batch)
    with pytest.raises(TypeError, match="'double' is not a method of Doubler"):
        group.execute_split("double", batch)  # a name is no method
    assert group.take_traffic() == Traffic()  # nothing was sent
    assert torch.equal(group.execute_split(Doubler.double, batch)["y"], 2 * batch["x"])


def test_each_proxy_method_runs_the_worker_method_of_its_name_with_its_arguments():
    """Read from the proxies' source: every public method makes one worker-group call whose method is the worker
    method of the same name, of its role's class (or a base); a call on every rank or on split rows passes the
    proxy's own parameters, so the two signatures match."""
    tree = ast.parse(inspect.getsource(roles))
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    assert set(classes) == {cls.__name__ for cls in PROXIES}, "a proxy class the test does not know"
    for proxy, worker_cls in PROXIES.items():
        methods = [f for f in classes[proxy.__name__].body
                   if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")]
        assert methods, proxy.__name__
        for function in methods:
            (call,) = group_calls(function)  # exactly one
            target = call.args[0]
            assert isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name), ast.unparse(call)
            owner = getattr(roles, target.value.id)
            assert issubclass(worker_cls, owner) and target.attr == function.name, \
                f"{proxy.__name__}.{function.name} runs {ast.unparse(target)}"
            worker_params = list(inspect.signature(getattr(worker_cls, function.name)).parameters)[1:]
            proxy_params = list(inspect.signature(getattr(proxy, function.name)).parameters)[1:]
            if call.func.attr in ("execute_split", "execute_all"):
                assert proxy_params == worker_params, f"{proxy.__name__}.{function.name}"


def test_no_worker_method_is_called_by_its_name_as_a_string():
    """Nowhere in the project is a worker-group call given a string; the trainer makes none itself (it calls the
    proxies)."""
    offenders = []
    for folder in ("verl", "search_r1", "data_prep", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in CALLS):
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                    offenders.append(f"{where} names {node.args[0].value!r}")
                elif path.is_relative_to(ROOT / "verl" / "trainer"):
                    offenders.append(f"{where} calls a worker group directly")
    assert not offenders, offenders
