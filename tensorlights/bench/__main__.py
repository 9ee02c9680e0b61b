from tensorlights.bench.cli import main

raise SystemExit(main())
