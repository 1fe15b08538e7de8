"""Entry point of the bundled app (PyInstaller): the same `mixdesk` command."""
import multiprocessing
import sys

from app.entry import main

if __name__ == "__main__":
    multiprocessing.freeze_support()
    sys.exit(main())
