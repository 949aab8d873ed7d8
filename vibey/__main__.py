"""`python -m vibey` runs the vibey command."""

from vibey.cli import main

raise SystemExit(main())
