from tooling.ci_replay.replay import main

raise SystemExit(main())
