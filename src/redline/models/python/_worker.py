"""The entry point of a worker process (``python -m redline.models.python._worker``).

A module of its own: the package does not import it, so running it as ``__main__`` never
finds it already imported.
"""

import sys

from redline.models.python.worker_process import main

if __name__ == "__main__":
    main(sys.argv[1:])
