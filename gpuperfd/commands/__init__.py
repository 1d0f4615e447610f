"""The commands, one module each, named for the command: argument parsing, options building and output only.

:mod:`gpuperfd.cli` registers them (each module's ``register(subparsers)``) and imports only the one a
command line names. The library packages never import this package (tests/test_architecture.py): a
command calls down into them, nothing calls up into a command.
"""
