"""``python -m streamio.testing s3|gcs [--bucket NAME] [--port N] [--env-file PATH]``: a local server
for your own experiments (see :mod:`streamio.testing.serve`)."""

import sys

from streamio.testing.serve import main

if __name__ == "__main__":
    sys.exit(main())
