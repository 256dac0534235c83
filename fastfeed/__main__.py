import sys

from .cli import main

if __name__ == "__main__":  # spawned worker processes re-import the main module
    sys.exit(main())
