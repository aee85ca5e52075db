import sys

from edgerunner.cli import main

sys.exit(main())
