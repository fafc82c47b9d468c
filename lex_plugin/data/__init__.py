"""Text and data-bins: :mod:`.text` (how ``lex prepare`` reads text: what inference needs) and :mod:`.prepare`
(``lex prepare``: the data-bin writing pipeline, imported only by what writes data-bins)."""
