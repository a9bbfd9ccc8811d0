"""`python -m warren_forkd`: the same as the `warren-forkd` command."""

from warren_forkd.cli import main

raise SystemExit(main())
