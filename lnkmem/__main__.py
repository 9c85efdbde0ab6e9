from lnkmem.cli import main

raise SystemExit(main())
