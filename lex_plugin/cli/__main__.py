"""``python -m lex_plugin.cli``: the ``lex`` command."""

from . import main

main()
