import sys

from omnilearn.cli import main

sys.exit(main())
