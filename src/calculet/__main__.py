from calculet.cli import main

raise SystemExit(main())
