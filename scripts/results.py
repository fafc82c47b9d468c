#!/usr/bin/env python
"""Write every generated table of the documents, and the published plots, from the committed reports
(lex_plugin.experiments.published), or check that the tables hold what the reports give.

    python scripts/results.py            # rewrite the tables between their markers, draw the plots
    python scripts/results.py --check    # change nothing; exit 1 naming each table that differs
"""

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lex_plugin.experiments.published import BLOCKS, draw_plots, generate  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--check", is_flag=True, help="write nothing; exit 1 if a document's table differs from its reports")
def main(check):
    """Regenerate (or --check) the documents' tables, and draw the plots, from the committed reports."""
    try:
        changed = generate(REPO, check=check)
        drawn = [] if check else draw_plots(REPO)
    except (ValueError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from None
    for item in changed:
        click.echo(f"{'differs' if check else 'rewrote'}: {item}")
    if check and changed:
        raise click.ClickException(f"{len(changed)} of {len(BLOCKS)} tables differ from their reports: "
                                   "run python scripts/results.py and commit the documents.")
    for path in drawn:
        click.echo(f"drew: {path.relative_to(REPO)}")
    click.echo(f"{len(BLOCKS)} tables {'checked' if check else 'written'}; {len(changed)} changed.")


if __name__ == "__main__":
    main()
