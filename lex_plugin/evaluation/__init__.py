"""Length-stratified evaluation (used by the lex_language_modeling task)."""
