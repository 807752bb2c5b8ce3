"""``python -m tformer_lib`` 的入口，见 :mod:`tformer_lib.cli`。"""

import sys

from .cli import main

sys.exit(main())
