from mia_ray.cli import main

raise SystemExit(main())
