"""`python -m vibey` runs the vibey command."""

from vibey.launch import main

raise SystemExit(main())
