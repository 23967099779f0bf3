from drafter_lab.cli import main

raise SystemExit(main())
