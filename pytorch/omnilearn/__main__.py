from omnilearn.cli import entry

entry()
