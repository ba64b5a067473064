from fedhop.cli import main

raise SystemExit(main())
