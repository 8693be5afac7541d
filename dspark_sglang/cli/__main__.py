"""``python -m dspark_sglang.cli``: the ``dspark-sglang`` command."""

import sys

from dspark_sglang.cli import main

sys.exit(main())
