"""Examples of what plugs into the trainer from outside ``verl/``: a task in one file (``calculator.py``, run with
``recipe=examples.calculator``) and an advantage estimator (``my_estimator.py``, run with
``plugins=[examples.my_estimator]``). They import ``verl`` only (``tests/test_import_rules.py``)."""
