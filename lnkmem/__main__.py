from lnkmem.cli.main import main

raise SystemExit(main())
