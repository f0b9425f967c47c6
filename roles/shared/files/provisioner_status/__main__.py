"""python3 -m provisioner_status, or the zipapp role shared ships: see provisioner_status.cli."""

import sys

from provisioner_status.cli import main

sys.exit(main())
