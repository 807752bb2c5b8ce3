"""命令行（command line）：``python -m tformer_lib <命令>``，也就是安装后的 ``tformer`` 命令。

- :mod:`.cli`：入口 :func:`main` 与翻译模型（第一、二部分）的 ``train`` / ``translate`` / ``evaluate``；
- :mod:`.lm`：语言模型的 ``lm-train`` / ``lm-generate``（第 9 章起）；
- :mod:`.serve`：推理服务 ``serve``（第 13 章）；
- :mod:`.finetune`：微调 ``lm-finetune``（第 17 章）；
- :mod:`.base`：几个命令共用的错误类型 :class:`~.base.CLIError`、说中文的参数解析器与一行错误信息。

命令处在包的最上层：它们导入模型、训练、并行、服务与微调，反过来没有模块导入它们。
"""

from .base import CLIError
from .cli import main

__all__ = ["CLIError", "main"]
