from corehandler.cli import main

raise SystemExit(main())
