import sys

from gs1.cli import main

sys.exit(main())
