"""``python -m spark_sb``: the admin command line, :mod:`spark_sb.admin.cli` (driver / any process)."""

import sys

from spark_sb.admin.cli import main

if __name__ == "__main__":
    sys.exit(main())
