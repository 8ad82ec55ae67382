"""The trainer's YAML configs. Installed from a wheel they are the package data ``verl.configs`` (see setup.py);
in a checkout they are read from this directory."""
