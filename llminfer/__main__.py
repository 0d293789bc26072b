import sys

from llminfer.cli import main

sys.exit(main())
