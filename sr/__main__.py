from sr.cli import main

raise SystemExit(main())
