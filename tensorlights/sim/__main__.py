from tensorlights.sim.cli import main

raise SystemExit(main())
