"""``python -m tformer_lib`` 的入口，见 :mod:`tformer_lib.commands`。"""

import sys

from .commands import main

sys.exit(main())
